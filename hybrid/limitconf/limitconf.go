// Package limitconf reads a Limiter's limits from a JSON document, a file or an
// environment variable, for hybrid.New's Config.Limits or Limiter.Reconfigure: rates as
// people write them, policies and modes as words, durations as Go writes them ("10ms"),
// and errors that name the line.
//
//	{"limits": [
//	  {"name": "api", "rate": "100/s", "burst": 200, "policy": "local", "max_wait": "10ms",
//	   "tiers": [{"name": "paid", "rate": "1000/s", "burst": 2000}]},
//	  {"name": "signup", "rate": "5/h", "burst": 5, "policy": "closed", "dry_run": true},
//	  {"name": "per-client", "rate": "20/s", "burst": 20, "policy": "open", "mode": "windowed 50ms"}
//	]}
//
// A rate ("rate", "pre_rate") is one of
//
//	"100/s", "100/sec", "100/second"   100 a second (also m, min, minute; h, hour; d, day)
//	"5/10m", "5/1h30m"                 5 per that duration (time.ParseDuration)
//	"10-S", "1000-H", "100-M", "5-D"   ulule/limiter's form
//	"2.5"                              a plain number: per second
//
// and its count and its value per second must be positive and finite.
//
// A field it does not know is an error, so a typo fails at load, not in production.
// What the fields mean, and what New checks of them, is hybrid.Limit's documentation.
package limitconf

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
	"github.com/fleetlimit/fleetlimit/hybrid"
)

// ErrInvalid is wrapped by every error of Parse, Load and LoadEnv.
var ErrInvalid = errors.New("limitconf: invalid configuration")

// document is the JSON form.
type document struct {
	Limits []json.RawMessage `json:"limits"`
}

// limit is one limit's JSON form: hybrid.Limit's fields, in snake case.
type limit struct {
	Name     string `json:"name"`
	Rate     string `json:"rate"`
	Burst    int    `json:"burst"`
	Policy   string `json:"policy"`
	PreRate  string `json:"pre_rate"`
	PreBurst int    `json:"pre_burst"`
	MaxWait  string `json:"max_wait"`
	MaxCost  int    `json:"max_cost"`
	Mode     string `json:"mode"`
	Lease    struct {
		RefillInterval string  `json:"refill_interval"`
		Lifetime       string  `json:"lifetime"`
		LowWatermark   float64 `json:"low_watermark"`
	} `json:"lease"`
	MaxKeys int    `json:"max_keys"`
	Version uint64 `json:"version"`
	Tiers   []struct {
		Name     string `json:"name"`
		Rate     string `json:"rate"`
		Burst    int    `json:"burst"`
		PreRate  string `json:"pre_rate"`
		PreBurst int    `json:"pre_burst"`
	} `json:"tiers"`
	DryRun bool `json:"dry_run"`
}

// parseDuration reads the duration of field as Go writes it ("10ms", "1m30s"); "" is 0.
func parseDuration(field, s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%s %q: a duration as Go writes it, such as \"10ms\" or \"1m30s\"", field, s)
	}
	return d, nil
}

// Load reads the limits from the JSON file at path. ${NAME} and $NAME in it are
// replaced by the environment's values first (an unset variable is an error), so that
// sizes and secrets can come from the deployment.
func Load(path string) ([]hybrid.Limit, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var missing []string
	data = []byte(os.Expand(string(data), func(name string) string {
		v, ok := os.LookupEnv(name)
		if !ok {
			missing = append(missing, name)
		}
		return v
	}))
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s: environment variables not set: %s", ErrInvalid, path, strings.Join(missing, ", "))
	}
	limits, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return limits, nil
}

// LoadEnv reads the limits from the JSON document held by the environment variable name.
func LoadEnv(name string) ([]hybrid.Limit, error) {
	v, ok := os.LookupEnv(name)
	if !ok {
		return nil, fmt.Errorf("%w: environment variable %s not set", ErrInvalid, name)
	}
	limits, err := Parse([]byte(v))
	if err != nil {
		return nil, fmt.Errorf("$%s: %w", name, err)
	}
	return limits, nil
}

