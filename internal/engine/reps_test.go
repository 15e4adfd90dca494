package engine

import (
	"testing"
	"time"

	"github.com/fleetlimit/fleetlimit/breaker"
)

// TestRepMembers: a member names the limit and where its keys are counted (the bucket
// kinds share one identity, whatever their rate; a windowed limit's is its window), and
// carries what a companion is made of; a member this release cannot read is none.
func TestRepMembers(t *testing.T) {
	win := LimitConfig{Name: "api", Rate: 10, Burst: 5, Windowed: 100 * time.Millisecond}
	for _, tc := range []struct {
		c      LimitConfig
		member string
		id     string
	}{
		{LimitConfig{Name: "api", Rate: 100, Burst: 20}, "api bucket 100 20", "api bucket"},
		{LimitConfig{Name: "api", Rate: 0.5, Burst: 3, Async: 100 * time.Millisecond}, "api bucket 0.5 3", "api bucket"},
		{win, "api windowed 500000 10 5 100000 0", "api windowed 500000 1"},
		{LimitConfig{Name: "api", Rate: 10, Burst: 5, Windowed: 100 * time.Millisecond, WindowShards: 64}, "api windowed 500000 10 5 100000 0 64", "api windowed 500000 64"},
		{LimitConfig{Name: "api", Rate: 20, Burst: 10, Windowed: 50 * time.Millisecond, WindowWidth: 1024, WindowShards: 16}, "api windowed 500000 20 10 50000 1024 16", "api windowed 500000 16"},
		// one shard: the unsharded format, whose release writes no shards and reads this
		{LimitConfig{Name: "api", Rate: 20, Burst: 10, Windowed: 50 * time.Millisecond, WindowWidth: 1024, WindowShards: 1}, "api windowed 500000 20 10 50000 1024", "api windowed 500000 1"},
	} {
		if m := repOf(tc.c); m != tc.member {
			t.Errorf("repOf(%+v) = %q, want %q", tc.c, m, tc.member)
		}
		if id, ok := repIdentity(tc.member); !ok || id != tc.id {
			t.Errorf("repIdentity(%q) = %q, %v; want %q", tc.member, id, ok, tc.id)
		}
		c, err := repConfig(LimitConfig{Name: "api", MaxWait: 7 * time.Millisecond, Policy: breaker.FailOpen}, tc.member)
		if err != nil {
			t.Fatalf("repConfig(%q): %v", tc.member, err)
		}
		if c.Rate != tc.c.Rate || c.Burst != tc.c.Burst || c.Windowed != tc.c.Windowed || c.WindowWidth != tc.c.WindowWidth ||
			max(c.WindowShards, 1) != max(tc.c.WindowShards, 1) || c.Async != 0 || c.MaxWait != 7*time.Millisecond {
			t.Errorf("repConfig(%q) = %+v: want %+v's rate, burst and window, no Async, the limit's MaxWait", tc.member, c, tc.c)
		}
	}
	for _, m := range []string{"", "api", "api bucket 1", "api tree 1 2", "api windowed 1 2 3", "api bucket x 2", "api windowed 500000 10 five 100000 0", "api windowed 500000 10 5 100000 0 x",
		"api windowed 500000 10 5 100000 0 1"} {
		if _, err := repConfig(win, m); err == nil {
			t.Errorf("repConfig(%q) made a companion", m)
		}
	}
}

