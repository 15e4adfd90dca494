package redisstore

import (
	"strconv"
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// TestLowRuns: a set's marks and unmarks go in runs of luascript.Low of at most
// wire.MaxLowWrite, the marks first and in order, each run saying how many of its IDs
// are marks; only the last run reads the set (most = wire.MaxLowReply, at most the
// script's own bound), the others read nothing.
func TestLowRuns(t *testing.T) {
	if wire.MaxLowReply > 10_000 {
		t.Fatalf("wire.MaxLowReply %d is above luascript.Low's bound, 10,000", wire.MaxLowReply)
	}
	w := wire.MaxLowWrite
	ids := func(prefix string, n int) []KeyID {
		out := make([]KeyID, n)
		for i := range out {
			out[i] = KeyID(prefix + strconv.Itoa(i))
		}
		return out
	}
	type run struct{ ids, marks int }
	for _, tc := range []struct {
		marks, unmarks int
		want           []run
	}{
		{0, 0, []run{{0, 0}}},
		{1, 0, []run{{1, 1}}},
		{0, 1, []run{{1, 0}}},
		{w, 0, []run{{w, w}}},
		{w + 1, 0, []run{{w, w}, {1, 1}}},
		{0, w + 1, []run{{w, 0}, {1, 0}}},
		{w - 1, 2, []run{{w, w - 1}, {1, 0}}},
		{2*w + 1, w + 5, []run{{w, w}, {w, w}, {w, 1}, {6, 0}}},
	} {
		x := LowSet{Limit: "l", Shards: 1, Mark: ids("m", tc.marks), Unmark: ids("u", tc.unmarks)}
		runs := lowRuns(x, time.Minute)
		if len(runs) != len(tc.want) {
			t.Fatalf("%d marks, %d unmarks: %d runs, want %d", tc.marks, tc.unmarks, len(runs), len(tc.want))
		}
		if got := wire.LowRuns(tc.marks + tc.unmarks); got != len(runs) {
			t.Errorf("%d marks, %d unmarks: wire.LowRuns says %d runs, lowRuns makes %d", tc.marks, tc.unmarks, got, len(runs))
		}
		all := append(append([]KeyID{}, x.Mark...), x.Unmark...)
		sent := 0
		for i, args := range runs {
			most := 0
			if i == len(runs)-1 {
				most = wire.MaxLowReply
			}
			if args[0] != int64(60000) || args[1] != tc.want[i].marks || args[2] != most || len(args)-3 != tc.want[i].ids {
				t.Fatalf("%d marks, %d unmarks, run %d: memory %v, marks %v, most %v, %d IDs; want 60000, %d, %d, %d",
					tc.marks, tc.unmarks, i, args[0], args[1], args[2], len(args)-3, tc.want[i].marks, most, tc.want[i].ids)
			}
			for _, a := range args[3:] {
				if a != string(all[sent]) {
					t.Fatalf("%d marks, %d unmarks, run %d: ID %v, want %s (in order, marks first)", tc.marks, tc.unmarks, i, a, all[sent])
				}
				sent++
			}
		}
		if sent != len(all) {
			t.Fatalf("%d marks, %d unmarks: %d IDs sent", tc.marks, tc.unmarks, sent)
		}
	}
}
