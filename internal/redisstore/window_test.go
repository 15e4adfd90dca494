package redisstore_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// winLimit is a windowed limit of 50 per second: windows of 1 s.
func winLimit(t testing.TB) redisstore.Limit {
	return redisstore.Limit{Name: lname(t), Rate: 50, Burst: 50}
}

// hourLimit is a limit of hour-long windows: a test whose trips must all fall in one
// window, before its array's deadline, has an hour for them, not what is left of a
// second, which a loaded machine can outlast.
func hourLimit(t testing.TB, burst int) redisstore.Limit {
	return redisstore.Limit{Name: lname(t), Rate: float64(burst) / 3600, Burst: burst}
}

// nowWin is the index of lim's window of phase 0 now: an array of a window long past
// would be deleted by its own deadline.
func nowWin(lim redisstore.Limit) int64 {
	return time.Now().UnixMicro() / wire.WindowMicros(lim.Rate, lim.Burst)
}

func TestWindowsCounts(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := winLimit(t)
		a, b := redisstore.IDOf("alice"), redisstore.IDOf("bob")
		now := nowWin(lim)
		trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 10, Clock: true, Ops: []redisstore.WindowOp{
			{ID: a, Win: now, N: 3},
			{ID: a, Win: now, N: 2},
			{ID: b, Win: now, N: 1},
			{ID: a, Win: now + 1, N: 7}, // another window, another array
			{ID: a, Win: now, N: 4, Demand: true},
			{ID: a, Win: now, N: -9}, // taken back: saturates at 0
			{ID: a, Win: now, N: 1},
			{ID: b, Win: now, N: 0}, // a read
		}}
		before := time.Now()
		if err := s.Windows(ctx, &trip); err != nil {
			t.Fatal(err)
		}
		var got []int
		for _, op := range trip.Ops {
			got = append(got, op.Count)
		}
		if want := []int{3, 5, 1, 7, 4, 0, 1, 1}; !slices.Equal(got, want) {
			t.Errorf("counts %v, want %v", got, want)
		}
		if tg.Real() && (trip.Now.Before(before.Add(-time.Second)) || trip.Now.After(time.Now().Add(time.Second))) {
			t.Errorf("Redis's time %v, not near %v", trip.Now, before)
		}
		// The arrays expire a second after the end of the window after theirs, on
		// Redis's clock: the same deadline from every server.
		w := wire.WindowMicros(lim.Rate, lim.Burst)
		for _, win := range []int64{now, now + 1} {
			key := wire.WindowKey(redisstore.DefaultPrefix, lim.Name, 1, 0, w, win)
			if tg.Mini != nil { // miniredis has no PEXPIRETIME
				continue
			}
			at, err := tg.Client.PExpireTime(ctx, key).Result()
			if want := time.Duration(win+3) * time.Second; err != nil || at != want {
				t.Errorf("%s: deadline %v, %v; want %v since 1970", key, at, err, want)
			}
		}
		// A window long past: its deadline has passed, and the array is gone at once.
		old := redisstore.WindowTrip{Limit: lim, Width: 1 << 10, Ops: []redisstore.WindowOp{{ID: a, Win: 100, N: 1}}}
		if err := s.Windows(ctx, &old); err != nil {
			t.Fatal(err)
		}
		if n := tg.Client.Exists(ctx, wire.WindowKey(redisstore.DefaultPrefix, lim.Name, 1, 0, w, 100)).Val(); n != 0 {
			t.Errorf("the array of a window of 1970 was kept")
		}
	})
}

