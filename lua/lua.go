// Package lua holds the source article's token bucket script, for those who run it
// themselves (package global's Store.AllowN runs it for you).
//
// The script is bucket.lua in this directory, embedded as BucketSource. Its layout:
//
//   - one hash per bucket (KEYS[1]) with fields tokens (a number, possibly fractional)
//     and ts (milliseconds, Redis TIME);
//   - the clock is Redis TIME, read once per call; the caller's clock is never used;
//   - the stored ts never moves backwards (ts = max(ts, now)), so a Redis clock that
//     steps back (a failover to a replica whose clock lags) cannot refill a period twice;
//   - PEXPIRE ceil(capacity/rate*1000)+1000 ms after every call, so a bucket disappears
//     once it would be full again and memory tracks active clients.
//
// The lease scripts of the hybrid tier keep the same layout, so a bucket may be used by
// both. The tokens left come back as a string (tostring): real Redis formats it with
// %.14g and miniredis with Go's shortest form, so compare parsed numbers, never the
// strings.
package lua

import _ "embed"

// BucketSource is the source article's token bucket script, unchanged in its calling
// convention:
//
//	KEYS[1] bucket key; ARGV[1] capacity, ARGV[2] refill per second, ARGV[3] cost
//	returns {allowed (1 or 0), tostring(tokens left)}
//
// A first call with capacity 100, rate 10, cost 1 answers {1, "99"}. Its one change from
// the article is that the stored timestamp never moves backwards.
//
//go:embed bucket.lua
var BucketSource string
