package httplimit_test

import (
	"cmp"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/fleetlimit/fleetlimit/httplimit"
)

func TestClientIP(t *testing.T) {
	lb := netip.MustParsePrefix("10.0.0.0/8")
	cdn := netip.MustParsePrefix("2001:db8:cd::/48")
	for _, tc := range []struct {
		name    string
		trusted []netip.Prefix
		remote  string
		xff     []string
		want    string // "" means ErrNoKey
	}{
		{"peer", nil, "203.0.113.7:5555", nil, "203.0.113.7"},
		{"headers ignored without trusted proxies", nil, "203.0.113.7:5555", []string{"1.2.3.4"}, "203.0.113.7"},
		{"untrusted peer's header ignored", []netip.Prefix{lb}, "203.0.113.7:5555", []string{"1.2.3.4"}, "203.0.113.7"},
		{"behind the load balancer", []netip.Prefix{lb}, "10.1.2.3:80", []string{"198.51.100.9"}, "198.51.100.9"},
		{"spoofed left entries skipped", []netip.Prefix{lb}, "10.1.2.3:80", []string{"6.6.6.6, 198.51.100.9"}, "198.51.100.9"},
		{"trusted hops skipped", []netip.Prefix{lb}, "10.1.2.3:80", []string{"198.51.100.9, 10.9.9.9 , 10.8.8.8"}, "198.51.100.9"},
		{"several header lines", []netip.Prefix{lb}, "10.1.2.3:80", []string{"6.6.6.6", "198.51.100.9, 10.0.0.2"}, "198.51.100.9"},
		{"all trusted", []netip.Prefix{lb}, "10.1.2.3:80", []string{"10.0.0.9, 10.0.0.8"}, "10.0.0.9"},
		{"no header", []netip.Prefix{lb}, "10.1.2.3:80", nil, "10.1.2.3"},
		{"ipv6 peer: its /64", nil, "[2001:db8::1]:443", nil, "2001:db8::/64"},
		{"ipv6 cdn", []netip.Prefix{cdn}, "[2001:db8:cd::5]:443", []string{"2001:db8:1::abcd"}, "2001:db8:1::/64"},
		{"mapped ipv4", nil, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"garbage entry", []netip.Prefix{lb}, "10.1.2.3:80", []string{"not-an-ip"}, ""},
		{"entry with a port", []netip.Prefix{lb}, "10.1.2.3:80", []string{"203.0.113.7:4711"}, "203.0.113.7"},
		{"ipv6 entry with a port", []netip.Prefix{lb}, "10.1.2.3:80", []string{"[2001:db8::1]:443"}, "2001:db8::/64"},
		{"trusted prefix written IPv4-mapped", []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}, "[::ffff:10.1.2.3]:80", []string{"198.51.100.9"}, "198.51.100.9"},
		{"every IPv4 address trusted, written IPv4-mapped", []netip.Prefix{netip.MustParsePrefix("::ffff:0.0.0.0/96")}, "10.1.2.3:80", []string{"198.51.100.9"}, "198.51.100.9"},
		{"garbage remote", nil, "pipe", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			key, err := httplimit.ClientIP(httplimit.IPOptions{Trusted: tc.trusted})
			if err != nil {
				t.Fatal(err)
			}
			got, err := key(r)
			if tc.want == "" {
				if !errors.Is(err, httplimit.ErrNoKey) {
					t.Fatalf("ClientIP = %q, %v; want ErrNoKey", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ClientIP = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestHeader(t *testing.T) {
	key := httplimit.Header("x-api-key")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	if _, err := key(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Fatalf("missing header: %v", err)
	}
	r.Header.Set("X-Api-Key", "")
	if _, err := key(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Fatalf("empty header: %v", err)
	}
	r.Header.Set("X-API-Key", "k1")
	if got, err := key(r); got != "k1" || err != nil {
		t.Fatalf("Header = %q, %v", got, err)
	}
}

// FuzzClientIP: whatever a client writes into X-Forwarded-For, the key is a valid IP
// address (never a fragment of the header; IPv6Prefix 128 keys whole addresses) or
// ErrNoKey, and a peer outside the trusted prefixes is always keyed by its own address.
func FuzzClientIP(f *testing.F) {
	f.Add("10.1.2.3:80", "198.51.100.9, 10.0.0.2")
	f.Add("203.0.113.7:1", "1.2.3.4")
	f.Add("10.0.0.1:1", ",,, ,")
	f.Add("[::1]:1", "::ffff:1.2.3.4,[::1]")
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	key, err := httplimit.ClientIP(httplimit.IPOptions{Trusted: []netip.Prefix{trusted}, IPv6Prefix: 128})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, remote, xff string) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = remote
		r.Header.Set("X-Forwarded-For", xff)
		got, err := key(r)
		if err != nil {
			if !errors.Is(err, httplimit.ErrNoKey) {
				t.Fatalf("error %v does not wrap ErrNoKey", err)
			}
			return
		}
		a, perr := netip.ParseAddr(got)
		if perr != nil {
			t.Fatalf("key %q is not an address", got)
		}
		peer, perr := netip.ParseAddr(remote)
		if perr != nil {
			if ap, err := netip.ParseAddrPort(remote); err == nil {
				peer = ap.Addr()
			}
		}
		if peer.IsValid() && !trusted.Contains(peer.Unmap()) && a != peer.Unmap() {
			t.Fatalf("untrusted peer %s keyed as %s", peer, a)
		}
	})
}

func TestClientIPHeaders(t *testing.T) {
	lb := netip.MustParsePrefix("10.0.0.0/8")
	for _, tc := range []struct {
		name   string
		o      httplimit.IPOptions
		remote string
		header map[string][]string
		want   string // "" means ErrNoKey
	}{
		{"Forwarded", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=6.6.6.6, for=198.51.100.9;proto=https;by=10.0.0.1`}}, "198.51.100.9"},
		{"Forwarded, quoted IPv6 with a port", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "forwarded", IPv6Prefix: 128}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`For="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		{"Forwarded, bracketed IPv6", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded", IPv6Prefix: 128}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for="[2001:db8::1]"`}}, "2001:db8::1"},
		{"Forwarded, trusted hops skipped", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=198.51.100.9`, `for=10.9.9.9;proto=http`}}, "198.51.100.9"},
		{"Forwarded, unknown", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=unknown`}}, ""},
		{"Forwarded, obfuscated", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=_hidden`}}, ""},
		{"Forwarded, no for", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`proto=https`}}, ""},
		{"Forwarded from an untrusted peer", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "203.0.113.7:80",
			map[string][]string{"Forwarded": {`for=1.2.3.4`}}, "203.0.113.7"},
		// host= is the request's Host, which the client chooses (a reg-name may hold
		// ',', ';' and '='), quoted by the proxy: a value, never elements or pairs.
		{"Forwarded, a Host holding an element", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=203.0.113.9;host="a,for=6.6.6.6;x="`}}, "203.0.113.9"},
		{"Forwarded, a Host holding a pair, before for=", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`host="a;for=6.6.6.7;x=";for=203.0.113.9`}}, "203.0.113.9"},
		{"Forwarded, an escaped quote in a Host", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=203.0.113.9;host="a\",for=6.6.6.6"`}}, "203.0.113.9"},
		{"Forwarded, a quoted by= with a comma", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=198.51.100.9;by="a,b"`}}, "198.51.100.9"},
		{"Forwarded, the client's element before the proxy's", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=6.6.6.6;host="x,for=10.0.0.9", for=198.51.100.9`}}, "198.51.100.9"},
		{"Forwarded, empty elements", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {` , for=198.51.100.9 ,, `}}, "198.51.100.9"},
		{"Forwarded, an unquoted address with a port", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=198.51.100.9:4711`}}, "198.51.100.9"},
		{"Forwarded, for= twice in an element", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=198.51.100.9;for=6.6.6.6`}}, ""},
		{"Forwarded, a quote not closed", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=198.51.100.9;host="a, for=6.6.6.6`}}, ""},
		{"Forwarded, a line ending in a quoted backslash", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for="\`}}, ""},
		{"Forwarded, an unquoted bracketed IPv6 with a port", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded", IPv6Prefix: 128}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=[2001:db8::1]:443`}}, "2001:db8::1"},
		{"Forwarded, every hop trusted: the leftmost", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=10.0.0.9, for=10.0.0.8`}}, "10.0.0.9"},
		{"Forwarded, a pair without a name", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for=198.51.100.9;=x`}}, ""},
		{"Forwarded, not pairs", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`198.51.100.9`}}, ""},
		{"Forwarded, a client's line that does not parse, left of the proxy's", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "Forwarded"}, "10.1.2.3:80",
			map[string][]string{"Forwarded": {`for="`, `for=198.51.100.9`}}, "198.51.100.9"},
		// A zone names an interface of the host that saw the address, not the client: one
		// address is one key, and a zoned trusted peer is trusted.
		{"X-Forwarded-For, an IPv6 zone", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, IPv6Prefix: 128}, "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"2001:db8::1%a"}}, "2001:db8::1"},
		{"a zoned link-local proxy", httplimit.IPOptions{Trusted: []netip.Prefix{netip.MustParsePrefix("fe80::/10")}}, "[fe80::1%eth0]:80",
			map[string][]string{"X-Forwarded-For": {"198.51.100.9"}}, "198.51.100.9"},
		{"X-Real-IP", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"198.51.100.9"}}, "198.51.100.9"},
		{"CF-Connecting-IP", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "CF-Connecting-IP"}, "10.1.2.3:80",
			map[string][]string{"Cf-Connecting-Ip": {"2001:db8::9"}, "X-Forwarded-For": {"6.6.6.6"}}, "2001:db8::/64"},
		{"X-Real-IP added to the client's: the proxy's, last", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"6.6.6.6", "198.51.100.9"}}, "198.51.100.9"},
		{"X-Real-IP merged into a list: the last", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"6.6.6.6, 198.51.100.9"}}, "198.51.100.9"},
		{"X-Real-IP merged into a list of three: the last", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"6.6.6.6, 7.7.7.7, 198.51.100.9"}}, "198.51.100.9"},
		{"X-Real-IP list ending empty", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"198.51.100.9,"}}, ""},
		{"CF-Connecting-IP missing: the peer", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "CF-Connecting-IP"}, "10.1.2.3:80",
			nil, "10.1.2.3"},
		{"X-Real-IP empty: the peer", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"6.6.6.6", " "}}, "10.1.2.3"},
		{"X-Real-IP garbage", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "10.1.2.3:80",
			map[string][]string{"X-Real-Ip": {"a, b"}}, ""},
		{"X-Real-IP from an untrusted peer", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, Header: "X-Real-IP"}, "203.0.113.7:80",
			map[string][]string{"X-Real-Ip": {"1.2.3.4"}}, "203.0.113.7"},
		{"IPv6 /64", httplimit.IPOptions{IPv6Prefix: 64}, "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 /64 by default", httplimit.IPOptions{}, "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 whole address", httplimit.IPOptions{IPv6Prefix: 128}, "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2:aaaa::1"},
		{"IPv6 /64, another address of it", httplimit.IPOptions{IPv6Prefix: 64}, "[2001:db8:1:2:bbbb::7]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 prefix leaves IPv4 alone", httplimit.IPOptions{IPv6Prefix: 64}, "192.0.2.1:80", nil, "192.0.2.1"},
		{"IPv6 /56 behind a proxy", httplimit.IPOptions{Trusted: []netip.Prefix{lb}, IPv6Prefix: 56}, "10.1.2.3:80",
			map[string][]string{"X-Forwarded-For": {"2001:db8:1:2ff::1"}}, "2001:db8:1:200::/56"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := httplimit.ClientIP(tc.o)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for h, vs := range tc.header {
				for _, v := range vs {
					r.Header.Add(h, v)
				}
			}
			got, err := k(r)
			if tc.want == "" {
				if !errors.Is(err, httplimit.ErrNoKey) {
					t.Fatalf("key = %q, %v; want ErrNoKey", got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("key = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	for _, o := range []httplimit.IPOptions{{IPv6Prefix: -1}, {IPv6Prefix: 129}, {Header: "X Real IP"}, {Header: "a:b"}} {
		if _, err := httplimit.ClientIP(o); !errors.Is(err, httplimit.ErrInvalidConfig) {
			t.Errorf("ClientIP(%+v) = %v, want ErrInvalidConfig", o, err)
		}
	}
}

// FuzzClientIPHeaders: whatever a client or a proxy writes in X-Forwarded-For or
// Forwarded, the key is an address or a prefix, or the error is ErrNoKey; nothing
// panics.
func FuzzClientIPHeaders(f *testing.F) {
	for _, s := range []string{"198.51.100.9", "6.6.6.6, 10.0.0.1", `for="[2001:db8::1]:1"`, "for=unknown", `for=";,"`, "[::1]:x", "",
		`for="\`, `for=1.2.3.4;host="a\`} {
		f.Add(s, true, uint8(0))
		f.Add(s, false, uint8(64))
	}
	lb := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	f.Fuzz(func(t *testing.T, v string, forwarded bool, bits uint8) {
		o := httplimit.IPOptions{Trusted: lb, IPv6Prefix: int(bits % 129)}
		if forwarded {
			o.Header = "Forwarded"
		}
		k, err := httplimit.ClientIP(o)
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "10.1.2.3:80"
		r.Header.Set(cmp.Or(o.Header, "X-Forwarded-For"), v)
		got, err := k(r)
		if err != nil {
			if !errors.Is(err, httplimit.ErrNoKey) {
				t.Fatalf("%q: error %v does not wrap ErrNoKey", v, err)
			}
			return
		}
		if _, aerr := netip.ParseAddr(got); aerr != nil {
			if _, perr := netip.ParsePrefix(got); perr != nil {
				t.Fatalf("%q: key %q is neither an address nor a prefix", v, got)
			}
		}
	})
}

// FuzzForwardedHost: a trusted proxy that writes its element for=<client>;host=<the
// request's Host, quoted and escaped> keys the request by that client, whatever the
// client chose for its Host and whatever Forwarded it sent itself: on a line of its own,
// the proxy's element is read alone; on the proxy's line, before its element, it can
// make the line fail to parse (ErrNoKey, which refuses the client's own request) but
// never name another address.
func FuzzForwardedHost(f *testing.F) {
	for _, s := range [][2]string{{"a,for=6.6.6.6;x=", ""}, {`a;for=6.6.6.7;x=`, `for=1.1.1.1;a="`}, {`\", for=6.6.6.6`, `for="`}, {"", ""}} {
		f.Add(s[0], s[1], false)
		f.Add(s[0], s[1], true)
	}
	k, err := httplimit.ClientIP(httplimit.IPOptions{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, Header: "Forwarded"})
	if err != nil {
		f.Fatal(err)
	}
	escape := strings.NewReplacer(`\`, `\\`, `"`, `\"`)
	f.Fuzz(func(t *testing.T, host, client string, sameLine bool) {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		r.RemoteAddr = "10.1.2.3:80"
		elem := `for=203.0.113.9;host="` + escape.Replace(host) + `"`
		if sameLine {
			r.Header["Forwarded"] = []string{client + ", " + elem}
		} else {
			r.Header["Forwarded"] = []string{client, elem}
		}
		got, err := k(r)
		if sameLine && errors.Is(err, httplimit.ErrNoKey) {
			return
		}
		if err != nil || got != "203.0.113.9" {
			t.Fatalf("Forwarded %q: key %q, %v; want 203.0.113.9", r.Header["Forwarded"], got, err)
		}
	})
}

func TestKeyByEndpoint(t *testing.T) {
	k := httplimit.KeyByEndpoint(httplimit.Header("X-API-Key"))
	r := httptest.NewRequest(http.MethodPost, "/v1/items/42?x=1", nil)
	r.Header.Set("X-API-Key", "key-1")
	if got, err := k(r); err != nil || got != "key-1 POST /v1/items/42" {
		t.Errorf("outside a mux: %q, %v; want the method and path", got, err)
	}
	r.Pattern = "POST /v1/items/{id}"
	if got, err := k(r); err != nil || got != "key-1 POST /v1/items/{id}" {
		t.Errorf("inside a mux: %q, %v; want the pattern", got, err)
	}
	r.Header.Del("X-API-Key")
	if _, err := k(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf("no key: %v, want ErrNoKey", err)
	}
	empty := httplimit.KeyByEndpoint(func(*http.Request) (string, error) { return "", nil })
	if got, err := empty(r); !errors.Is(err, httplimit.ErrNoKey) {
		t.Errorf("an empty key: %q, %v; want ErrNoKey, not one bucket per route for every keyless request", got, err)
	}
}