// TestWindowsDeadline: a window's array lives until a second after the end of the window
// after it, and every trip that touches it sets that deadline again (an array made again
// after a restart, a FLUSHALL or an eviction has none), and a trip that runs after the
// deadline (queued during a stall) leaves nothing behind.
func TestWindowsDeadline(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := winLimit(t)
		now := time.Now()
		if tg.Mini != nil {
			tg.Mini.SetTime(now)
		}
		w := wire.WindowMicros(lim.Rate, lim.Burst)
		win := now.UnixMicro() / w
		key := wire.WindowKey(redisstore.DefaultPrefix, lim.Name, 1, 0, w, win)
		trip := func(win int64) error {
			return s.Windows(ctx, &redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Ops: []redisstore.WindowOp{{ID: "k", Win: win, N: 1}}})
		}
		if err := trip(win); err != nil {
			t.Fatal(err)
		}
		ttl := func(key string) time.Duration {
			if tg.Mini != nil {
				if !tg.Mini.Exists(key) {
					return -2 * time.Nanosecond
				}
				return tg.Mini.TTL(key)
			}
			return tg.Client.PTTL(ctx, key).Val()
		}
		if d := ttl(key); d <= time.Second || d > 3*time.Second+100*time.Millisecond {
			t.Fatalf("array's TTL %v, want between 1s and 3s", d)
		}
		tg.Client.Persist(ctx, key) // as an array made again after a restart would be
		if err := trip(win); err != nil {
			t.Fatal(err)
		}
		if d := ttl(key); d <= time.Second {
			t.Fatalf("TTL %v after a second trip: the deadline did not go again", d)
		}
		// an op of a window whose array's deadline has passed
		old := win - 10
		if err := trip(old); err != nil {
			t.Fatal(err)
		}
		if d := ttl(wire.WindowKey(redisstore.DefaultPrefix, lim.Name, 1, 0, w, old)); d != -2*time.Nanosecond && d != -2*time.Millisecond {
			t.Fatalf("an array made after its deadline: TTL %v, want it gone", d)
		}
	})
}

func TestWindowsMarks(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s1, s2 := newStore(t, tg.Client), newStore(t, tg.Client)
		lim := winLimit(t)
		mem := 30 * time.Second
		t0 := time.Now().Truncate(time.Millisecond)
		send := func(s *redisstore.Store, at time.Time, marks ...redisstore.WindowMark) {
			t.Helper()
			if err := s.Windows(ctx, &redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Marks: marks, Memory: mem, At: at, Tidy: true}); err != nil {
				t.Fatal(err)
			}
		}
		read := func(since time.Time) []redisstore.WindowMark {
			t.Helper()
			r := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Read: true, Since: since, Memory: mem}
			if err := s2.Windows(ctx, &r); err != nil {
				t.Fatal(err)
			}
			return r.Got
		}
		if got := read(time.Time{}); len(got) != 0 {
			t.Fatalf("read of no marks: %v", got)
		}
		long := redisstore.IDOf(string(make([]byte, 100))) // a digest ID
		send(s1, t0, redisstore.WindowMark{ID: "alice", Flags: wire.MarkLow, Win: 7}, redisstore.WindowMark{ID: long, Flags: wire.MarkSpent | wire.MarkOver, Win: 8})
		send(s1, t0.Add(10*time.Millisecond), redisstore.WindowMark{ID: "bob", Flags: wire.MarkOver, Win: 9})
		// another server marks alice alike: one member, recorded later
		send(s2, t0.Add(20*time.Millisecond), redisstore.WindowMark{ID: "alice", Flags: wire.MarkLow, Win: 7})
		got := read(time.Time{})
		want := []redisstore.WindowMark{
			{ID: long, Flags: wire.MarkSpent | wire.MarkOver, Win: 8, At: t0},
			{ID: "bob", Flags: wire.MarkOver, Win: 9, At: t0.Add(10 * time.Millisecond)},
			{ID: "alice", Flags: wire.MarkLow, Win: 7, At: t0.Add(20 * time.Millisecond)},
		}
		if len(got) != len(want) {
			t.Fatalf("read %v, want %v", got, want)
		}
		for i, m := range got {
			if m.ID != want[i].ID || m.Flags != want[i].Flags || m.Win != want[i].Win || !m.At.Equal(want[i].At) {
				t.Errorf("mark %d: %+v, want %+v", i, m, want[i])
			}
		}
		if got := read(t0.Add(15 * time.Millisecond)); len(got) != 1 || got[0].ID != "alice" {
			t.Errorf("read from t0+15ms: %v, want alice's mark only", got)
		}
		// A member that is not a mark (written by another program) fails neither the read
		// nor the trip's counts: it is left out, and counted.
		key := wire.MarksKey(redisstore.DefaultPrefix, lim.Name, 1, 0)
		if err := tg.Client.ZAdd(ctx, key, redis.Z{Score: float64(t0.Add(5 * time.Millisecond).UnixMilli()), Member: "not a mark"}).Err(); err != nil {
			t.Fatal(err)
		}
		r := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Read: true, Memory: mem, Ops: []redisstore.WindowOp{{ID: "dave", Win: 9, N: 1}}}
		if err := s2.Windows(ctx, &r); err != nil || len(r.Got) != 3 || r.Skipped != 1 || r.Ops[0].Count != 1 {
			t.Fatalf("read past a member that is not a mark: %v; %d marks, %d skipped, count %d; want 3, 1 and 1", err, len(r.Got), r.Skipped, r.Ops[0].Count)
		}
		if err := tg.Client.ZRem(ctx, key, "not a mark").Err(); err != nil {
			t.Fatal(err)
		}
		// A mark older than the memory is dropped by a tidy trip.
		send(s1, t0.Add(mem+15*time.Millisecond), redisstore.WindowMark{ID: "carol", Flags: wire.MarkLow, Win: 10})
		if got := read(time.Time{}); len(got) != 2 || got[0].ID != "alice" || got[1].ID != "carol" {
			t.Errorf("after the trim: %v, want alice's and carol's marks", got)
		}
		ttl := tg.Client.PTTL(ctx, key).Val()
		if tg.Mini != nil {
			ttl = tg.Mini.TTL(key)
		}
		if ttl <= mem-5*time.Second || ttl > mem {
			t.Errorf("marks' TTL %v, want about %v", ttl, mem)
		}
	})
}

