package redisstore_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// TestOptionBounds: Prefix takes up to 32 bytes of printable ASCII, '~' (the last) and
// '!' (the first after the space) included, and ServerID up to MaxNameLen bytes; one
// byte more, or a byte outside that range, is an invalid configuration.
func TestOptionBounds(t *testing.T) {
	_, c := redistest.Mini(t)
	for _, tc := range []struct {
		name string
		opt  redisstore.Option
		ok   bool
	}{
		{"prefix of 32 bytes", redisstore.Prefix(strings.Repeat("p", 32)), true},
		{"prefix of 33 bytes", redisstore.Prefix(strings.Repeat("p", 33)), false},
		{"prefix with '~'", redisstore.Prefix("a~b:"), true},
		{"prefix with '!'", redisstore.Prefix("a!b:"), true},
		{"prefix with DEL", redisstore.Prefix("a\x7fb:"), false},
		{"prefix with a control byte", redisstore.Prefix("a\x1fb:"), false},
		{"prefix with a byte past ASCII", redisstore.Prefix("a\xc3\xa9:"), false},
		{"empty prefix", redisstore.Prefix(""), true},
		{"server id of MaxNameLen bytes", redisstore.ServerID(strings.Repeat("i", redisstore.MaxNameLen)), true},
		{"server id of MaxNameLen+1 bytes", redisstore.ServerID(strings.Repeat("i", redisstore.MaxNameLen+1)), false},
		{"server id of one byte", redisstore.ServerID("i"), true},
		{"server id with a tab", redisstore.ServerID("a\tb"), false},
	} {
		_, err := redisstore.New(c, tc.opt)
		if tc.ok && err != nil || !tc.ok && !errors.Is(err, storeerr.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want accepted %v (else ErrInvalidConfig)", tc.name, err, tc.ok)
		}
	}
}

// TestRestartedServerKeepsItsID: a Store made again with the ServerID of an earlier one
// (a process restarted under the same id) numbers its takes and refunds after the
// earlier Store's, so Redis runs them rather than answer them stale: its take is
// granted and its refund counted.
func TestRestartedServerKeepsItsID(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		id := redisstore.ServerID("web-1")
		before := newStore(t, tg.Client, id)
		if g, err := before.Take(ctx, lim, "k", 10, 10); err != nil || g.Granted != 10 {
			t.Fatalf("take before the restart: %+v, %v", g, err)
		}
		if err := before.Refund(ctx, lim, "k", 5); err != nil {
			t.Fatalf("refund before the restart: %v", err)
		}
		after := newStore(t, tg.Client, id)
		if g, err := after.Take(ctx, lim, "k", 20, 20); err != nil || g.Granted != 20 || g.Replayed {
			t.Fatalf("take after the restart: %+v, %v; want 20 granted from the 95 left", g, err)
		}
		if err := after.Refund(ctx, lim, "k", 7); err != nil {
			t.Fatalf("refund after the restart: %v", err)
		}
		if got := level(t, after, lim, "k"); got != 100-10+5-20+7 {
			t.Fatalf("the bucket holds %d, want %d: every call of both Stores ran once", got, 100-10+5-20+7)
		}
	})
}

// TestOvertakenCallsSentAgain: a take or refund that a later call of the same bucket from
// the same Store overtakes (Redis answers it stale: it did nothing) is sent again under a
// fresh number, up to four sends in all: overtaken three times it still runs, once, on
// its fourth send; overtaken four times it gives up without an error, a take granting 0
// and a refund refunding nothing, and the bucket holds what the overtaking calls left.
func TestOvertakenCallsSentAgain(t *testing.T) {
	for _, tc := range []struct {
		overtakes int
		runs      bool
	}{{1, true}, {3, true}, {4, false}} {
		t.Run(strconv.Itoa(tc.overtakes), func(t *testing.T) {
			redistest.Run(t, func(t *testing.T, tg redistest.Target) {
				lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
				s := newStore(t, tg.Client)
				bg := context.Background()
				if err := s.Refund(bg, lim, "warm", 1); err != nil { // the scripts cached: one send a call
					t.Fatal(err)
				}
				if _, err := s.Take(bg, lim, "warm", 1, 1); err != nil {
					t.Fatal(err)
				}
				h := overtakes(0, nil)
				tg.Client.AddHook(h)

				// A take of 5, overtaken by takes of 1.
				h.other = func() {
					if g, err := s.Take(bg, lim, "take", 1, 1); err != nil || g.Granted != 1 {
						t.Errorf("overtaking take: %+v, %v", g, err)
					}
				}
				h.left.Store(int32(tc.overtakes))
				g, err := s.Take(bg, lim, "take", 5, 5)
				want, left := 0, 100-tc.overtakes
				if tc.runs {
					want, left = 5, left-5
				}
				if err != nil || g.Granted != want || int(g.Remaining) != left {
					t.Errorf("take overtaken %d times: %+v, %v; want %d granted, %d left", tc.overtakes, g, err, want, left)
				}
				if got := level(t, s, lim, "take"); got != left {
					t.Errorf("take overtaken %d times: the bucket holds %d, want %d", tc.overtakes, got, left)
				}

				// A refund of 5, overtaken by refunds of 1, into a bucket at 50.
				if g, err := s.Take(bg, lim, "refund", 50, 50); err != nil || g.Granted != 50 {
					t.Fatalf("take: %+v, %v", g, err)
				}
				h.other = func() {
					if err := s.Refund(bg, lim, "refund", 1); err != nil {
						t.Errorf("overtaking refund: %v", err)
					}
				}
				h.left.Store(int32(tc.overtakes))
				if err := s.Refund(bg, lim, "refund", 5); err != nil {
					t.Errorf("refund overtaken %d times: %v", tc.overtakes, err)
				}
				left = 50 + tc.overtakes
				if tc.runs {
					left += 5
				}
				if got := level(t, s, lim, "refund"); got != left {
					t.Errorf("refund overtaken %d times: the bucket holds %d, want %d", tc.overtakes, got, left)
				}
			})
		})
	}
}

