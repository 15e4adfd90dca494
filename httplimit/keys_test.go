package httplimit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
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
		{"ipv6 peer", nil, "[2001:db8::1]:443", nil, "2001:db8::1"},
		{"ipv6 cdn", []netip.Prefix{cdn}, "[2001:db8:cd::5]:443", []string{"2001:db8:1::abcd"}, "2001:db8:1::abcd"},
		{"mapped ipv4", nil, "[::ffff:192.0.2.1]:80", nil, "192.0.2.1"},
		{"garbage entry", []netip.Prefix{lb}, "10.1.2.3:80", []string{"not-an-ip"}, ""},
		{"entry with a port", []netip.Prefix{lb}, "10.1.2.3:80", []string{"203.0.113.7:4711"}, "203.0.113.7"},
		{"ipv6 entry with a port", []netip.Prefix{lb}, "10.1.2.3:80", []string{"[2001:db8::1]:443"}, "2001:db8::1"},
		{"garbage remote", nil, "pipe", nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.RemoteAddr = tc.remote
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got, err := httplimit.ClientIP(tc.trusted...)(r)
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
// address (never a fragment of the header) or ErrNoKey, and a peer outside the trusted
// prefixes is always keyed by its own address.
func FuzzClientIP(f *testing.F) {
	f.Add("10.1.2.3:80", "198.51.100.9, 10.0.0.2")
	f.Add("203.0.113.7:1", "1.2.3.4")
	f.Add("10.0.0.1:1", ",,, ,")
	f.Add("[::1]:1", "::ffff:1.2.3.4,[::1]")
	trusted := netip.MustParsePrefix("10.0.0.0/8")
	key := httplimit.ClientIP(trusted)
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