// TestWindowsMarksResume: a read of MaxMarksRead marks says where the next goes (More,
// Resume, ResumeSkip): the reads of more marks than that, recorded in one millisecond,
// go through them, each past what the ones before read, and then on to later marks.
func TestWindowsMarksResume(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := winLimit(t)
		mem := 30 * time.Second
		t0 := time.Now().Truncate(time.Millisecond)
		total := 2*redisstore.MaxMarksRead + 3
		for from := 0; from < total; from += 5000 { // one millisecond's marks, 5,000 a trip
			var marks []redisstore.WindowMark
			for i := from; i < min(from+5000, total); i++ {
				marks = append(marks, redisstore.WindowMark{ID: redisstore.KeyID("k" + strconv.Itoa(i)), Flags: wire.MarkLow, Win: 1})
			}
			if err := s.Windows(ctx, &redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Marks: marks, Memory: mem, At: t0}); err != nil {
				t.Fatal(err)
			}
		}
		later := redisstore.WindowMark{ID: "later", Flags: wire.MarkSpent, Win: 1}
		if err := s.Windows(ctx, &redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Marks: []redisstore.WindowMark{later}, Memory: mem, At: t0.Add(time.Millisecond)}); err != nil {
			t.Fatal(err)
		}
		seen := map[redisstore.KeyID]int{}
		since, skip := t0.Add(-time.Millisecond), 0
		for reads := 1; ; reads++ {
			r := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Read: true, Since: since, Skip: skip, Memory: mem}
			if err := s.Windows(ctx, &r); err != nil {
				t.Fatal(err)
			}
			for _, m := range r.Got {
				seen[m.ID]++
			}
			if !r.More {
				if reads != 3 {
					t.Errorf("%d reads, want 3", reads)
				}
				break
			}
			if reads == 3 {
				t.Fatalf("read %d: more to come, from %v skipping %d", reads, r.Resume.Sub(t0), r.ResumeSkip)
			}
			if want := reads * redisstore.MaxMarksRead; !r.Resume.Equal(t0) || r.ResumeSkip != want {
				t.Fatalf("read %d: resume from t0%+v skipping %d, want t0 skipping %d", reads, r.Resume.Sub(t0), r.ResumeSkip, want)
			}
			since, skip = r.Resume, r.ResumeSkip
		}
		if len(seen) != total+1 || seen["later"] != 1 {
			t.Fatalf("read %d marks (the later one %d times), want %d and once", len(seen), seen["later"], total+1)
		}
		for id, n := range seen {
			if n != 1 {
				t.Fatalf("mark %s read %d times", id, n)
			}
		}
	})
}