// TestGrantFirst: a take reports First when the bucket holds no record of the Store's
// takes: the first take of a new bucket, the first of another Store (another server id)
// from it, and the first after a Reset; a take after one of the same Store's, and a take
// sent again under the Seq of one that ran (a replay), do not. TakeOne and TakeBatch alike.
func TestGrantFirst(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		a, b := newStore(t, tg.Client), newStore(t, tg.Client)
		for _, via := range []struct {
			name string
			take func(*redisstore.Store, redisstore.TakeRequest) redisstore.TakeResult
		}{
			{"TakeOne", func(s *redisstore.Store, r redisstore.TakeRequest) redisstore.TakeResult {
				g, err := s.TakeOne(ctx, r)
				return redisstore.TakeResult{Grant: g, Err: err}
			}},
			{"TakeBatch", func(s *redisstore.Store, r redisstore.TakeRequest) redisstore.TakeResult {
				out := make([]redisstore.TakeResult, 1)
				_ = s.TakeBatch(ctx, []redisstore.TakeRequest{r}, out)
				return out[0]
			}},
		} {
			key := via.name
			seq := a.NextSeq()
			for i, st := range []struct {
				what  string
				s     *redisstore.Store
				seq   uint64
				reset bool // Reset the bucket first
				first bool
			}{
				{"a new bucket", a, seq, false, true},
				{"the same take sent again", a, seq, false, false},
				{"a second take", a, 0, false, false},
				{"another Store's first", b, 0, false, true},
				{"its second", b, 0, false, false},
				{"after a Reset", a, 0, true, true},
			} {
				if st.reset {
					if err := a.Reset(ctx, lim, key); err != nil {
						t.Fatal(err)
					}
				}
				r := via.take(st.s, redisstore.TakeRequest{Limit: lim, Key: key, Want: 1, Min: 1, Seq: st.seq})
				if r.Err != nil || r.Granted != 1 || r.First != st.first {
					t.Errorf("%s, step %d (%s): %+v; want 1 granted, First %v", via.name, i, st.what, r, st.first)
				}
			}
		}
	})
}

// scripterOnly is a client that runs scripts but cannot pipeline (no Pipeline method):
// a Store then sends a batch's items one call at a time.
type scripterOnly struct{ redis.Scripter }

