package redisstore_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// level is what the bucket of lim and key holds now: a take of everything, refunded.
func level(t *testing.T, s *redisstore.Store, lim redisstore.Limit, key string) int {
	t.Helper()
	ctx := context.Background()
	g, err := s.Take(ctx, lim, key, lim.Burst, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Refund(ctx, lim, key, g.Granted); err != nil {
		t.Fatal(err)
	}
	return g.Granted
}

func TestRefundBatch(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		for i := range 4 {
			if g, err := s.Take(ctx, lim, "k"+strconv.Itoa(i), 50, 50); err != nil || g.Granted != 50 {
				t.Fatalf("take: %+v %v", g, err)
			}
		}
		reqs := []redisstore.RefundRequest{
			{Limit: lim, Key: "k0", N: 10},
			{Limit: lim, Key: "k1", N: 0},   // nothing to send
			{Limit: lim, Key: "k2", N: 101}, // more than the burst: invalid, not sent
			{Limit: lim, Key: "k3", N: 80},  // 50 + 80 is capped at 100
			{Limit: lim, Key: "k0", N: 5},   // a second refund of one bucket adds up
			{Limit: lim, Key: "new", N: 7},  // a bucket that does not exist is full
		}
		out := make([]redisstore.RefundResult, len(reqs))
		err := s.RefundBatch(ctx, reqs, out)
		if !errors.Is(err, storeerr.ErrInvalidLimit) || !errors.Is(out[2].Err, storeerr.ErrInvalidLimit) {
			t.Fatalf("RefundBatch error %v, item 2 %v: want the invalid item's error", err, out[2].Err)
		}
		for _, c := range []struct {
			item int
			left float64
		}{{0, 60}, {1, 0}, {3, 100}, {4, 65}, {5, 100}} {
			if r := out[c.item]; r.Err != nil || !near(r.Remaining, c.left, 1e-2) {
				t.Errorf("item %d: %+v, want %v left", c.item, r, c.left)
			}
		}
		for key, want := range map[string]int{"k0": 65, "k1": 50, "k2": 50, "k3": 100, "new": 100} {
			if got := level(t, s, lim, key); got != want {
				t.Errorf("bucket %s holds %d, want %d", key, got, want)
			}
		}

		if err := s.RefundBatch(ctx, reqs, out[:2]); !errors.Is(err, storeerr.ErrInvalidConfig) {
			t.Fatalf("short out: %v, want ErrInvalidConfig", err)
		}
		if err := s.RefundBatch(ctx, nil, nil); err != nil {
			t.Fatalf("empty batch: %v", err)
		}
		// A batch with nothing to send makes no call and answers nothing.
		if err := s.RefundBatch(ctx, reqs[1:2], out); err != nil || out[0] != (redisstore.RefundResult{}) {
			t.Fatalf("N == 0 batch: %+v %v", out[0], err)
		}
	})
}

// replayHook sends every pipeline twice, as a client that retries a timed-out pipeline
// does: the same (server id, seq) reaches Redis twice.
type replayHook struct{}

func (replayHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (replayHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (replayHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if err := next(ctx, cmds); err != nil {
			return err
		}
		return next(ctx, cmds)
	}
}

// TestRefundBatchReplaySafe: a batch whose commands all run twice refunds once.
func TestRefundBatchReplaySafe(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		reqs := make([]redisstore.RefundRequest, 8)
		for i := range reqs {
			reqs[i] = redisstore.RefundRequest{Limit: lim, Key: "k" + strconv.Itoa(i), N: 3 + i}
			if g, err := s.Take(ctx, lim, reqs[i].Key, 60, 60); err != nil || g.Granted != 60 {
				t.Fatalf("take: %+v %v", g, err)
			}
		}
		tg.Client.AddHook(replayHook{})
		out := make([]redisstore.RefundResult, len(reqs))
		if err := s.RefundBatch(ctx, reqs, out); err != nil {
			t.Fatal(err)
		}
		for i, r := range out {
			// The replayed answer is the recorded one: the level after the one refund.
			if want := float64(40 + 3 + i); r.Err != nil || !near(r.Remaining, want, 1e-2) {
				t.Errorf("item %d: %+v, want %v left", i, r, want)
			}
			if got := level(t, s, lim, reqs[i].Key); got != 40+3+i {
				t.Errorf("bucket %d holds %d after a replayed refund of %d, want %d", i, got, 3+i, 40+3+i)
			}
		}
	})
}