// TestWindowsConcurrent: BITFIELD INCRBY is atomic, so concurrent trips of many servers
// each see a count of their own: 16 servers adding 1 at a time to one key see every
// count from 1 to 3,200 exactly once.
func TestWindowsConcurrent(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := hourLimit(t, 10000)
		const servers, trips = 16, 200
		win := nowWin(lim)
		seen := make([]int, servers*trips+1)
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, servers)
		for range servers {
			s := newStore(t, tg.Client)
			wg.Go(func() {
				for range trips {
					trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Ops: []redisstore.WindowOp{{ID: "k", Win: win, N: 1}}}
					if err := s.Windows(ctx, &trip); err != nil {
						errs <- err
						return
					}
					mu.Lock()
					if c := trip.Ops[0].Count; c > 0 && c < len(seen) {
						seen[c]++
					}
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		for c := 1; c < len(seen); c++ {
			if seen[c] != 1 {
				t.Fatalf("count %d answered %d times, want once", c, seen[c])
			}
		}
	})
}

// TestWindowsSaturate: counters stop at their top and at 0 instead of wrapping.
func TestWindowsSaturate(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		for _, tc := range []struct {
			burst int
			top   int
		}{{1 << 14, 1<<16 - 1}, {1<<14 + 1, 1<<32 - 1}} {
			lim := redisstore.Limit{Name: lname(t), Rate: 1, Burst: tc.burst}
			win := nowWin(lim)
			trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Ops: []redisstore.WindowOp{
				{ID: "k", Win: win, N: tc.top - 1}, {ID: "k", Win: win, N: 5}, {ID: "k", Win: win, N: -tc.top}, {ID: "k", Win: win, N: -1}}}
			if tc.top > redisstore.MaxWindowBurst { // one op may not carry that much
				op := redisstore.WindowOp{ID: "k", Win: win, N: redisstore.MaxWindowBurst}
				trip.Ops = []redisstore.WindowOp{op, op, op, op, op}
			}
			if err := s.Windows(ctx, &trip); err != nil {
				t.Fatal(err)
			}
			if got := trip.Ops[len(trip.Ops)-1].Count; tc.top < redisstore.MaxWindowBurst && (trip.Ops[1].Count != tc.top || got != 0) {
				t.Errorf("burst %d: counts %+v, want the top %d then 0", tc.burst, trip.Ops, tc.top)
			} else if tc.top > redisstore.MaxWindowBurst && got != tc.top {
				t.Errorf("burst %d: count %d, want the top %d", tc.burst, got, tc.top)
			}
		}
	})
}

func TestWindowsInvalid(t *testing.T) {
	ctr := &redistest.Counter{}
	_, c := redistest.Mini(t)
	c.AddHook(ctr)
	s := newStore(t, c)
	lim := redisstore.Limit{Name: "api", Rate: 50, Burst: 50}
	ok := redisstore.WindowTrip{Limit: lim, Width: 1 << 8}
	tests := []struct {
		name string
		edit func(*redisstore.WindowTrip)
	}{
		{"bad limit", func(t *redisstore.WindowTrip) { t.Limit.Rate = 0 }},
		{"burst too large", func(t *redisstore.WindowTrip) { t.Limit.Burst = redisstore.MaxWindowBurst + 1 }},
		{"width not a power of two", func(t *redisstore.WindowTrip) { t.Width = 1000 }},
		{"width too small", func(t *redisstore.WindowTrip) { t.Width = redisstore.MinWindowWidth / 2 }},
		{"too many shards", func(t *redisstore.WindowTrip) { t.Shards = redisstore.MaxWindowShards + 1 }},
		{"shard out of range", func(t *redisstore.WindowTrip) { t.Shards, t.Shard = 64, 64 }},
		{"op of another shard", func(t *redisstore.WindowTrip) {
			t.Shards, t.Shard = 64, (wire.WindowShard("k", 64)+1)%64
			t.Ops = []redisstore.WindowOp{{ID: "k", Win: 1, N: 1}}
		}},
		{"mark of another shard", func(t *redisstore.WindowTrip) {
			t.Shards, t.Shard = 64, (wire.WindowMarksShard("k", 64)+1)%64
			t.Marks, t.Memory, t.At = []redisstore.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: 1}}, time.Second, time.Now()
		}},
		{"width too large", func(t *redisstore.WindowTrip) { t.Width = 1 << 21 }},
		{"too many ops", func(t *redisstore.WindowTrip) { t.Ops = make([]redisstore.WindowOp, redisstore.MaxWindowOps+1) }},
		{"bad id", func(t *redisstore.WindowTrip) { t.Ops = []redisstore.WindowOp{{ID: "{x", Win: 1, N: 1}} }},
		{"negative window", func(t *redisstore.WindowTrip) { t.Ops = []redisstore.WindowOp{{ID: "k", Win: -1, N: 1}} }},
		{"count too large", func(t *redisstore.WindowTrip) {
			t.Ops = []redisstore.WindowOp{{ID: "k", Win: 1, N: redisstore.MaxWindowBurst + 1}}
		}},
		{"mark without flags", func(t *redisstore.WindowTrip) {
			t.Marks, t.Memory, t.At = []redisstore.WindowMark{{ID: "k", Win: 1}}, time.Second, time.Now()
		}},
		{"mark with unknown flags", func(t *redisstore.WindowTrip) {
			t.Marks, t.Memory, t.At = []redisstore.WindowMark{{ID: "k", Flags: 8, Win: 1}}, time.Second, time.Now()
		}},
		{"marks without memory", func(t *redisstore.WindowTrip) {
			t.Marks, t.At = []redisstore.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: 1}}, time.Now()
		}},
		{"read without memory", func(t *redisstore.WindowTrip) { t.Read = true }},
		{"tidy without At", func(t *redisstore.WindowTrip) { t.Tidy, t.Memory = true, time.Second }},
		{"marks without At", func(t *redisstore.WindowTrip) {
			t.Marks, t.Memory = []redisstore.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: 1}}, time.Second
		}},
	}
	for _, tt := range tests {
		trip := ok
		tt.edit(&trip)
		if err := s.Windows(context.Background(), &trip); !errors.Is(err, storeerr.ErrInvalidLimit) {
			t.Errorf("%s: %v, want ErrInvalidLimit", tt.name, err)
		}
	}
	if n := ctr.Cmds.Load(); n != 0 {
		t.Errorf("%d commands sent for invalid trips", n)
	}
	if err := s.Windows(context.Background(), &ok); err != nil {
		t.Errorf("valid empty trip: %v", err)
	}
}