// TestRefundBatchOneCallAtATime: on a client that cannot pipeline, RefundBatch answers
// each item as it does in a pipeline: an item of nothing is not sent (a zero result, no
// Seq), an invalid one fails alone, the others refund in order, and an item sent again
// under the Seq of one that ran refunds nothing again.
func TestRefundBatchOneCallAtATime(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		for _, via := range []struct {
			name string
			s    *redisstore.Store
		}{
			{"pipelined", newStore(t, tg.Client)},
			{"one call at a time", newStore(t, scripterOnly{tg.Client})},
		} {
			s, lim := via.s, redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
			for _, k := range []string{"a", "b"} {
				if g, err := s.Take(ctx, lim, k, 50, 50); err != nil || g.Granted != 50 {
					t.Fatalf("%s: take: %+v %v", via.name, g, err)
				}
			}
			reqs := []redisstore.RefundRequest{
				{Limit: lim, Key: "a", N: 10},
				{Limit: lim, Key: "b", N: 0},   // nothing: not sent
				{Limit: lim, Key: "b", N: 101}, // invalid: not sent
				{Limit: lim, Key: "a", N: 5},
			}
			out := make([]redisstore.RefundResult, len(reqs))
			if err := s.RefundBatch(ctx, reqs, out); !errors.Is(err, storeerr.ErrInvalidLimit) {
				t.Fatalf("%s: RefundBatch = %v, want the invalid item's error", via.name, err)
			}
			if out[0].Err != nil || out[0].Seq == 0 || !near(out[0].Remaining, 60, 1e-2) ||
				out[1] != (redisstore.RefundResult{}) ||
				!errors.Is(out[2].Err, storeerr.ErrInvalidLimit) || out[2].Seq != 0 ||
				out[3].Err != nil || out[3].Seq <= out[0].Seq || !near(out[3].Remaining, 65, 1e-2) {
				t.Fatalf("%s: %+v; want 60 left, nothing, invalid, 65 left", via.name, out)
			}
			// The last item's answer lost: sent again under its Seq.
			again := []redisstore.RefundRequest{{Limit: lim, Key: "a", N: 5, Seq: out[3].Seq}}
			if err := s.RefundBatch(ctx, again, out); err != nil || out[0].Seq != again[0].Seq || !near(out[0].Remaining, 65, 1e-2) {
				t.Fatalf("%s: sent again: %+v, %v; want the recorded 65 under the same Seq", via.name, out[0], err)
			}
			for k, want := range map[string]int{"a": 65, "b": 50} {
				if got := level(t, s, lim, k); got != want {
					t.Errorf("%s: bucket %s holds %d, want %d", via.name, k, got, want)
				}
			}
		}
	})
}

// TestTakeFloorBounds: a take's Floor may be anything from 0 to the burst, the burst
// included: a take with Floor Burst from an empty bucket is granted, and leaves the
// bucket at -Burst; a Floor outside that range fails before any call.
func TestTakeFloorBounds(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 10}
		for i, st := range []struct {
			want, floor int
			granted     int
			left        float64
		}{
			{10, 10, 10, 0},   // a full bucket
			{10, 10, 10, -10}, // an empty one: down to -Floor
			{1, 10, 0, -10},   // at -Floor: nothing more
		} {
			g, err := s.TakeOne(ctx, redisstore.TakeRequest{Limit: lim, Key: "k", Want: st.want, Min: st.want, Floor: st.floor})
			if err != nil || g.Granted != st.granted || !near(g.Remaining, st.left, 1e-2) {
				t.Fatalf("step %d: TakeOne(want %d, floor %d) = %+v, %v; want %d granted, %v left", i, st.want, st.floor, g, err, st.granted, st.left)
			}
		}
		for _, floor := range []int{-1, lim.Burst + 1} {
			out := make([]redisstore.TakeResult, 1)
			err := s.TakeBatch(ctx, []redisstore.TakeRequest{{Limit: lim, Key: "k", Want: 1, Min: 1, Floor: floor}}, out)
			if !errors.Is(err, storeerr.ErrInvalidLimit) || !errors.Is(out[0].Err, storeerr.ErrInvalidLimit) {
				t.Errorf("TakeBatch(floor %d) = %v, %+v; want ErrInvalidLimit", floor, err, out[0])
			}
		}
	})
}

// TestRefundBounds: a refund gives back at most the burst and charges a debt of at most
// MaxDebt, and a debt's Floor is at most MaxDebt (for a limit whose refill of that many
// Redis can still expire); an item past one of these bounds fails alone, before it is
// sent (no Seq), an item at the bound runs. A debt leaves the bucket no lower than
// -Floor, -Burst for Floor 0.
func TestRefundBounds(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		slow := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		fast := redisstore.Limit{Name: lname(t), Rate: 1e9, Burst: 100} // a floor of MaxDebt refills within 2^53 ms
		for _, tc := range []struct {
			name  string
			r     redisstore.RefundRequest
			valid bool
			left  float64 // from a bucket at 10 (slow) or full (fast)
		}{
			{"the burst", redisstore.RefundRequest{Limit: slow, N: 100}, true, 100},
			{"more than the burst", redisstore.RefundRequest{Limit: slow, N: 101}, false, 0},
			{"a debt of MaxDebt", redisstore.RefundRequest{Limit: slow, N: -redisstore.MaxDebt}, true, -100},
			{"a debt past MaxDebt", redisstore.RefundRequest{Limit: slow, N: -redisstore.MaxDebt - 1}, false, 0},
			{"a debt to the burst's floor", redisstore.RefundRequest{Limit: slow, N: -30}, true, -20},
			{"a debt to its floor", redisstore.RefundRequest{Limit: slow, N: -30, Floor: 5}, true, -5},
			{"a debt above its floor", redisstore.RefundRequest{Limit: slow, N: -12, Floor: 5}, true, -2},
			{"a floor of MaxDebt", redisstore.RefundRequest{Limit: fast, N: -1, Floor: redisstore.MaxDebt}, true, 99},
			{"a floor past MaxDebt", redisstore.RefundRequest{Limit: fast, N: -1, Floor: redisstore.MaxDebt + 1}, false, 0},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r := tc.r
				r.Key = redistest.Unique(t)
				if r.Limit == slow {
					if g, err := s.Take(ctx, slow, r.Key, 90, 90); err != nil || g.Granted != 90 {
						t.Fatalf("take: %+v, %v", g, err)
					}
				}
				out := make([]redisstore.RefundResult, 1)
				err := s.RefundBatch(ctx, []redisstore.RefundRequest{r}, out)
				if !tc.valid {
					if !errors.Is(err, storeerr.ErrInvalidLimit) || out[0].Seq != 0 {
						t.Fatalf("RefundBatch = %v, %+v; want ErrInvalidLimit, not sent", err, out[0])
					}
					if r.Floor != 0 {
						return // Refund has no floor: the burst's
					}
					if err := s.Refund(ctx, r.Limit, r.Key, r.N); !errors.Is(err, storeerr.ErrInvalidLimit) {
						t.Fatalf("Refund = %v, want ErrInvalidLimit", err)
					}
					return
				}
				if err != nil || out[0].Seq == 0 || !near(out[0].Remaining, tc.left, 1e-2) {
					t.Fatalf("RefundBatch = %v, %+v; want %v left", err, out[0], tc.left)
				}
			})
		}
	})
}

