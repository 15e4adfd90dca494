package httplimit

import (
	"cmp"
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
	//   - "Forwarded" (RFC 7239): the same walk over its for= parameters; an entry that
	//     is not an address ("unknown", an obfuscated "_name") fails with ErrNoKey;
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
	var entry func(string) (netip.Addr, error) // one hop of a list header
	switch name {
	case "X-Forwarded-For":
		entry = parseHop
	case "Forwarded":
		entry = forwardedFor
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
		if entry == nil { // one address, written by the trusted proxy: the last one
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
			return key(a.Unmap())
		}
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
				a, err := entry(strings.TrimSpace(hop))
				if err != nil {
					return "", fmt.Errorf("%w: %s entry %q: %v", ErrNoKey, name, hop, err)
				}
				client = a.Unmap()
				if !isTrusted(client) {
					return key(client)
				}
			}
		}
		return key(client)
	}, nil
}

// forwardedFor parses the for= parameter of one element of a Forwarded field (RFC 7239:
// "for=192.0.2.60;proto=http", "for=\"[2001:db8::17]:4711\""). Quoted values never
// hold a comma in a for= address, so the caller's split on commas is safe; an element
// without for=, or whose for= is not an address, is an error.
func forwardedFor(elem string) (netip.Addr, error) {
	for pair := range strings.SplitSeq(elem, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || !strings.EqualFold(k, "for") {
			continue
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		if strings.HasPrefix(v, "[") && strings.HasSuffix(v, "]") { // an IPv6 address without a port
			v = v[1 : len(v)-1]
		}
		return parseHop(v)
	}
	return netip.Addr{}, fmt.Errorf("no for= parameter")
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