// TestWindowsCluster: every array of a limit and its marks share one slot, so a server's
// round trip for a limit reaches one node.
func TestWindowsCluster(t *testing.T) {
	c := redistest.Cluster(t, func(o *redis.ClusterOptions) {
		o.MaxRedirects = -1
		o.MaxRetries = -1
	})
	ctx := context.Background()
	s := newStore(t, c)
	lim := winLimit(t)
	trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Clock: true, Read: true, Memory: time.Minute, At: time.Now(),
		Marks: []redisstore.WindowMark{{ID: "a", Flags: wire.MarkLow, Win: 3}}}
	for i := range 50 {
		trip.Ops = append(trip.Ops, redisstore.WindowOp{ID: redisstore.KeyID("k" + strconv.Itoa(i)), Win: int64(3 + i%3), N: 1})
	}
	if err := s.Windows(ctx, &trip); err != nil {
		t.Fatal(err)
	}
	for i, op := range trip.Ops {
		if op.Count != 1 {
			t.Fatalf("op %d: count %d, want 1", i, op.Count)
		}
	}
	if len(trip.Got) != 1 || trip.Got[0].ID != "a" {
		t.Fatalf("marks read %v, want a's", trip.Got)
	}
	w := wire.WindowMicros(lim.Rate, lim.Burst)
	slot := func(key string) int64 { return c.ClusterKeySlot(ctx, key).Val() }
	want := slot(wire.MarksKey(redisstore.DefaultPrefix, lim.Name, 1, 0))
	for win := int64(3); win < 6; win++ {
		if got := slot(wire.WindowKey(redisstore.DefaultPrefix, lim.Name, 1, 0, w, win)); got != want {
			t.Errorf("window %d in slot %d, the marks in %d", win, got, want)
		}
	}
}