// TestResetChecksItsCall: Reset refuses an invalid limit, and a client without DEL,
// before any call: the bucket stays.
func TestResetChecksItsCall(t *testing.T) {
	_, c := redistest.Mini(t)
	ctx := context.Background()
	lim := redisstore.Limit{Name: "reset", Rate: 1e-4, Burst: 10}
	s := newStore(t, c)
	if g, err := s.Take(ctx, lim, "k", 4, 4); err != nil || g.Granted != 4 {
		t.Fatalf("take: %+v, %v", g, err)
	}
	for _, tc := range []struct {
		name string
		s    *redisstore.Store
		lim  redisstore.Limit
		want error
	}{
		{"no rate", s, redisstore.Limit{Name: lim.Name, Burst: 10}, storeerr.ErrInvalidLimit},
		{"no burst", s, redisstore.Limit{Name: lim.Name, Rate: 1e-4}, storeerr.ErrInvalidLimit},
		{"a version past MaxVersion", s, redisstore.Limit{Name: lim.Name, Rate: 1e-4, Burst: 10, Version: redisstore.MaxVersion + 1}, storeerr.ErrInvalidLimit},
		{"a client without DEL", newStore(t, scripterOnly{c}), lim, storeerr.ErrInvalidConfig},
	} {
		if err := tc.s.Reset(ctx, tc.lim, "k"); !errors.Is(err, tc.want) {
			t.Errorf("%s: Reset = %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := level(t, s, lim, "k"); got != 6 {
		t.Errorf("the bucket holds %d after refused Resets, want the 6 left", got)
	}
}

// TestLowSetWithoutReadAt: a set with nothing to write is only read when it has a ReadAt
// (LowSet.ReadOnly); without one it runs the script, which judges the marks by Redis's
// clock: a mark whose memory has passed there is not answered.
func TestLowSetWithoutReadAt(t *testing.T) {
	for _, tc := range []struct {
		name string
		x    redisstore.LowSet
		want bool
	}{
		{"nothing to write, ReadAt", redisstore.LowSet{ReadAt: t0}, true},
		{"nothing to write, no ReadAt", redisstore.LowSet{}, false},
		{"a mark, ReadAt", redisstore.LowSet{Mark: []redisstore.KeyID{"a"}, ReadAt: t0}, false},
		{"an unmark, ReadAt", redisstore.LowSet{Unmark: []redisstore.KeyID{"a"}, ReadAt: t0}, false},
	} {
		if got := tc.x.ReadOnly(); got != tc.want {
			t.Errorf("%s: ReadOnly() = %v, want %v", tc.name, got, tc.want)
		}
	}
	m, c := redistest.Mini(t)
	m.SetTime(t0)
	s := newStore(t, c)
	ctx := context.Background()
	if _, err := s.Low(ctx, "l", 1, 0, []redisstore.KeyID{"gone"}, nil, time.Second); err != nil {
		t.Fatal(err)
	}
	m.SetTime(t0.Add(2 * time.Second))
	got, errs := make([][]redisstore.KeyID, 1), make([]error, 1)
	if err := s.LowBatch(ctx, []redisstore.LowSet{{Limit: "l", Shards: 1}}, time.Second, got, errs); err != nil || len(got[0]) != 0 {
		t.Fatalf("LowBatch of a set with nothing to write, no ReadAt = %q, %v; want no mark (its memory passed by Redis's clock)", got[0], err)
	}
}