// countingStore is a Store on c, whose pipelines a countingHook records, with the refund
// script cached (a refund of lim to a key with no bucket, which writes nothing): what the
// hook records after it is what a test sends.
func countingStore(t *testing.T, c *redis.Client, lim redisstore.Limit) (*redisstore.Store, *countingHook) {
	t.Helper()
	hook := &countingHook{}
	c.AddHook(hook)
	s := newStore(t, c)
	if err := s.Refund(context.Background(), lim, "warm", 1); err != nil {
		t.Fatal(err)
	}
	return s, hook
}

// TestRefundBatchCalls: a RefundBatch of more items than one script call carries
// answers each item as refunds one at a time in the batch's order would, a bucket
// refunded twice in one call (20 buckets, 32 items a call) or in two included, in one
// round trip of ⌈sent/RefundsPerCall⌉ calls; items not sent (invalid, or of nothing)
// are not in them.
func TestRefundBatchCalls(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 1000}
		s, hook := countingStore(t, tg.Client, lim)
		const keys = 20
		for i := range keys {
			if g, err := s.Take(ctx, lim, "k"+strconv.Itoa(i), 500, 500); err != nil || g.Granted != 500 {
				t.Fatalf("take: %+v %v", g, err)
			}
		}
		reqs := make([]redisstore.RefundRequest, 2*redisstore.RefundsPerCall+6)
		want := make([]float64, len(reqs)) // each item's bucket after it
		level := map[string]float64{}
		sent := 0
		for i := range reqs {
			key := "k" + strconv.Itoa(i%keys)
			reqs[i] = redisstore.RefundRequest{Limit: lim, Key: key, N: 1 + i%7}
			switch i {
			case 10:
				reqs[i].N = lim.Burst + 1 // invalid: not sent
				continue
			case 20:
				reqs[i].N = 0 // nothing: not sent
				continue
			}
			if _, ok := level[key]; !ok {
				level[key] = 500
			}
			level[key] += float64(reqs[i].N)
			want[i] = level[key]
			sent++
		}
		out := make([]redisstore.RefundResult, len(reqs))
		hook.pipelines = nil
		if err := s.RefundBatch(ctx, reqs, out); !errors.Is(err, storeerr.ErrInvalidLimit) {
			t.Fatalf("RefundBatch: %v, want the invalid item's error", err)
		}
		calls := (sent + redisstore.RefundsPerCall - 1) / redisstore.RefundsPerCall
		if len(hook.pipelines) != 1 || countOf(hook.pipelines[0], "evalsha") != calls {
			t.Fatalf("pipelines %v, want one round trip of %d calls for %d items", hook.pipelines, calls, sent)
		}
		for i, r := range out {
			switch {
			case i == 10:
				if !errors.Is(r.Err, storeerr.ErrInvalidLimit) || r.Seq != 0 {
					t.Errorf("invalid item: %+v", r)
				}
			case i == 20:
				if r != (redisstore.RefundResult{}) {
					t.Errorf("item of nothing: %+v", r)
				}
			case r.Err != nil || r.Seq == 0 || !near(r.Remaining, want[i], 1e-2):
				t.Errorf("item %d (%s, %d): %+v, want %v left", i, reqs[i].Key, reqs[i].N, r, want[i])
			}
		}
		for key, l := range level {
			if got, err := s.Take(ctx, lim, key, lim.Burst, 1); err != nil || !near(float64(got.Granted), math.Floor(l), 1) {
				t.Errorf("bucket %s holds %+v (%v), want %v", key, got, err, l)
			}
		}
	})
}