// TestWindowsAfterRestart: a redis-server that restarts loses the arrays with their
// deadlines; the first trip after it, whether or not the client saw the restart as an
// error and whether or not it asks Redis's time, makes the array again with a deadline,
// and so does one after a FLUSHALL; the set of marks too.
func TestWindowsAfterRestart(t *testing.T) {
	srv := redistest.StartServer(t)
	c := srv.Client()
	ctx := context.Background()
	s := newStore(t, c)
	lim := hourLimit(t, 50)
	win := nowWin(lim)
	key := wire.WindowKey(redisstore.DefaultPrefix, lim.Name, 1, 0, wire.WindowMicros(lim.Rate, lim.Burst), win)
	trip := func(clock bool) error {
		return s.Windows(ctx, &redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Clock: clock, Ops: []redisstore.WindowOp{{ID: "k", Win: win, N: 1}}})
	}
	if err := trip(false); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	deadline := time.Now().Add(5 * time.Second)
	for trip(false) != nil { // the first may fail on a connection the restart closed
		if time.Now().After(deadline) {
			t.Fatal("Redis did not come back")
		}
	}
	if d := c.PTTL(ctx, key).Val(); d <= 0 {
		t.Fatalf("array made again after the restart: TTL %v, want a deadline", d)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	marks := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Memory: time.Minute, At: time.Now(),
		Marks: []redisstore.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: win}}}
	if err := s.Windows(ctx, &marks); err != nil {
		t.Fatal(err)
	}
	if err := trip(false); err != nil {
		t.Fatal(err)
	}
	keys, err := c.Keys(ctx, "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 {
		t.Errorf("after a FLUSHALL, a trip of marks and one of counts made %q, want the set and the array", keys)
	}
	for _, k := range keys {
		if d := c.PTTL(ctx, k).Val(); d <= 0 {
			t.Errorf("%s made again after a FLUSHALL: TTL %v, want a deadline", k, d)
		}
	}
}

// TestWindowsIsOneTransaction: a trip's writes and their deadlines go in one MULTI/EXEC,
// so that no fault between two of its commands (a killed connection, a stopped Redis)
// can leave an array or the marks without a deadline.
func TestWindowsIsOneTransaction(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		var sent txLog
		tg.Client.AddHook(&sent)
		s := newStore(t, tg.Client)
		lim := winLimit(t)
		win := nowWin(lim)
		at := time.Now()
		trip := redisstore.WindowTrip{Limit: lim, Width: 1 << 8, Clock: true, At: at, Memory: time.Second, Tidy: true, Read: true,
			Ops:   []redisstore.WindowOp{{ID: "a", Win: win, N: 1}, {ID: "b", Win: win + 1, N: 1}},
			Marks: []redisstore.WindowMark{{ID: "a", Flags: wire.MarkLow, Win: win}}}
		if err := s.Windows(ctx, &trip); err != nil {
			t.Fatal(err)
		}
		got := sent.names() // and the connection's own set-up (CLIENT SETINFO), before
		i, j := slices.Index(got, "multi"), slices.Index(got, "exec")
		if i < 0 || j < i || slices.Contains(got[j+1:], "multi") {
			t.Fatalf("commands sent %v, want one MULTI ... EXEC", got)
		}
		for _, name := range []string{"bitfield", "pexpireat", "zadd", "pexpire"} {
			if !slices.Contains(got[i:j], name) || slices.Contains(got[:i], name) || slices.Contains(got[j:], name) {
				t.Errorf("commands sent %v, want %s inside MULTI ... EXEC only", got, name)
			}
		}
	})
}

// txLog is a go-redis hook that records the names of the commands of the pipelines sent.
type txLog struct {
	mu   sync.Mutex
	sent []string
}

func (l *txLog) names() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.sent)
}

func (l *txLog) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l *txLog) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (l *txLog) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		l.mu.Lock()
		for _, c := range cmds {
			l.sent = append(l.sent, c.Name())
		}
		l.mu.Unlock()
		return next(ctx, cmds)
	}
}

// shardTrips returns a trip per shard of 64 for lim, with one op of n in window now for
// each of keys k0..k199 (each in its own shard's trip) and a mark of k0, reading every
// shard's marks.
func shardTrips(lim redisstore.Limit, now int64, n int) []redisstore.WindowTrip {
	const shards = wire.WindowShards
	ts := make([]redisstore.WindowTrip, shards)
	for i := range ts {
		ts[i] = redisstore.WindowTrip{Limit: lim, Width: 1 << 4, Shards: shards, Shard: i, Read: true, Memory: time.Minute, At: time.Now()}
	}
	ts[0].Clock = true
	for k := range 200 {
		id := redisstore.KeyID("k" + strconv.Itoa(k))
		x := &ts[wire.WindowShard(string(id), shards)]
		x.Ops = append(x.Ops, redisstore.WindowOp{ID: id, Win: now, N: n})
		if k == 0 {
			m := &ts[wire.WindowMarksShard(string(id), shards)]
			m.Marks = append(m.Marks, redisstore.WindowMark{ID: id, Flags: wire.MarkLow, Win: now})
		}
	}
	return ts
}

