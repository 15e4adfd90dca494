package global_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/global"
	"github.com/fleetlimit/fleetlimit/internal/redistest"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// winLimit is a windowed limit of 50 per second: windows of 1 s.
func winLimit(t testing.TB) global.Limit {
	return global.Limit{Name: lname(t), Rate: 50, Burst: 50}
}

// nowWin is the index of lim's window of phase 0 now: an array of a window long past
// would be deleted by its own deadline.
func nowWin(lim global.Limit) int64 {
	return time.Now().UnixMicro() / wire.WindowMicros(lim.Rate, lim.Burst)
}

func TestWindowsCounts(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		s := newStore(t, tg.Client)
		lim := winLimit(t)
		a, b := global.IDOf("alice"), global.IDOf("bob")
		now := nowWin(lim)
		trip := global.WindowTrip{Limit: lim, Width: 1 << 10, Clock: true, Ops: []global.WindowOp{
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
			key := wire.WindowKey(global.DefaultPrefix, lim.Name, w, win)
			if tg.Mini != nil { // miniredis has no PEXPIRETIME
				continue
			}
			at, err := tg.Client.PExpireTime(ctx, key).Result()
			if want := time.Duration(win+3) * time.Second; err != nil || at != want {
				t.Errorf("%s: deadline %v, %v; want %v since 1970", key, at, err, want)
			}
		}
		// A window long past: its deadline has passed, and the array is gone at once.
		old := global.WindowTrip{Limit: lim, Width: 1 << 10, Ops: []global.WindowOp{{ID: a, Win: 100, N: 1}}}
		if err := s.Windows(ctx, &old); err != nil {
			t.Fatal(err)
		}
		if n := tg.Client.Exists(ctx, wire.WindowKey(global.DefaultPrefix, lim.Name, w, 100)).Val(); n != 0 {
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
		key := wire.WindowKey(global.DefaultPrefix, lim.Name, w, win)
		trip := func(win int64) error {
			return s.Windows(ctx, &global.WindowTrip{Limit: lim, Width: 1 << 8, Ops: []global.WindowOp{{ID: "k", Win: win, N: 1}}})
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
		if d := ttl(wire.WindowKey(global.DefaultPrefix, lim.Name, w, old)); d != -2*time.Nanosecond && d != -2*time.Millisecond {
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
		send := func(s *global.Store, at time.Time, marks ...global.WindowMark) {
			t.Helper()
			if err := s.Windows(ctx, &global.WindowTrip{Limit: lim, Width: 1 << 8, Marks: marks, Memory: mem, At: at, Tidy: true}); err != nil {
				t.Fatal(err)
			}
		}
		read := func(since time.Time) []global.WindowMark {
			t.Helper()
			r := global.WindowTrip{Limit: lim, Width: 1 << 8, Read: true, Since: since, Memory: mem}
			if err := s2.Windows(ctx, &r); err != nil {
				t.Fatal(err)
			}
			return r.Got
		}
		if got := read(time.Time{}); len(got) != 0 {
			t.Fatalf("read of no marks: %v", got)
		}
		long := global.IDOf(string(make([]byte, 100))) // a digest ID
		send(s1, t0, global.WindowMark{ID: "alice", Flags: wire.MarkLow, Win: 7}, global.WindowMark{ID: long, Flags: wire.MarkSpent | wire.MarkOver, Win: 8})
		send(s1, t0.Add(10*time.Millisecond), global.WindowMark{ID: "bob", Flags: wire.MarkOver, Win: 9})
		// another server marks alice alike: one member, recorded later
		send(s2, t0.Add(20*time.Millisecond), global.WindowMark{ID: "alice", Flags: wire.MarkLow, Win: 7})
		got := read(time.Time{})
		want := []global.WindowMark{
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
		// A mark older than the memory is dropped by a tidy trip.
		send(s1, t0.Add(mem+15*time.Millisecond), global.WindowMark{ID: "carol", Flags: wire.MarkLow, Win: 10})
		if got := read(time.Time{}); len(got) != 2 || got[0].ID != "alice" || got[1].ID != "carol" {
			t.Errorf("after the trim: %v, want alice's and carol's marks", got)
		}
		key := wire.MarksKey(global.DefaultPrefix, lim.Name)
		ttl := tg.Client.PTTL(ctx, key).Val()
		if tg.Mini != nil {
			ttl = tg.Mini.TTL(key)
		}
		if ttl <= mem-5*time.Second || ttl > mem {
			t.Errorf("marks' TTL %v, want about %v", ttl, mem)
		}
	})
}

// TestWindowsConcurrent: BITFIELD INCRBY is atomic, so concurrent trips of many servers
// each see a count of their own: 16 servers adding 1 at a time to one key see every
// count from 1 to 3,200 exactly once.
func TestWindowsConcurrent(t *testing.T) {
	redistest.Run(t, func(t *testing.T, tg redistest.Target) {
		ctx := context.Background()
		lim := global.Limit{Name: lname(t), Rate: 1e4, Burst: 10000}
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
					trip := global.WindowTrip{Limit: lim, Width: 1 << 8, Ops: []global.WindowOp{{ID: "k", Win: win, N: 1}}}
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
			lim := global.Limit{Name: lname(t), Rate: 1, Burst: tc.burst}
			win := nowWin(lim)
			trip := global.WindowTrip{Limit: lim, Width: 1 << 8, Ops: []global.WindowOp{
				{ID: "k", Win: win, N: tc.top - 1}, {ID: "k", Win: win, N: 5}, {ID: "k", Win: win, N: -tc.top}, {ID: "k", Win: win, N: -1}}}
			if tc.top > global.MaxWindowBurst { // one op may not carry that much
				op := global.WindowOp{ID: "k", Win: win, N: global.MaxWindowBurst}
				trip.Ops = []global.WindowOp{op, op, op, op, op}
			}
			if err := s.Windows(ctx, &trip); err != nil {
				t.Fatal(err)
			}
			if got := trip.Ops[len(trip.Ops)-1].Count; tc.top < global.MaxWindowBurst && (trip.Ops[1].Count != tc.top || got != 0) {
				t.Errorf("burst %d: counts %+v, want the top %d then 0", tc.burst, trip.Ops, tc.top)
			} else if tc.top > global.MaxWindowBurst && got != tc.top {
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
	lim := global.Limit{Name: "api", Rate: 50, Burst: 50}
	ok := global.WindowTrip{Limit: lim, Width: 1 << 8}
	tests := []struct {
		name string
		edit func(*global.WindowTrip)
	}{
		{"bad limit", func(t *global.WindowTrip) { t.Limit.Rate = 0 }},
		{"burst too large", func(t *global.WindowTrip) { t.Limit.Burst = global.MaxWindowBurst + 1 }},
		{"width not a power of two", func(t *global.WindowTrip) { t.Width = 1000 }},
		{"width too small", func(t *global.WindowTrip) { t.Width = 128 }},
		{"width too large", func(t *global.WindowTrip) { t.Width = 1 << 21 }},
		{"too many ops", func(t *global.WindowTrip) { t.Ops = make([]global.WindowOp, global.MaxWindowOps+1) }},
		{"bad id", func(t *global.WindowTrip) { t.Ops = []global.WindowOp{{ID: "{x", Win: 1, N: 1}} }},
		{"negative window", func(t *global.WindowTrip) { t.Ops = []global.WindowOp{{ID: "k", Win: -1, N: 1}} }},
		{"count too large", func(t *global.WindowTrip) { t.Ops = []global.WindowOp{{ID: "k", Win: 1, N: global.MaxWindowBurst + 1}} }},
		{"mark without flags", func(t *global.WindowTrip) {
			t.Marks, t.Memory, t.At = []global.WindowMark{{ID: "k", Win: 1}}, time.Second, time.Now()
		}},
		{"mark with unknown flags", func(t *global.WindowTrip) {
			t.Marks, t.Memory, t.At = []global.WindowMark{{ID: "k", Flags: 8, Win: 1}}, time.Second, time.Now()
		}},
		{"marks without memory", func(t *global.WindowTrip) {
			t.Marks, t.At = []global.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: 1}}, time.Now()
		}},
		{"read without memory", func(t *global.WindowTrip) { t.Read = true }},
		{"tidy without At", func(t *global.WindowTrip) { t.Tidy, t.Memory = true, time.Second }},
		{"marks without At", func(t *global.WindowTrip) {
			t.Marks, t.Memory = []global.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: 1}}, time.Second
		}},
	}
	for _, tt := range tests {
		trip := ok
		tt.edit(&trip)
		if err := s.Windows(context.Background(), &trip); !errors.Is(err, global.ErrInvalidLimit) {
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
	trip := global.WindowTrip{Limit: lim, Width: 1 << 8, Clock: true, Read: true, Memory: time.Minute, At: time.Now(),
		Marks: []global.WindowMark{{ID: "a", Flags: wire.MarkLow, Win: 3}}}
	for i := range 50 {
		trip.Ops = append(trip.Ops, global.WindowOp{ID: global.KeyID("k" + strconv.Itoa(i)), Win: int64(3 + i%3), N: 1})
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
	want := slot(wire.MarksKey(global.DefaultPrefix, lim.Name))
	for win := int64(3); win < 6; win++ {
		if got := slot(wire.WindowKey(global.DefaultPrefix, lim.Name, w, win)); got != want {
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
	lim := winLimit(t)
	win := nowWin(lim)
	key := wire.WindowKey(global.DefaultPrefix, lim.Name, wire.WindowMicros(lim.Rate, lim.Burst), win)
	trip := func(clock bool) error {
		return s.Windows(ctx, &global.WindowTrip{Limit: lim, Width: 1 << 8, Clock: clock, Ops: []global.WindowOp{{ID: "k", Win: win, N: 1}}})
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
	marks := global.WindowTrip{Limit: lim, Width: 1 << 8, Memory: time.Minute, At: time.Now(),
		Marks: []global.WindowMark{{ID: "k", Flags: wire.MarkLow, Win: win}}}
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
