package httplimit

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strings"
)

// Header returns a KeyFunc that keys a request by the value of header name (an API key,
// a tenant id). A request without it, or with an empty one, fails with ErrNoKey.
func Header(name string) KeyFunc {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header[name]; len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", fmt.Errorf("%w: header %s missing", ErrNoKey, name)
	}
}

// KeyByEndpoint returns a KeyFunc that keys a request by k's key and the route it
// asks for, so that each endpoint of a client has a bucket of its own under one limit:
// "<k's key> <route>". The route is the pattern the request matched on an
// http.ServeMux (Request.Pattern, "GET /items/{id}": one bucket for every item) when
// the Middleware runs inside the mux, as a handler's wrapper; else the method and the
// path ("GET /items/42"), which gives every distinct path a bucket of its own: wrap
// per route, or key by a route name of your own, where paths carry ids. A subtree
// pattern ("/api/", a mux mounted under another) is one route: every path under it
// shares its bucket, so wrap the handlers of the inner mux's routes instead.
func KeyByEndpoint(k KeyFunc) KeyFunc {
	return func(r *http.Request) (string, error) {
		key, err := keyOf(k, r)
		if err != nil {
			return "", err
		}
		if r.Pattern != "" {
			return key + " " + r.Pattern, nil
		}
		return key + " " + r.Method + " " + r.URL.Path, nil
	}
}

// IPOptions says where ClientIP reads the client's address.
type IPOptions struct {
	// Trusted are the prefixes of your proxies (load balancers, a CDN's ranges): only a
	// peer in one of them is believed about the client. None: the peer is the client.
	Trusted []netip.Prefix
	// Header is where a trusted peer names the client:
	//   - "X-Forwarded-For" (the default): a list each proxy appends to; the client is
	//     the rightmost entry not trusted;
	//   - "Forwarded" (RFC 7239): the same walk over its elements' for= parameters, each
	//     line parsed whole (quoted values, as a host= holding commas, are read as
	//     values); an element the walk reaches that is not an address ("unknown", an
	//     obfuscated "_name"), and a line that does not parse, fail with ErrNoKey;
	//   - any other name ("X-Real-IP", "CF-Connecting-IP", "True-Client-IP",
	//     "Fly-Client-IP"): one address, set by the trusted proxy in front; without it the
	//     peer is the client. If the request carries it more than once (a proxy that
	//     adds its line to the client's instead of replacing it), or as a list, the last
	//     address is the proxy's and is the one read.
	Header string
	// IPv6Prefix keys an IPv6 client by its prefix of that many bits, from 1 to 128. 0
	// is 64: a /64 is what an ISP hands to one customer, whose client can rotate through
	// its addresses, so keying the whole address (128) lets one client be many.
	IPv6Prefix int
}