// checkShards runs shardTrips twice through WindowsBatch and checks each key's count
// (its own, in its shard's array), that the mark is read back from its shard alone, and
// where every key went: its shard's tag, at the shard's slot, with a deadline.
func checkShards(t *testing.T, s *redisstore.Store, c redis.UniversalClient, lim redisstore.Limit) {
	ctx := context.Background()
	now := nowWin(lim) // both rounds count in one window, whenever the next one starts
	for round := 1; round <= 2; round++ {
		ts := shardTrips(lim, now, 2)
		errs := make([]error, len(ts))
		if err := s.WindowsBatch(ctx, ts, errs); err != nil {
			t.Fatal(err)
		}
		marks := 0
		for i, x := range ts {
			for _, op := range x.Ops {
				if op.Count < 2*round { // a collision only adds
					t.Fatalf("shard %d, %s: count %d after %d rounds of 2", i, op.ID, op.Count, round)
				}
			}
			for _, m := range x.Got {
				if m.ID != "k0" || wire.WindowMarksShard("k0", wire.WindowShards) != i {
					t.Errorf("shard %d read mark %+v", i, m)
				}
				marks++
			}
		}
		if marks != 1 || ts[0].Now.IsZero() {
			t.Fatalf("round %d: %d marks read, want 1; Redis's time %v", round, marks, ts[0].Now)
		}
	}
	w := wire.WindowMicros(lim.Rate, lim.Burst)
	for i := range wire.WindowShards {
		key := wire.WindowKey(redisstore.DefaultPrefix, lim.Name, wire.WindowShards, i, w, nowWin(lim))
		if want := (wire.Slot(lim.Name) + i*wire.Slots/wire.WindowShards) % wire.Slots; wire.Slot(key) != want {
			t.Errorf("%s: slot %d, want %d", key, wire.Slot(key), want)
		}
		d, err := c.PTTL(ctx, key).Result()
		if err != nil || d == -1 {
			t.Errorf("%s: TTL %v, %v", key, d, err)
		}
	}
}

// TestWindowsShards: a limit counted in 64 shards keeps each shard's arrays and marks
// under the shard's tag, and WindowsBatch makes every shard's transaction in one call.
func TestWindowsShards(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		checkShards(t, newStore(t, tg.Client), tg.Client, winLimit(t))
	})
}