// TestCompanions: a limit gets a companion for each other live representation of it in
// the record (one per representation, whatever the members), none for its own or another
// limit's, and loses it once the record no longer holds it; a request of the limit is
// then decided on both (Multi), and a companion's denial denies it, reported on the
// limit's own item. Companions are not among Limits.
func TestCompanions(t *testing.T) {
	e, api := testEngine(t, func(c *Config) {
		c.Limits = append(c.Limits, LimitConfig{Name: "other", Rate: 10, Burst: 10, Policy: breaker.FailClosed})
	})
	read := func(got ...string) {
		t.Helper()
		e.mu.Lock()
		e.repsDue = true
		e.mu.Unlock()
		trip := e.Next()
		if trip == nil || trip.Kind != HeartbeatTrip || len(trip.Reps) != 2 || trip.Reps[0] != "api bucket 100 100" {
			t.Fatalf("trip %+v, want the record of both limits", trip)
		}
		trip.RepsGot, trip.Answered = got, true
		e.Done(t0, trip)
	}
	read("api bucket 100 100", "api bucket 50 10", "other windowed 1000000 10 10 100000 0",
		"api windowed 500000 10 5 100000 0", "api windowed 500000 20 10 50000 0", "api unknown 1 2 3", "garbage")
	comps := api.Companions()
	if len(comps) != 1 || comps[0].Window() != 500*time.Millisecond || comps[0].Name() != "api" {
		t.Fatalf("companions of api: %v, want one windowed, of 500ms", comps)
	}
	if len(e.Limit("other").Companions()) != 1 {
		t.Fatalf("other has %d companions, want its windowed one", len(e.Limit("other").Companions()))
	}
	if n := len(e.Limits()); n != 2 || e.Limit("api") != api {
		t.Fatalf("Limits has %d, Limit(api) %p; want the two configured, api itself", n, e.Limit("api"))
	}
	first := comps[0]
	read("api bucket 100 100", "api windowed 500000 10 5 100000 0")
	if c := api.Companions(); len(c) != 1 || c[0] != first {
		t.Fatalf("the same representation read again made a new companion: %v", c)
	}
	if len(e.Limit("other").Companions()) != 0 {
		t.Fatal("other kept a companion the record no longer holds")
	}

	// The windowed companion admits its burst of 5 for a key and then denies: the
	// sixth request is denied on api's item, and api admits no more than it.
	var m Multi
	admitted := 0
	for range 8 {
		m = Multi{}
		m.Add(MultiItem{Limit: api, Key: "k", N: 1})
		w, done := e.StartMulti(t0.UnixNano(), &m)
		for !done {
			trip := e.Next()
			answerAll(trip)
			e.Done(t0, trip)
			w, done = e.ResumeMulti(t0.UnixNano(), &m, w.Decision())
		}
		if m.Allowed {
			admitted++
		}
	}
	if admitted != 5 || m.Allowed || m.Denied != 0 || m.Item != 0 {
		t.Fatalf("%d of 8 admitted, last %+v; want 5, then denied on item 0", admitted, m)
	}
	if _, _, _, allowed := lmState(api); allowed != 5 {
		t.Errorf("api counts %d admissions, want the 5 its companion admitted too", allowed)
	}

	read("api bucket 100 100")
	if len(api.Companions()) != 0 || len(e.limits.Load().list) != 2 {
		t.Fatalf("companions left once the record holds api's own alone: %v", api.Companions())
	}
}

// TestCompanionKeepsItsOwnCounts: a windowed limit's bucket companion (the fleet's
// servers still on the bucket) owes and refunds its own bucket: its FailLocal debt and
// its lease's refunds are counted on it once Redis answers them, not on the windowed
// limit, which leased and owed nothing (its Owed went to -1 by a name lookup).
func TestCompanionKeepsItsOwnCounts(t *testing.T) {
	open := false
	e, api := testEngine(t, func(c *Config) {
		c.Limits[0] = LimitConfig{Name: "api", Rate: 10, Burst: 10, Policy: breaker.FailLocal(), Windowed: 100 * time.Millisecond}
		c.BreakerOpen = func() bool { return open }
	})
	e.mu.Lock()
	e.repsDue = true
	e.mu.Unlock()
	trip := e.Next()
	trip.RepsGot, trip.Answered = append(trip.Reps, "api bucket 10 10"), true
	e.Done(t0, trip)
	comps := api.Companions()
	if len(comps) != 1 {
		t.Fatalf("companions of api: %v, want its bucket", comps)
	}
	comp := comps[0]
	e.Tick(t0)
	// Redis grants the companion's refill 5 (4 left to refund), then its breaker opens:
	// FailLocal admits a new key and owes the companion's bucket.
	leased(t, e, comp, "", "k", 5, t0)
	comp.keys.Remove("k") // let go: its 4 tokens left go back
	open = true
	if d, _ := decide(e, t0.Add(time.Millisecond), comp, "j", 1); !d.Allowed || d.Source != SourceFallback {
		t.Fatalf("a new key behind an open breaker: %+v, want FailLocal's admission", d)
	}
	open = false
	now := t0.Add(time.Millisecond)
	for range 400 { // the refund goes, and the debt once Redis answers
		now = now.Add(10 * time.Millisecond)
		e.Tick(now)
		sendAll(e, now)
	}
	ps, cs := e.StatsOf(api), comp.Stats()
	if ps.Owed != 0 || ps.Charged != 0 || ps.Granted != 0 || ps.Refunded != 0 {
		t.Errorf("api (windowed): owed %d, charged %d, granted %d, refunded %d; want none", ps.Owed, ps.Charged, ps.Granted, ps.Refunded)
	}
	if cs.Owed != 0 || cs.Charged != 1 || cs.Granted != 5 || cs.Refunded != 4 {
		t.Errorf("companion (bucket): owed %d, charged %d, granted %d, refunded %d; want 0, 1, 5, 4", cs.Owed, cs.Charged, cs.Granted, cs.Refunded)
	}
}
