package httplimit_test

import (
	"fmt"
	"strconv"
	"strings"
)

// sfItem is one member of a structured-field list (RFC 9651) whose item is a string
// and whose parameters are integers: the shape of RateLimit and RateLimit-Policy.
type sfItem struct {
	Name   string
	Params map[string]int64
}

// parseSFList parses a structured-field list of string items with integer parameters,
// strictly: what a conforming client would accept, or an error.
func parseSFList(s string) ([]sfItem, error) {
	var out []sfItem
	p := sfParser{s: s}
	p.skipSP()
	for {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skipOWS()
		if p.done() {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, fmt.Errorf("at %d: want ',' in %q", p.i, s)
		}
		p.i++
		p.skipOWS()
		if p.done() {
			return nil, fmt.Errorf("trailing comma in %q", s)
		}
	}
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skipSP() {
	for !p.done() && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.done() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *sfParser) item() (sfItem, error) {
	name, err := p.str()
	if err != nil {
		return sfItem{}, err
	}
	it := sfItem{Name: name, Params: map[string]int64{}}
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		p.skipSP()
		k := p.key()
		if k == "" {
			return sfItem{}, fmt.Errorf("at %d: empty parameter key in %q", p.i, p.s)
		}
		if p.done() || p.s[p.i] != '=' {
			return sfItem{}, fmt.Errorf("parameter %s without a value in %q", k, p.s)
		}
		p.i++
		v, err := p.integer()
		if err != nil {
			return sfItem{}, err
		}
		if _, dup := it.Params[k]; dup {
			return sfItem{}, fmt.Errorf("parameter %s twice in %q", k, p.s)
		}
		it.Params[k] = v
	}
	return it, nil
}

func (p *sfParser) str() (string, error) {
	if p.done() || p.s[p.i] != '"' {
		return "", fmt.Errorf("at %d: want a string in %q", p.i, p.s)
	}
	p.i++
	var b strings.Builder
	for !p.done() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.done() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return "", fmt.Errorf("bad escape in %q", p.s)
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return "", fmt.Errorf("byte %#x in a string in %q", c, p.s)
		default:
			b.WriteByte(c)
		}
	}
	return "", fmt.Errorf("unterminated string in %q", p.s)
}

func (p *sfParser) key() string {
	start := p.i
	for !p.done() {
		c := p.s[p.i]
		if (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9' && p.i > start) || ((c == '_' || c == '-' || c == '.' || c == '*') && p.i > start) {
			p.i++
			continue
		}
		break
	}
	return p.s[start:p.i]
}

// integer parses an sf-integer: at most 15 digits, optional minus.
func (p *sfParser) integer() (int64, error) {
	start := p.i
	if !p.done() && p.s[p.i] == '-' {
		p.i++
	}
	digits := p.i
	for !p.done() && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
		p.i++
	}
	if p.i == digits || p.i-digits > 15 {
		return 0, fmt.Errorf("not an sf-integer at %d in %q", start, p.s)
	}
	return strconv.ParseInt(p.s[start:p.i], 10, 64)
}