// TestWindowsShardsCluster: on a Cluster, each shard is a transaction on the node of its
// slot, the shards of a limit land on every master, and a batch of the 64 costs each
// master one round trip, in RESP2 as in RESP3; a round trip per shard on a client that
// retries.
func TestWindowsShardsCluster(t *testing.T) {
	for _, tc := range []struct {
		name    string
		proto   int
		retries int // ClusterOptions.MaxRetries
		perTrip bool
	}{
		{"RESP2", 2, -1, false},
		{"RESP3", 3, -1, false},
		// A client that retries would send a node's pipeline again after a lost reply,
		// its transactions with it: each trip is a Cluster transaction of its own.
		{"retrying client", 3, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := redistest.Cluster(t, func(o *redis.ClusterOptions) {
				o.MaxRedirects = -1
				o.MaxRetries = tc.retries
				o.Protocol = tc.proto
			})
			ctx := context.Background()
			var opts []redisstore.Option
			if tc.retries >= 0 {
				opts = append(opts, redisstore.RetryingClient())
			}
			st := newStore(t, c, opts...) // before the hooks: it may load scripts
			calls := map[string]*pipeCount{}
			var mu sync.Mutex // ForEachMaster calls at once
			if err := c.ForEachMaster(ctx, func(_ context.Context, m *redis.Client) error {
				pc := &pipeCount{}
				m.AddHook(pc)
				mu.Lock()
				calls[m.Options().Addr] = pc
				mu.Unlock()
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			lim := winLimit(t)
			checkShards(t, st, c, lim)
			nodes := map[string]int{}
			for i := range wire.WindowShards {
				n, err := c.MasterForKey(ctx, wire.MarksKey(redisstore.DefaultPrefix, lim.Name, wire.WindowShards, i))
				if err != nil {
					t.Fatal(err)
				}
				nodes[n.Options().Addr]++
			}
			if masters := c.ClusterShards(ctx).Val(); len(nodes) != len(masters) {
				t.Errorf("%d shards on %d nodes of %d", wire.WindowShards, len(nodes), len(masters))
			}
			// checkShards made two batches of the shards' trips.
			for addr, shards := range nodes {
				pc := calls[addr]
				if pc == nil {
					t.Fatalf("no hook on master %s", addr)
				}
				pc.mu.Lock()
				pipes, multis := pc.pipes, pc.multis
				pc.mu.Unlock()
				want := 2 // a round trip per master and batch
				if tc.perTrip {
					want = 2 * shards
				}
				if pipes != want || multis != 2*shards {
					t.Errorf("master %s, %d shards: %d round trips and %d transactions for two batches, want %d and %d", addr, shards, pipes, multis, want, 2*shards)
				}
			}
		})
	}
}

// pipeCount is a go-redis hook that counts a node's pipelines of transactions, and the
// transactions (MULTI) in them.
type pipeCount struct {
	mu            sync.Mutex
	pipes, multis int
}

func (h *pipeCount) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *pipeCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *pipeCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		multis := 0
		for _, c := range cmds {
			if c.Name() == "multi" {
				multis++
			}
		}
		if multis > 0 { // not a new connection's handshake
			h.mu.Lock()
			h.pipes++
			h.multis += multis
			h.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// TestShardWidth: a shard's array is the limit's width over its shards rounded down to
// a power of two (a key's counter is its hash masked), never below MinWindowWidth.
func TestShardWidth(t *testing.T) {
	for _, tc := range []struct{ width, shards, want int }{
		{1 << 18, 1, 1 << 18},
		{1 << 18, 0, 1 << 18},
		{1 << 18, 64, 1 << 12},
		{1 << 18, 60, 1 << 12},
		{1 << 18, 48, 1 << 12},
		{1 << 10, 60, redisstore.MinWindowWidth},
		{1 << 8, 1000, redisstore.MinWindowWidth},
	} {
		if got := redisstore.ShardWidth(tc.width, tc.shards); got != tc.want {
			t.Errorf("ShardWidth(%d, %d) = %d, want %d", tc.width, tc.shards, got, tc.want)
		}
	}
}

// TestWindowsOneTripFailsAlone: on one Redis every limit's trip goes in one transaction;
// a command of one that fails as EXEC runs it (its marks key is not a sorted set:
// WRONGTYPE) fails that trip alone. The others ran: each answers its counts, and they
// are counted once a round, never again as if they had not run.
func TestWindowsOneTripFailsAlone(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		good, bad := hourLimit(t, 100), hourLimit(t, 100)
		good.Name += "g"
		bad.Name += "b"
		id := redisstore.IDOf("alice")
		if err := tg.Client.Set(ctx, wire.MarksKey(redisstore.DefaultPrefix, bad.Name, 1, 0), "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tg.Client.Del(context.Background(), wire.MarksKey(redisstore.DefaultPrefix, bad.Name, 1, 0)) })
		win := nowWin(good)
		for round := 1; round <= 3; round++ {
			ts := []redisstore.WindowTrip{
				{Limit: good, Width: 1 << 10, Ops: []redisstore.WindowOp{{ID: id, Win: win, N: 5}}},
				{Limit: bad, Width: 1 << 10, Ops: []redisstore.WindowOp{{ID: id, Win: nowWin(bad), N: 1}},
					Marks: []redisstore.WindowMark{{ID: id, Flags: wire.MarkLow, Win: nowWin(bad)}}, At: time.Now(), Memory: time.Second},
			}
			errs := make([]error, 2)
			_ = s.WindowsBatch(ctx, ts, errs)
			if errs[0] != nil || ts[0].Ops[0].Count != 5*round {
				t.Fatalf("round %d: the good trip answered %v, count %d; want its count, %d", round, errs[0], ts[0].Ops[0].Count, 5*round)
			}
			if errs[1] == nil || !strings.Contains(errs[1].Error(), "WRONGTYPE") {
				t.Fatalf("round %d: the bad trip answered %v; want WRONGTYPE", round, errs[1])
			}
		}
	})
}