// TestRefundBatchKeyRefused: a key Redis refuses within a call of several refunds (here
// WRONGTYPE: it holds a string, not a bucket) fails alone, with Redis's error, classified
// as that reply is (ErrRedis), and the call's other refunds run, each once, in the one
// round trip. An item whose debt floor Redis could not expire fails before it is sent,
// alone.
func TestRefundBatchKeyRefused(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		s, hook := countingStore(t, tg.Client, lim)
		for _, k := range []string{"a", "c"} {
			if g, err := s.Take(ctx, lim, k, 50, 50); err != nil || g.Granted != 50 {
				t.Fatalf("take: %+v %v", g, err)
			}
		}
		if err := tg.Client.Set(ctx, s.Key(lim.Name, "b"), "not a bucket", 0).Err(); err != nil {
			t.Fatal(err)
		}
		reqs := []redisstore.RefundRequest{
			{Limit: lim, Key: "a", N: 10},                                       // before the refused key
			{Limit: lim, Key: "b", N: 5},                                        // WRONGTYPE
			{Limit: lim, Key: "c", N: 7},                                        // after it
			{Limit: lim, Key: "c", N: -3, Floor: 1 << 50, Ref: 0, HasRef: true}, // its floor: invalid, not sent
		}
		out := make([]redisstore.RefundResult, len(reqs))
		hook.pipelines = nil
		err := s.RefundBatch(ctx, reqs, out)
		if err == nil || !errors.Is(out[1].Err, storeerr.ErrRedis) || storeerr.IsUnavailable(out[1].Err) ||
			!strings.Contains(out[1].Err.Error(), "WRONGTYPE") || !errors.Is(out[3].Err, storeerr.ErrInvalidLimit) {
			t.Fatalf("RefundBatch: %v; items %+v: want item 1 refused with Redis's WRONGTYPE, item 3 invalid", err, out)
		}
		if len(hook.pipelines) != 1 || countOf(hook.pipelines[0], "evalsha") != 1 {
			t.Fatalf("pipelines %v: want one call in one round trip", hook.pipelines)
		}
		for _, c := range []struct {
			item int
			left float64
		}{{0, 60}, {2, 57}} {
			if r := out[c.item]; r.Err != nil || !near(r.Remaining, c.left, 1e-2) {
				t.Errorf("item %d: %+v, want %v left", c.item, r, c.left)
			}
		}
		for _, c := range []struct {
			key  string
			want int
		}{{"a", 60}, {"c", 57}} {
			if got := level(t, s, lim, c.key); got != c.want {
				t.Errorf("bucket %s holds %d, want %d: refunded once", c.key, got, c.want)
			}
		}
	})
}

// TestRefundBatchNoScript: an empty script cache costs one extra round trip, and only
// the script calls that got NOSCRIPT are re-sent: six calls, five of RefundsPerCall
// items and one of three.
func TestRefundBatchNoScript(t *testing.T) {
	ctx := context.Background()
	check := func(t *testing.T, c *redis.Client) {
		hook := &countingHook{}
		c.AddHook(hook)
		s := newStore(t, c)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		reqs := make([]redisstore.RefundRequest, 5*redisstore.RefundsPerCall+3)
		for i := range reqs {
			reqs[i] = redisstore.RefundRequest{Limit: lim, Key: "b" + strconv.Itoa(i), N: 4}
			if g, err := s.Take(ctx, lim, reqs[i].Key, 50, 50); err != nil || g.Granted != 50 {
				t.Fatalf("take: %+v %v", g, err)
			}
		}
		out := make([]redisstore.RefundResult, len(reqs))
		checkBatchNoScript(t, c, hook, "RefundBatch", 6, func() error { return s.RefundBatch(ctx, reqs, out) }, func() {})
		for i, r := range out {
			// 50 + 4 (flushed) + 4 (warm) + 4 (partial) = 62 in every bucket.
			if r.Err != nil || !near(r.Remaining, 62, 1e-2) {
				t.Fatalf("item %d: %+v, want 62 left", i, r)
			}
		}
	}
	t.Run("miniredis", func(t *testing.T) {
		_, c := redistest.Mini(t)
		check(t, c)
	})
	t.Run("redis", func(t *testing.T) {
		srv := redistest.StartServer(t) // its own server: SCRIPT FLUSH is not for the shared one
		check(t, srv.Client())
	})
}

// TestRefundBatchNotStale: an item overtaken by a concurrent refund of the same bucket
// from the same Store (answered stale, nothing refunded) is sent again, not dropped.
func TestRefundBatchNotStale(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		s := newStore(t, tg.Client)
		if g, err := s.Take(ctx, lim, "k", 50, 50); err != nil || g.Granted != 50 {
			t.Fatalf("take: %+v, %v", g, err)
		}
		h := overtakes(1, func() {
			if err := s.Refund(ctx, lim, "k", 10); err != nil {
				t.Errorf("other refund: %v", err)
			}
		})
		tg.Client.AddHook(h)
		out := make([]redisstore.RefundResult, 1)
		if err := s.RefundBatch(ctx, []redisstore.RefundRequest{{Limit: lim, Key: "k", N: 5}}, out); err != nil {
			t.Fatal(err)
		}
		if h.ran.Load() == 0 {
			t.Fatal("the hook did not run")
		}
		if !near(out[0].Remaining, 65, 1e-2) {
			t.Errorf("batch answered %v left, want 65", out[0].Remaining)
		}
		if got := level(t, s, lim, "k"); got != 65 {
			t.Fatalf("after refunds of 10 and 5 into 50 left, the bucket holds %d, want 65", got)
		}
	})
}