// ClientIP returns a KeyFunc that keys a request by its client's IP address, read as o
// says, or an error wrapping ErrInvalidConfig for an IPv6Prefix out of range or a Header
// that is not a valid header name. Keys are IPv4 addresses ("198.51.100.9") and IPv6
// prefixes ("2001:db8:1:2::/64"; whole addresses with IPv6Prefix 128).
//
// Without trusted proxies the client is the peer (Request.RemoteAddr): headers are
// ignored, since any client can write them. When the peer is in one of the trusted
// prefixes (your load balancers, your CDN's ranges), the client is the rightmost address
// of X-Forwarded-For that is not trusted: proxies append the address they saw, so
// entries to its left are whatever the client sent and cannot be trusted. If every
// entry is trusted, the leftmost one is used.
//
// An entry may carry a port ("203.0.113.7:4711", "[2001:db8::1]:443"), as some proxies
// write it; the port is dropped. IPv4-mapped IPv6 addresses are keyed as IPv4, and a
// trusted prefix written in that form ("::ffff:10.0.0.0/104") is read as IPv4 too. An
// unparsable address fails with ErrNoKey.
func ClientIP(o IPOptions) (KeyFunc, error) {
	if o.IPv6Prefix < 0 || o.IPv6Prefix > 128 {
		return nil, fmt.Errorf("%w: IPv6Prefix %d, want 0 to 128", ErrInvalidConfig, o.IPv6Prefix)
	}
	name := http.CanonicalHeaderKey(cmp.Or(o.Header, "X-Forwarded-For"))
	if strings.ContainsAny(name, " \t\r\n:") {
		return nil, fmt.Errorf("%w: Header %q is not a header name", ErrInvalidConfig, o.Header)
	}
	prefixBits := cmp.Or(o.IPv6Prefix, 64)
	// A peer or hop that is an IPv4-mapped IPv6 address is read as IPv4 (Unmap), so a
	// trusted prefix written in that form is made IPv4 too, or it would match nothing.
	trusted := make([]netip.Prefix, 0, len(o.Trusted))
	for _, p := range o.Trusted {
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		trusted = append(trusted, p)
	}
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	key := func(a netip.Addr) (string, error) {
		if prefixBits == 128 || !a.Is6() {
			return a.String(), nil
		}
		p, err := a.Prefix(prefixBits)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrNoKey, err)
		}
		return p.String(), nil
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseRemoteAddr(r.RemoteAddr)
		if err != nil {
			return "", err
		}
		if len(trusted) == 0 || !isTrusted(peer) {
			return key(peer)
		}
		lines := r.Header[name]
		switch name {
		case "X-Forwarded-For":
			return walkXFF(lines, peer, isTrusted, key)
		case "Forwarded":
			return walkForwarded(lines, peer, isTrusted, key)
		}
		// One address, written by the trusted proxy: the last one.
		if len(lines) == 0 || strings.TrimSpace(lines[len(lines)-1]) == "" {
			return key(peer)
		}
		last := lines[len(lines)-1]
		if j := strings.LastIndexByte(last, ','); j >= 0 {
			last = last[j+1:]
		}
		last = strings.TrimSpace(last)
		a, err := parseHop(last)
		if err != nil {
			return "", fmt.Errorf("%w: %s %q: %v", ErrNoKey, name, last, err)
		}
		return key(a)
	}, nil
}

// walkXFF finds the client in X-Forwarded-For's lines: the rightmost hop that is not
// trusted, the lines read from the last, each from its end, so that what the client
// wrote to the left of the trusted proxies' hops is never parsed; the leftmost hop if
// every one is trusted, and the peer if there is none.
func walkXFF(lines []string, peer netip.Addr, isTrusted func(netip.Addr) bool, key func(netip.Addr) (string, error)) (string, error) {
	client := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for line != "" {
			var hop string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				line, hop = line[:j], line[j+1:]
			} else {
				line, hop = "", line
			}
			a, err := parseHop(strings.TrimSpace(hop))
			if err != nil {
				return "", fmt.Errorf("%w: X-Forwarded-For entry %q: %v", ErrNoKey, hop, err)
			}
			if client = a; !isTrusted(client) {
				return key(client)
			}
		}
	}
	return key(client)
}

// walkForwarded is walkXFF for Forwarded (RFC 7239): the same walk over its elements'
// for= addresses. An element's other parameters may be quoted strings holding commas,
// semicolons and "for=" (host= carries the request's Host, which the client chooses),
// so a line is parsed whole, from its start, before its elements are walked from its
// end: a split on commas would let a client's Host name the address. A line that is not
// a list of elements of pairs fails with ErrNoKey, as does an element the walk reaches
// whose for= is missing, given twice, or not an address ("unknown", an obfuscated
// "_name").
func walkForwarded(lines []string, peer netip.Addr, isTrusted func(netip.Addr) bool, key func(netip.Addr) (string, error)) (string, error) {
	client := peer
	var buf [8]forwardedElem
	for i := len(lines) - 1; i >= 0; i-- {
		elems, err := parseForwarded(buf[:0], lines[i])
		if err != nil {
			return "", fmt.Errorf("%w: Forwarded %q: %v", ErrNoKey, lines[i], err)
		}
		for j := len(elems) - 1; j >= 0; j-- {
			a, err := elems[j].addr()
			if err != nil {
				return "", fmt.Errorf("%w: Forwarded element %d of %q: %v", ErrNoKey, j+1, lines[i], err)
			}
			if client = a; !isTrusted(client) {
				return key(client)
			}
		}
	}
	return key(client)
}

// forwardedElem is what the walk reads of one element of a Forwarded line: its for=
// value, unquoted, and how many for= it has.
type forwardedElem struct {
	node string
	fors int
}