// Parse reads the limits from a JSON document (see the package documentation). An
// error wraps ErrInvalid and names the line, and the limit, it is about.
func Parse(data []byte) ([]hybrid.Limit, error) {
	var doc document
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&doc); err != nil {
		return nil, syntaxError(data, err, 0, "")
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: line %d: more after the document", ErrInvalid, lineOf(data, int(dec.InputOffset())))
	}
	if len(doc.Limits) == 0 {
		return nil, fmt.Errorf("%w: no limits (want {\"limits\": [...]})", ErrInvalid)
	}
	out := make([]hybrid.Limit, 0, len(doc.Limits))
	next := 0 // the limits are in data, as written, in order: each is found after the last
	for _, raw := range doc.Limits {
		at := next + bytes.Index(data[next:], raw)
		next = at + len(raw)
		line := lineOf(data, at)
		var l limit
		d := json.NewDecoder(bytes.NewReader(raw))
		d.DisallowUnknownFields()
		if err := d.Decode(&l); err != nil {
			var named struct {
				Name string `json:"name"`
			}
			_ = json.Unmarshal(raw, &named) // the name, if it reads alone
			return nil, syntaxError(data, err, at, named.Name)
		}
		hl, err := l.convert()
		if err != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrInvalid, where(line, l.Name), err)
		}
		out = append(out, hl)
	}
	return out, nil
}

// convert is l as a hybrid.Limit.
func (l *limit) convert() (hybrid.Limit, error) {
	if l.Name == "" {
		return hybrid.Limit{}, errors.New("no name")
	}
	out := hybrid.Limit{Name: l.Name, Burst: l.Burst, PreBurst: l.PreBurst,
		MaxCost: l.MaxCost, MaxKeys: l.MaxKeys, Version: l.Version, DryRun: l.DryRun,
		Lease: hybrid.LeaseTuning{LowWatermark: l.Lease.LowWatermark}}
	var err error
	for _, d := range []struct {
		to    *time.Duration
		field string
		s     string
	}{
		{&out.MaxWait, "max_wait", l.MaxWait},
		{&out.Lease.RefillInterval, "lease.refill_interval", l.Lease.RefillInterval},
		{&out.Lease.Lifetime, "lease.lifetime", l.Lease.Lifetime},
	} {
		if *d.to, err = parseDuration(d.field, d.s); err != nil {
			return out, err
		}
	}
	if out.Rate, err = parseRate(l.Rate); err != nil {
		return out, err
	}
	if l.PreRate != "" {
		if out.PreRate, err = parseRate(l.PreRate); err != nil {
			return out, fmt.Errorf("pre_rate: %w", err)
		}
	}
	if out.Policy, err = parsePolicy(l.Policy); err != nil {
		return out, err
	}
	if out.Mode, err = parseMode(l.Mode); err != nil {
		return out, err
	}
	for _, t := range l.Tiers {
		ht := hybrid.Tier{Name: t.Name, Burst: t.Burst, PreBurst: t.PreBurst}
		if ht.Rate, err = parseRate(t.Rate); err != nil {
			return out, fmt.Errorf("tier %q: %w", t.Name, err)
		}
		if t.PreRate != "" {
			if ht.PreRate, err = parseRate(t.PreRate); err != nil {
				return out, fmt.Errorf("tier %q: pre_rate: %w", t.Name, err)
			}
		}
		out.Tiers = append(out.Tiers, ht)
	}
	return out, nil
}

// parsePolicy reads "open", "closed" or "local" (breaker.FailOpen, FailClosed,
// FailLocal()).
func parsePolicy(s string) (breaker.Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "open":
		return breaker.FailOpen, nil
	case "closed":
		return breaker.FailClosed, nil
	case "local":
		return breaker.FailLocal(), nil
	case "":
		return breaker.Policy{}, errors.New(`no policy: "open", "closed" or "local" (what the limit does while Redis does not answer)`)
	}
	return breaker.Policy{}, fmt.Errorf(`policy %q: want "open", "closed" or "local"`, s)
}