// TestRefundBatchErrors: a broken Redis fails every item with ErrUnavailable.
func TestRefundBatchErrors(t *testing.T) {
	m, c := redistest.Mini(t)
	s := newStore(t, c)
	lim := redisstore.Limit{Name: lname(t), Rate: 1, Burst: 10}
	m.Close()
	out := make([]redisstore.RefundResult, 2)
	err := s.RefundBatch(context.Background(), []redisstore.RefundRequest{{Limit: lim, Key: "a", N: 1}, {Limit: lim, Key: "b", N: 2}}, out)
	if !storeerr.IsUnavailable(err) || !storeerr.IsUnavailable(out[0].Err) || !storeerr.IsUnavailable(out[1].Err) {
		t.Fatalf("closed Redis: %v, items %v / %v, want ErrUnavailable", err, out[0].Err, out[1].Err)
	}
}

// TestRefundBatchRetryWithSeq: a refund sent again with the Seq of its first attempt
// adds nothing where that attempt ran, and refunds where it did not.
func TestRefundBatchRetryWithSeq(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		for _, k := range []string{"ran", "lost"} {
			if g, err := s.Take(ctx, lim, k, 50, 50); err != nil || g.Granted != 50 {
				t.Fatalf("take: %+v %v", g, err)
			}
		}
		reqs := []redisstore.RefundRequest{{Limit: lim, Key: "ran", N: 10}}
		out := make([]redisstore.RefundResult, 2)
		if err := s.RefundBatch(ctx, reqs, out); err != nil || out[0].Seq == 0 {
			t.Fatalf("first attempt: %+v %v", out[0], err)
		}
		// The answer was lost; the retry carries the first attempt's seq.
		reqs[0].Seq = out[0].Seq
		if err := s.RefundBatch(ctx, reqs, out); err != nil || !near(out[0].Remaining, 60, 1e-2) || out[0].Seq != reqs[0].Seq {
			t.Fatalf("retry: %+v %v, want the recorded 60 and the same seq", out[0], err)
		}
		if got := level(t, s, lim, "ran"); got != 60 {
			t.Fatalf("a refund of 10 sent twice left %d, want 60", got)
		}
		if tg.Mini == nil {
			return
		}
		// An attempt that never ran: the retry with its seq refunds.
		tg.Mini.SetError("LOADING Redis is loading the dataset in memory")
		lost := []redisstore.RefundRequest{{Limit: lim, Key: "lost", N: 7}}
		if err := s.RefundBatch(ctx, lost, out); !storeerr.IsUnavailable(err) || out[0].Seq == 0 {
			t.Fatalf("failed attempt: %+v %v", out[0], err)
		}
		tg.Mini.SetError("")
		lost[0].Seq = out[0].Seq
		if err := s.RefundBatch(ctx, lost, out); err != nil || !near(out[0].Remaining, 57, 1e-2) {
			t.Fatalf("retry of a lost refund: %+v %v, want 57 left", out[0], err)
		}
	})
}

// TestDebtRetryAfterARefund: a debt (a charge) whose first attempt timed out goes again
// under its seq; a refund of the same bucket sent meanwhile under a later seq does not
// make the retry stale. Debts and refunds keep records of their own, so the retry
// charges where the first attempt did not run, and only once where it did.
func TestDebtRetryAfterARefund(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := redisstore.Limit{Name: lname(t), Rate: 1e-4, Burst: 100}
		for _, tc := range []struct {
			key  string
			ran  bool // the first attempt ran in Redis (its answer was lost)
			want int  // the level after: 100 - 50 taken + 10 refunded - 5 charged
		}{{"lost", false, 55}, {"ran", true, 55}} {
			if g, err := s.Take(ctx, lim, tc.key, 50, 50); err != nil || g.Granted != 50 {
				t.Fatalf("%s: take: %+v %v", tc.key, g, err)
			}
			charge := []redisstore.RefundRequest{{Limit: lim, Key: tc.key, N: -5, Seq: s.NextSeq()}}
			out := make([]redisstore.RefundResult, 1)
			if tc.ran {
				if err := s.RefundBatch(ctx, charge, out); err != nil {
					t.Fatalf("%s: charge: %v", tc.key, err)
				}
			}
			refund := []redisstore.RefundRequest{{Limit: lim, Key: tc.key, N: 10}} // a later seq
			if err := s.RefundBatch(ctx, refund, out); err != nil || out[0].Seq <= charge[0].Seq {
				t.Fatalf("%s: refund: %+v %v, want a later seq", tc.key, out[0], err)
			}
			if err := s.RefundBatch(ctx, charge, out); err != nil {
				t.Fatalf("%s: the charge's retry: %v", tc.key, err)
			}
			if got := level(t, s, lim, tc.key); got != tc.want {
				t.Errorf("%s: level %d after the charge's retry, want %d (charged once)", tc.key, got, tc.want)
			}
		}
	})
}
