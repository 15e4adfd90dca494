package httplimit

import (
	"fmt"
	"net"
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

// ClientIP returns a KeyFunc that keys a request by its client's IP address.
//
// Without trusted proxies it is the address of the peer (Request.RemoteAddr): headers
// are ignored, since any client can write them. When the peer is in one of the trusted
// prefixes (your load balancers, your CDN's ranges), the client is the rightmost address
// of X-Forwarded-For that is not trusted: proxies append the address they saw, so
// entries to its left are whatever the client sent and cannot be trusted. If every
// entry is trusted, the leftmost one is used.
//
// An entry may carry a port ("203.0.113.7:4711", "[2001:db8::1]:443"), as some proxies
// write it; the port is dropped. IPv4-mapped IPv6 addresses are keyed as IPv4. An IPv6 client is keyed by its whole
// address; one that rotates addresses within its /64 needs a KeyFunc of your own that
// masks it (netip.Addr.Prefix). An unparsable address fails with ErrNoKey.
func ClientIP(trusted ...netip.Prefix) KeyFunc {
	trusted = append([]netip.Prefix(nil), trusted...)
	isTrusted := func(a netip.Addr) bool {
		for _, p := range trusted {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	return func(r *http.Request) (string, error) {
		peer, err := parseRemoteAddr(r.RemoteAddr)
		if err != nil {
			return "", err
		}
		if len(trusted) == 0 || !isTrusted(peer) {
			return peer.String(), nil
		}
		client := peer
		hops := r.Header["X-Forwarded-For"]
		for i := len(hops) - 1; i >= 0; i-- {
			line := hops[i]
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
				client = a.Unmap()
				if !isTrusted(client) {
					return client.String(), nil
				}
			}
		}
		return client.String(), nil
	}
}

// parseHop parses an X-Forwarded-For entry: an IP, or an IP with a port ("ip:port",
// "[ipv6]:port"), which some proxies write.
func parseHop(s string) (netip.Addr, error) {
	a, err := netip.ParseAddr(s)
	if err == nil {
		return a, nil
	}
	if ap, perr := netip.ParseAddrPort(s); perr == nil {
		return ap.Addr(), nil
	}
	return netip.Addr{}, err
}

// parseRemoteAddr parses RemoteAddr, "ip:port" or a bare IP.
func parseRemoteAddr(s string) (netip.Addr, error) {
	host := s
	if h, _, err := net.SplitHostPort(s); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%w: remote address %q: %v", ErrNoKey, s, err)
	}
	return a.Unmap(), nil
}