// parseMode reads "" or "exact", "charge-later <duration>" or "windowed <duration>".
func parseMode(s string) (hybrid.Mode, error) {
	kind, arg, _ := strings.Cut(strings.TrimSpace(s), " ")
	kind = strings.ToLower(kind)
	if kind == "" || kind == "exact" {
		if strings.TrimSpace(arg) != "" {
			return hybrid.Mode{}, fmt.Errorf("mode %q: exact takes no duration", s)
		}
		return hybrid.Exact(), nil
	}
	d, err := time.ParseDuration(strings.TrimSpace(arg))
	if err != nil || d <= 0 {
		return hybrid.Mode{}, fmt.Errorf(`mode %q: want "exact", "charge-later <duration>" or "windowed <duration>"`, s)
	}
	switch kind {
	case "charge-later":
		return hybrid.ChargeLater(d), nil
	case "windowed":
		return hybrid.Windowed(d), nil
	}
	return hybrid.Mode{}, fmt.Errorf(`mode %q: want "exact", "charge-later <duration>" or "windowed <duration>"`, s)
}

// parseRate reads a rate as the package doc writes it and returns it per second, with
// plain errors for Parse to wrap once.
func parseRate(s string) (float64, error) {
	s = strings.TrimSpace(s)
	n, per, ok := strings.Cut(s, "/")
	var unit time.Duration
	switch {
	case ok:
		unit = unitOf(per)
		if unit == 0 {
			d, err := time.ParseDuration(per)
			if err != nil || d <= 0 {
				return 0, fmt.Errorf("rate %q: unknown period %q (s, m, h, d, or a duration such as 10m)", s, per)
			}
			unit = d
		}
	case strings.LastIndexByte(s, '-') > 0 && ululeUnit(s[strings.LastIndexByte(s, '-')+1:]) != 0:
		i := strings.LastIndexByte(s, '-')
		n, unit = s[:i], ululeUnit(s[i+1:])
	default:
		n, unit = s, time.Second
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
	if err != nil || v <= 0 || math.IsInf(v, 0) || math.IsNaN(v) {
		if s == "" {
			return 0, errors.New("no rate (\"100/s\", \"1000/h\")")
		}
		return 0, fmt.Errorf("rate %q: the count must be a positive number", s)
	}
	r := v / unit.Seconds()
	if r <= 0 || math.IsInf(r, 0) {
		return 0, fmt.Errorf("rate %q is out of range", s)
	}
	return r, nil
}

// ululeUnit is the period of ulule/limiter's one-letter unit, 0 if u is none.
func ululeUnit(u string) time.Duration {
	switch strings.ToUpper(u) {
	case "S":
		return time.Second
	case "M":
		return time.Minute
	case "H":
		return time.Hour
	case "D":
		return 24 * time.Hour
	}
	return 0
}

// unitOf is the period a rate's unit names, 0 if none.
func unitOf(u string) time.Duration {
	switch strings.ToLower(strings.TrimSpace(u)) {
	case "s", "sec", "second":
		return time.Second
	case "m", "min", "minute":
		return time.Minute
	case "h", "hr", "hour":
		return time.Hour
	case "d", "day":
		return 24 * time.Hour
	}
	return 0
}

// syntaxError is a JSON decoding error as this package reports it: with the line it is
// on, from the offset the error gives (relative to base, where the decoded text starts),
// and the limit it is in ("" if none, or not known).
func syntaxError(data []byte, err error, base int, limit string) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Errorf("%w: %s: %v", ErrInvalid, where(lineOf(data, base+int(se.Offset)), limit), err)
	case errors.As(err, &te):
		return fmt.Errorf("%w: %s: %s: want %s", ErrInvalid, where(lineOf(data, base+int(te.Offset)), limit), te.Field, jsonKind(te.Type))
	}
	if base > 0 {
		return fmt.Errorf("%w: %s: %v", ErrInvalid, where(lineOf(data, base), limit), err)
	}
	return fmt.Errorf("%w: %v", ErrInvalid, err)
}

// where is what an error's message starts with: its line, and its limit if named.
func where(line int, limit string) string {
	if limit == "" {
		return fmt.Sprintf("line %d", line)
	}
	return fmt.Sprintf("line %d: limit %q", line, limit)
}

// jsonKind is what a JSON value must be to decode into t, in JSON's words.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	}
	return t.String()
}

// lineOf is the 1-based line of data's byte at offset.
func lineOf(data []byte, offset int) int {
	offset = min(max(offset, 0), len(data))
	return 1 + bytes.Count(data[:offset], []byte("\n"))
}