// addr is the address the element's for= names (RFC 7239 §6: "192.0.2.60",
// "[2001:db8::17]", either with a port).
func (e forwardedElem) addr() (netip.Addr, error) {
	switch e.fors {
	case 0:
		return netip.Addr{}, errors.New("no for= parameter")
	case 1:
	default:
		return netip.Addr{}, errors.New("for= given twice")
	}
	v := e.node
	if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") { // an IPv6 address without a port
		v = v[1 : len(v)-1]
	}
	return parseHop(v)
}

// parseForwarded appends the elements of line, a Forwarded field value, to dst in
// order: elements separated by commas, each of pairs token=value separated by
// semicolons, a value a token or a quoted string (with backslash escapes), optional
// whitespace around the separators. Empty elements are skipped (RFC 9110 §5.6.1). An
// unquoted value may also hold ':', '[' and ']', as some proxies write an address with a
// port unquoted; none of them separates anything.
func parseForwarded(dst []forwardedElem, line string) ([]forwardedElem, error) {
	var (
		cur   forwardedElem
		pairs int
	)
	for i := 0; ; {
		i = skipOWS(line, i)
		if i < len(line) && line[i] != ',' && line[i] != ';' {
			j := i
			for j < len(line) && isTChar(line[j]) {
				j++
			}
			if j == i || j == len(line) || line[j] != '=' {
				return nil, fmt.Errorf("a pair at byte %d is not token=value", i)
			}
			name := line[i:j]
			var (
				val string
				err error
			)
			if j++; j < len(line) && line[j] == '"' {
				if val, j, err = unquote(line, j); err != nil {
					return nil, err
				}
			} else {
				k := j
				for k < len(line) && (isTChar(line[k]) || line[k] == ':' || line[k] == '[' || line[k] == ']') {
					k++
				}
				val, j = line[j:k], k
			}
			if strings.EqualFold(name, "for") {
				cur.node = val
				cur.fors++
			}
			pairs++
			i = skipOWS(line, j)
		}
		if i == len(line) || line[i] == ',' {
			if pairs > 0 {
				dst = append(dst, cur)
			}
			if i == len(line) {
				return dst, nil
			}
			cur, pairs = forwardedElem{}, 0
		} else if line[i] != ';' {
			return nil, fmt.Errorf("unexpected %q at byte %d", line[i], i)
		}
		i++
	}
}

// unquote reads the quoted string that starts at s[i] (a '"'), and returns its value,
// its escapes undone, and the index past its closing quote.
func unquote(s string, i int) (string, int, error) {
	start := i + 1
	var b []byte // only for a string with escapes
	for j := start; j < len(s); j++ {
		switch c := s[j]; c {
		case '"':
			if b == nil {
				return s[start:j], j + 1, nil
			}
			return string(b), j + 1, nil
		case '\\':
			if j+1 == len(s) {
				return "", 0, errors.New("a quoted string ends in a backslash")
			}
			if b == nil {
				b = append([]byte(nil), s[start:j]...)
			}
			j++
			b = append(b, s[j])
		default:
			if b != nil {
				b = append(b, c)
			}
		}
	}
	return "", 0, fmt.Errorf("a quoted string from byte %d is not closed", i)
}

// skipOWS returns the index of the first byte of s from i that is not a space or a tab.
func skipOWS(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t') {
		i++
	}
	return i
}

// isTChar reports whether c may appear in an HTTP token (RFC 9110 §5.6.2).
func isTChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// parseHop parses a hop of a forwarding header: an IP, or an IP with a port ("ip:port",
// "[ipv6]:port"), which some proxies write, as a hop is compared and keyed: IPv4-mapped
// IPv6 as IPv4, and without an IPv6 zone ("fe80::1%eth0"), which names the proxy's
// interface, not the client, and puts the address in no prefix.
func parseHop(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err != nil {
		ap, perr := netip.ParseAddrPort(s)
		if perr != nil {
			return netip.Addr{}, err
		}
		a = ap.Addr()
	}
	return a.Unmap().WithZone(""), nil
}

// parseRemoteAddr parses RemoteAddr, "ip:port" or a bare IP, as a hop (parseHop).
func parseRemoteAddr(s string) (netip.Addr, error) {
	a, err := parseHop(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q: %v", ErrNoKey, s, err)
	}
	return a, nil
}
