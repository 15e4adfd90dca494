package luamodel

import (
	"fmt"
	"strings"

	"github.com/fleetlimit/fleetlimit/lua"
)

// CallerClockSource is lua.BucketSource as it would read if it trusted the caller's clock,
// the mistake the source article warns about: now comes from ARGV[4] (the calling
// server's milliseconds) instead of Redis TIME, and ts = now as in the article. It is
// derived from lua.BucketSource, so nothing else differs; the simulator's clock-skew
// scenario runs it beside the real script, and Model.BucketCallerClock models it.
var CallerClockSource = callerClock(lua.BucketSource)

func callerClock(src string) string {
	edits := []struct{ old, new string }{
		{"local t   = redis.call('TIME')", "local t   = nil"},
		{"local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)", "local now = tonumber(ARGV[4])"},
		{"math.max(ts, now))", "now)"},
	}
	for _, e := range edits {
		if strings.Count(src, e.old) != 1 {
			panic(fmt.Sprintf("luamodel: lua.BucketSource changed; cannot derive the caller-clock variant (%q)", e.old))
		}
		src = strings.Replace(src, e.old, e.new, 1)
	}
	return src
}
