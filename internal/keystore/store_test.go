package keystore

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano()

func at(d time.Duration) int64 { return t0 + int64(d) }

type evicted struct {
	key    string
	val    int
	reason EvictReason
}

// newCountingStore returns a Store of ints whose OnEvict records what it is
// told and checks that the store is not locked while it runs.
func newCountingStore(t *testing.T, cfg StoreConfig[int]) (*Store[int], *[]evicted) {
	t.Helper()
	var (
		mu  sync.Mutex
		got []evicted
		s   *Store[int]
	)
	cfg.OnEvict = func(key string, v *int, reason EvictReason) {
		s.Len() // would deadlock if a shard lock were held
		mu.Lock()
		got = append(got, evicted{key, *v, reason})
		mu.Unlock()
	}
	s, err := NewStore(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, &got
}

func incr(s *Store[int], now int64, key string) int {
	var n int
	s.Update(now, key, func(v *int, _ int64) { *v++; n = *v })
	return n
}

func TestStoreLRU(t *testing.T) {
	s, ev := newCountingStore(t, StoreConfig[int]{MaxKeys: 3, Shards: 1})
	for _, k := range []string{"a", "b", "c"} {
		incr(s, at(0), k)
	}
	incr(s, at(0), "a") // "a" is now more recently used than "b"
	incr(s, at(0), "d") // evicts "b"
	incr(s, at(0), "e") // evicts "c"
	want := []evicted{{"b", 1, EvictCapacity}, {"c", 1, EvictCapacity}}
	if !slices.Equal(*ev, want) {
		t.Fatalf("evicted %v, want %v", *ev, want)
	}
	if got := incr(s, at(0), "a"); got != 3 {
		t.Errorf("a = %d after 3 updates, want 3 (kept)", got)
	}
	if got, c := s.Len(), s.Cap(); got != 3 || c != 3 {
		t.Errorf("Len, Cap = %d, %d, want 3, 3", got, c)
	}
}

func TestStoreIdle(t *testing.T) {
	s, ev := newCountingStore(t, StoreConfig[int]{MaxKeys: 10, Shards: 1, IdleTimeout: time.Second})
	incr(s, at(0), "a")
	incr(s, at(0), "b")
	if got := incr(s, at(999*time.Millisecond), "a"); got != 2 {
		t.Fatalf("a = %d before its idle timeout, want 2", got)
	}
	// "b" has been idle for 1 s: the insert of "c" sweeps it.
	incr(s, at(time.Second), "c")
	// "a" idle since 0.999 s: at 1.999 s it starts afresh.
	if got := incr(s, at(1999*time.Millisecond), "a"); got != 1 {
		t.Fatalf("a = %d after its idle timeout, want a fresh 1", got)
	}
	want := []evicted{{"b", 1, EvictIdle}, {"a", 2, EvictIdle}}
	if !slices.Equal(*ev, want) {
		t.Fatalf("evicted %v, want %v", *ev, want)
	}
	if n := s.Sweep(at(time.Hour), 0); n != 2 {
		t.Errorf("Sweep dropped %d, want 2", n)
	}
	s.SetIdleTimeout(0)
	incr(s, at(0), "x")
	if n := s.Sweep(at(1000*time.Hour), 0); n != 0 {
		t.Errorf("Sweep with idle expiry off dropped %d", n)
	}
}

// TestStoreTimeNeverBackwards: fn sees max(now, the key's latest instant).
func TestStoreTimeNeverBackwards(t *testing.T) {
	s, _ := newCountingStore(t, StoreConfig[int]{})
	for _, tt := range []struct{ now, want time.Duration }{
		{5 * time.Second, 5 * time.Second},
		{3 * time.Second, 5 * time.Second},
		{6 * time.Second, 6 * time.Second},
		{0, 6 * time.Second},
	} {
		var got int64
		s.Update(at(tt.now), "k", func(_ *int, now int64) { got = now })
		if got != at(tt.want) {
			t.Errorf("Update(t0+%v) saw t0+%v, want t0+%v", tt.now, time.Duration(got-t0), tt.want)
		}
	}
	var last int64
	if !s.Peek("k", func(_ *int, l int64) { last = l }) || last != at(6*time.Second) {
		t.Errorf("Peek saw last = %v", last)
	}
}

func TestStoreRemovePurgeClose(t *testing.T) {
	var inits []string
	s, ev := newCountingStore(t, StoreConfig[int]{
		Init: func(v *int, key string, _ int64) { *v = 10; inits = append(inits, key) },
	})
	incr(s, at(0), "a")
	incr(s, at(0), "a")
	incr(s, at(0), "b")
	if !slices.Equal(inits, []string{"a", "b"}) {
		t.Errorf("Init ran for %v, want once per new key", inits)
	}
	if !s.Remove("a") || s.Remove("a") || s.Remove("zzz") {
		t.Error("Remove reports presence wrongly")
	}
	if n := s.Purge(); n != 1 {
		t.Errorf("Purge dropped %d, want 1", n)
	}
	incr(s, at(0), "c")
	s.Close()
	s.Close()
	if s.Update(at(0), "d", func(*int, int64) { t.Error("fn ran on a closed store") }) {
		t.Error("Update on a closed store reported true")
	}
	want := []evicted{{"a", 12, EvictRemoved}, {"b", 11, EvictPurged}, {"c", 11, EvictPurged}}
	if !slices.Equal(*ev, want) {
		t.Fatalf("evicted %v, want %v", *ev, want)
	}
	if s.Len() != 0 {
		t.Errorf("closed store holds %d keys", s.Len())
	}
}

// TestStoreCallbackReentry: OnEvict may use the store, including adding the
// key it was told about.
func TestStoreCallbackReentry(t *testing.T) {
	var s *Store[int]
	readded := 0
	s, err := NewStore(StoreConfig[int]{MaxKeys: 1, OnEvict: func(key string, v *int, r EvictReason) {
		if r == EvictCapacity && readded < 3 {
			readded++
			s.Update(at(0), key, func(*int, int64) {})
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	incr(s, at(0), "a")
	incr(s, at(0), "b")
	if readded != 3 || s.Len() != 1 {
		t.Errorf("readded %d, len %d", readded, s.Len())
	}
}

// TestStoreKeyNotPinned: the store keeps a copy of a new key, in its entry or in an
// allocation of its own by the key's length, so a caller may reuse the key's buffer:
// here the key aliases a buffer that is overwritten once the key is held.
func TestStoreKeyNotPinned(t *testing.T) {
	for _, n := range []int{0, 1, inlineKey - 1, inlineKey, inlineKey + 1, 100} {
		t.Run(strconv.Itoa(n), func(t *testing.T) {
			var evicted []string
			s, err := NewStore(StoreConfig[int]{MaxKeys: 1, Shards: 1,
				OnEvict: func(key string, _ *int, _ EvictReason) { evicted = append(evicted, key) }})
			if err != nil {
				t.Fatal(err)
			}
			want := strings.Repeat("k", n)
			buf := []byte(want)
			key := unsafe.String(unsafe.SliceData(buf), len(buf)) // shares buf
			incr(s, at(0), key)
			for i := range buf {
				buf[i] = 'x'
			}
			if got := incr(s, at(0), want); got != 2 {
				t.Errorf("%q = %d after the caller's buffer changed, want 2", want, got)
			}
			s.Purge()
			if len(evicted) != 1 || evicted[0] != want {
				t.Errorf("evicted %q, want [%q]", evicted, want)
			}
		})
	}
}

func TestNewStoreInvalid(t *testing.T) {
	for _, cfg := range []StoreConfig[int]{
		{MaxKeys: -1}, {IdleTimeout: -1}, {Shards: -2},
	} {
		if _, err := NewStore(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("NewStore(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// TestNewStoreUpFront: what a Store makes before its first key is bounded whatever its
// cap: MaxKeys of math.MaxInt, meant as no cap, makes each shard's 4,096 tables (128
// KiB), not tables for its share of 2^63 keys. The bytes are the process's, which the
// runtime's own goroutines may add to: the least of three tries is NewStore's.
func TestNewStoreUpFront(t *testing.T) {
	for _, cfg := range []StoreConfig[int]{
		{MaxKeys: math.MaxInt, Shards: 1}, {MaxKeys: 1 << 40, Shards: 1}, {MaxKeys: math.MaxInt, Shards: 8},
	} {
		made := uint64(math.MaxUint64)
		var s *Store[int]
		for range 3 {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			var err error
			s, err = NewStore(cfg)
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			made = min(made, after.TotalAlloc-before.TotalAlloc)
		}
		limit := uint64(cfg.Shards) * (4096*uint64(unsafe.Sizeof(table[int]{})) + 4096)
		if made > limit {
			t.Errorf("NewStore(MaxKeys %d, %d shards) made %d bytes, want at most %d", cfg.MaxKeys, cfg.Shards, made, limit)
		}
		s.Update(0, "k", func(*int, int64) {})
		if s.Len() != 1 {
			t.Errorf("MaxKeys %d: %d keys held after one, want 1", cfg.MaxKeys, s.Len())
		}
	}
}

// TestShardCount: the shard count is the requested one rounded up to a power of two, or
// by default one near 4×GOMAXPROCS but with at least 64 keys a shard, and never more
// shards than keys (a power of two that is exactly MaxKeys is kept).
func TestShardCount(t *testing.T) {
	tests := []struct{ requested, maxKeys, want int }{
		{1, 100, 1}, {3, 100, 4}, {16, 10, 8}, {0, 1, 1}, {5, 5, 4}, {1 << 20, 1 << 30, 1 << 16},
		{4, 4, 4}, {8, 8, 8}, {1 << 16, 1 << 16, 1 << 16}, // exactly MaxKeys shards
		{0, 64, 1}, {0, 127, 1}, {0, 200, 4}, // by default, 64 keys a shard or more
	}
	for _, tt := range tests {
		if got := shardCount(tt.requested, tt.maxKeys); got != tt.want {
			t.Errorf("shardCount(%d, %d) = %d, want %d", tt.requested, tt.maxKeys, got, tt.want)
		}
	}
	// Whatever the split, the caps add up to MaxKeys.
	for _, maxKeys := range []int{1, 7, 100, 1000, 12345} {
		s, err := NewStore(StoreConfig[int]{MaxKeys: maxKeys, Shards: 16})
		if err != nil {
			t.Fatal(err)
		}
		if s.Cap() != maxKeys {
			t.Errorf("MaxKeys %d: Cap() = %d", maxKeys, s.Cap())
		}
	}
}

// TestStoreConcurrent hammers a small store from many goroutines; under
// -race it checks the locking, and it checks that the cap holds and that
// every key created is either held or was reported evicted.
func TestStoreConcurrent(t *testing.T) {
	var mu sync.Mutex
	evictions := 0
	s, err := NewStore(StoreConfig[int]{
		MaxKeys: 64, Shards: 4, IdleTimeout: 50 * time.Millisecond,
		Init:    func(v *int, _ string, _ int64) { *v = 1 },
		OnEvict: func(string, *int, EvictReason) { mu.Lock(); evictions++; mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	var created sync.Map
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 2000 {
				key := fmt.Sprintf("k%d", (g*7+i)%200)
				now := at(time.Duration(i) * time.Millisecond)
				s.Update(now, key, func(v *int, _ int64) {
					if *v == 1 {
						c, _ := created.LoadOrStore(key, new(int))
						mu.Lock()
						*c.(*int)++
						mu.Unlock()
					}
					*v = 2
				})
				if i%100 == 0 {
					s.Sweep(now, 5)
					s.Peek(key, func(*int, int64) {})
				}
				if s.Len() > 64 {
					t.Error("cap exceeded")
				}
			}
		})
	}
	wg.Wait()
	total := 0
	created.Range(func(_, v any) bool { total += *v.(*int); return true })
	if held := s.Len(); total != held+evictions {
		t.Errorf("created %d keys; %d held + %d evicted = %d", total, held, evictions, held+evictions)
	}
	s.Close()
	if total != evictions {
		t.Errorf("after Close: created %d, evicted %d", total, evictions)
	}
}

// TestStoreUpdatePanic: a panicking fn leaves the store usable.
func TestStoreUpdatePanic(t *testing.T) {
	s, _ := newCountingStore(t, StoreConfig[int]{Shards: 1})
	func() {
		defer func() { recover() }()
		s.Update(at(0), "a", func(*int, int64) { panic("boom") })
	}()
	if got := incr(s, at(0), "a"); got != 1 {
		t.Errorf("a = %d after a panicking update, want 1", got)
	}
}

// TestStoreSweepUsedIdle: a key used more than once and then left idle is
// swept like any other, though its use marked it for promotion.
func TestStoreSweepUsedIdle(t *testing.T) {
	s, ev := newCountingStore(t, StoreConfig[int]{Shards: 1, IdleTimeout: time.Second})
	incr(s, at(0), "old")
	incr(s, at(0), "old") // used: due a promotion
	incr(s, at(900*time.Millisecond), "recent")
	incr(s, at(900*time.Millisecond), "recent")
	if n := s.Sweep(at(1500*time.Millisecond), 0); n != 1 || s.Len() != 1 {
		t.Fatalf("Sweep dropped %d, %d left; want 1 and 1 (evicted %v)", n, s.Len(), *ev)
	}
	if got := incr(s, at(1500*time.Millisecond), "recent"); got != 3 {
		t.Errorf("recent = %d, want it kept (3)", got)
	}
}

// TestStoreIdleBoundary: a key idle for exactly IdleTimeout is gone for Inspect as for
// Update (which starts it afresh); one a nanosecond short of it is held by both.
func TestStoreIdleBoundary(t *testing.T) {
	for _, tc := range []struct {
		idle time.Duration // since the key's last use
		held bool
	}{
		{time.Second - 1, true}, {time.Second, false}, {time.Second + 1, false},
	} {
		s, _ := newCountingStore(t, StoreConfig[int]{Shards: 1, IdleTimeout: time.Second})
		incr(s, at(0), "k")
		found := false
		s.Inspect("k", at(tc.idle), func(e *Entry[int]) { found = e != nil })
		kept := incr(s, at(tc.idle), "k") == 2
		if found != tc.held || kept != tc.held {
			t.Errorf("idle %v: Inspect found it %v, Update kept it %v; want both %v", tc.idle, found, kept, tc.held)
		}
	}
}

// TestStoreSweepPastUsedKeys: idle keys behind more used keys than one hold of the lock
// moves (maxPromote) are dropped by the same Sweep, not one Sweep per maxPromote used.
func TestStoreSweepPastUsedKeys(t *testing.T) {
	s, _ := newCountingStore(t, StoreConfig[int]{Shards: 1, IdleTimeout: time.Second})
	for i := range 30 {
		incr(s, at(0), "k"+strconv.Itoa(i))
	}
	for i := range 20 { // the oldest 20 used again: each due a move to the front
		incr(s, at(500*time.Millisecond), "k"+strconv.Itoa(i))
	}
	if n := s.Sweep(at(1200*time.Millisecond), 0); n != 10 || s.Len() != 20 {
		t.Fatalf("Sweep dropped %d, %d left; want the 10 idle ones dropped, 20 left", n, s.Len())
	}
}

// TestTableMatchesMap adds and removes keys at random in one shard, many of them with
// homes in their table's last slots so that their runs wrap around its end, others
// sharing one hash, the rest spread over the shard's tables, and after every step
// requires that find returns every key held and none removed, that the counts are
// right, and that no free slot lies between a key's home and its place (which find's
// stopping at a free slot relies on).
func TestTableMatchesMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	s, err := NewStore(StoreConfig[int]{MaxKeys: 4 * tableKeys, Shards: 1})
	if err != nil {
		t.Fatal(err)
	}
	sh := &s.shards[0]
	if len(sh.tabs) != 4 {
		t.Fatalf("%d tables for %d keys, want 4", len(sh.tabs), sh.cap)
	}
	held, gone := map[string]*Entry[int]{}, map[string]uint64{}
	var keys []string
	hashOf := func(i int) uint64 {
		switch i % 4 {
		case 0: // the last table, homes in the last six slots of any length
			return ^uint64(0) - uint64(i/4%6)<<16
		case 1: // one hash for all of them
			return 42 << 16
		default:
			return rng.Uint64()
		}
	}
	for step := range 20_000 {
		if len(keys) > 0 && (rng.IntN(2) == 0 || len(keys) > 600) {
			j := rng.IntN(len(keys))
			k := keys[j]
			keys[j] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			gone[k] = held[k].hash
			sh.remove(held[k])
			delete(held, k)
		} else {
			k := fmt.Sprint("k", step)
			e := &Entry[int]{Val: step}
			sh.add(k, hashOf(step), e)
			held[k] = e
			keys = append(keys, k)
		}
		if sh.len() != len(held) {
			t.Fatalf("step %d: len %d, want %d", step, sh.len(), len(held))
		}
		for k, e := range held {
			if got := sh.find(e.hash, k); got != e {
				t.Fatalf("step %d: find(%q) = %p, want %p", step, k, got, e)
			}
		}
		for k, h := range gone {
			if sh.find(h, k) != nil {
				t.Fatalf("step %d: %q found after its removal", step, k)
			}
		}
		total := 0
		for ti := range sh.tabs {
			tb := &sh.tabs[ti]
			mask := uint64(len(tb.slots) - 1)
			n := 0
			for i, sl := range tb.slots {
				if sl.e == nil {
					continue
				}
				n++
				if got := sh.table(sl.h); got != tb {
					t.Fatalf("step %d: %q in table %d, its hash's is another", step, sl.e.key, ti)
				}
				for j := home(sl.h, mask); j != uint64(i); j = (j + 1) & mask {
					if tb.slots[j].e == nil {
						t.Fatalf("step %d: %q at %d, its home %d, past the free slot %d", step, sl.e.key, i, home(sl.h, mask), j)
					}
				}
			}
			if n != tb.n || n*4 > len(tb.slots)*3 {
				t.Fatalf("step %d: table %d holds %d keys, counts %d, in %d slots", step, ti, n, tb.n, len(tb.slots))
			}
			total += n
		}
		if total != len(held) {
			t.Fatalf("step %d: the tables hold %d keys, want %d", step, total, len(held))
		}
		if len(gone) > 200 {
			clear(gone)
		}
	}
}

// TestTablesStaySmall fills Stores of 1, 64 and 4096 shards with as many keys as their
// cap (the fullest shards evicting some): every table
// ends at 1,024 slots or fewer, so that growing one placed at most 768 keys under its
// shard's lock, and a key lies on average less than one slot past its home (a home
// drawn from bits the shard or the table also uses would pile keys up).
func TestTablesStaySmall(t *testing.T) {
	for _, shards := range []int{1, 64, 4096} {
		const keys = 1 << 17
		s, err := NewStore(StoreConfig[int]{MaxKeys: keys, Shards: shards})
		if err != nil {
			t.Fatal(err)
		}
		for i := range keys {
			s.Update(0, "key-"+strconv.Itoa(i), func(*int, int64) {})
		}
		if n := s.Len(); n < keys*9/10 { // some shards' share of the keys is over their cap
			t.Fatalf("%d shards: %d keys held, want about %d", shards, n, keys)
		}
		var held, past, most int
		for i := range s.shards {
			for _, tb := range s.shards[i].tabs {
				most = max(most, len(tb.slots))
				mask := uint64(len(tb.slots) - 1)
				for j, sl := range tb.slots {
					if sl.e != nil {
						held++
						past += int((uint64(j) - home(sl.h, mask)) & mask)
					}
				}
			}
		}
		if most > 1024 {
			t.Errorf("%d shards: a table of %d slots", shards, most)
		}
		if mean := float64(past) / float64(held); mean >= 1 {
			t.Errorf("%d shards: keys lie %.2f slots past their homes on average, want under 1", shards, mean)
		}
	}
}

// BenchmarkTableGrow times a table's growth, the pause of the add that makes it (and of
// whoever waits for the shard's lock): at 768 keys, the most a full shard's table grows
// with (tableKeys, give or take its share of the keys), and at 12,288, what one table
// for each of the default Store's shards (100,000 keys over 8) would place.
func BenchmarkTableGrow(b *testing.B) {
	for _, keys := range []int{768, 12_288} {
		b.Run(strconv.Itoa(keys), func(b *testing.B) {
			rng := rand.New(rand.NewPCG(5, 6))
			var full table[int]
			full.slots = make([]slot[int], 1)
			for range keys {
				if (full.n+1)*4 > len(full.slots)*3 {
					full.grow()
				}
				full.place(slot[int]{h: rng.Uint64(), e: &Entry[int]{}})
				full.n++
			}
			for b.Loop() {
				t := full
				t.grow()
			}
		})
	}
}

// idleKeys returns a one-shard Store with an idle timeout of 1 s holding n keys, "k0"
// (the least recently used) to "k<n-1>", each used once at 0, and its eviction record.
func idleKeys(t *testing.T, n int) (*Store[int], *[]evicted) {
	t.Helper()
	s, ev := newCountingStore(t, StoreConfig[int]{Shards: 1, IdleTimeout: time.Second})
	for i := range n {
		incr(s, at(0), "k"+strconv.Itoa(i))
	}
	return s, ev
}

// TestStoreSweepMax: Sweep drops at most max idle keys, least recently used first, and
// every idle key for a max of 0 or less.
func TestStoreSweepMax(t *testing.T) {
	for _, tc := range []struct{ max, want int }{
		{1, 1}, {2, 2}, {3, 3}, {4, 4}, {5, 5}, {6, 5}, {0, 5}, {-1, 5},
	} {
		s, ev := idleKeys(t, 5)
		if n := s.Sweep(at(time.Second), tc.max); n != tc.want || s.Len() != 5-tc.want || len(*ev) != tc.want {
			t.Errorf("Sweep(max %d) dropped %d, reported %d, %d left; want %d dropped", tc.max, n, len(*ev), s.Len(), tc.want)
			continue
		}
		for i, e := range *ev {
			if want := (evicted{"k" + strconv.Itoa(i), 1, EvictIdle}); e != want {
				t.Errorf("Sweep(max %d): eviction %d is %v, want %v", tc.max, i, e, want)
			}
		}
	}
}

// TestStoreInsertSweepsTwo: a new key checks the two least recently used keys of its
// shard for idleness, and drops those two if idle, no more.
func TestStoreInsertSweepsTwo(t *testing.T) {
	s, ev := idleKeys(t, 4)
	incr(s, at(time.Second), "new")
	want := []evicted{{"k0", 1, EvictIdle}, {"k1", 1, EvictIdle}}
	if !slices.Equal(*ev, want) || s.Len() != 3 {
		t.Errorf("evicted %v, %d left; want %v, 3 left", *ev, s.Len(), want)
	}
}

// TestStoreSetIdleTimeoutNegative: a negative idle timeout is 0, expiry off: IdleTimeout
// reports 0 and keys are kept however long they are idle.
func TestStoreSetIdleTimeoutNegative(t *testing.T) {
	s, ev := idleKeys(t, 1)
	s.SetIdleTimeout(-time.Second)
	if d := s.IdleTimeout(); d != 0 {
		t.Errorf("IdleTimeout() = %v after SetIdleTimeout(-1s), want 0", d)
	}
	if n := s.Sweep(at(1000*time.Hour), 0); n != 0 {
		t.Errorf("Sweep dropped %d, want 0", n)
	}
	if got := incr(s, at(1000*time.Hour), "k0"); got != 2 || len(*ev) != 0 {
		t.Errorf("k0 = %d after 1000 h idle (evicted %v), want it kept (2)", got, *ev)
	}
}

// TestStoreSweepMovesEveryUsedKey: one Sweep moves to the front every used key its shard
// held when it began, though there are more than one hold of the lock moves
// (maxPromote): after it, the shard's LRU order is that of the moves, so a key moved last
// is behind the others and not dropped, idle though it is, while they are not idle.
func TestStoreSweepMovesEveryUsedKey(t *testing.T) {
	s, _ := idleKeys(t, maxPromote+1)
	last := "k" + strconv.Itoa(maxPromote)
	incr(s, at(100*time.Millisecond), last)
	for i := range maxPromote {
		incr(s, at(500*time.Millisecond), "k"+strconv.Itoa(i))
	}
	// Nothing idle yet: every key is moved, last the newest, last of all.
	if n := s.Sweep(at(time.Second), 0); n != 0 {
		t.Fatalf("Sweep at 1 s dropped %d, want 0", n)
	}
	// last, idle now, lies behind the keys used at 0.5 s, which are not.
	if n := s.Sweep(at(1200*time.Millisecond), 0); n != 0 {
		t.Errorf("Sweep at 1.2 s dropped %d, want 0: %s was moved to the front by the Sweep before", n, last)
	}
	if n := s.Sweep(at(1500*time.Millisecond), 0); n != maxPromote+1 {
		t.Errorf("Sweep at 1.5 s dropped %d, want all %d", n, maxPromote+1)
	}
}

// TestStorePromotionSpendsUse: a used key that an eviction for capacity or a Sweep moves
// to the front has its use spent there, so when it reaches the back again unused since,
// it is the one evicted, ahead of keys used after the move.
func TestStorePromotionSpendsUse(t *testing.T) {
	for _, tc := range []struct {
		name  string
		sweep bool // the move is a Sweep's, else an insert's
		keys  []string
		uses  [][]string // keys used again, before and after the move
		adds  []string   // keys added once the move is done
		want  []string   // evicted, in order
	}{
		{"by an insert", false, []string{"a", "b"}, [][]string{{"a", "b"}, nil}, []string{"c", "d"}, []string{"a", "b"}},
		{"by a Sweep", true, []string{"a", "b", "c"}, [][]string{{"a"}, {"b", "c"}}, []string{"d"}, []string{"a"}},
	} {
		s, ev := newCountingStore(t, StoreConfig[int]{MaxKeys: len(tc.keys), Shards: 1, IdleTimeout: time.Hour})
		for _, k := range tc.keys {
			incr(s, at(0), k)
		}
		for _, k := range tc.uses[0] {
			incr(s, at(0), k)
		}
		if tc.sweep && s.Sweep(at(time.Second), 0) != 0 {
			t.Fatalf("%s: Sweep dropped keys that are not idle", tc.name)
		}
		s.SetIdleTimeout(0) // from here on, only evictions for capacity move keys
		for _, k := range tc.uses[1] {
			incr(s, at(0), k)
		}
		for _, k := range tc.adds {
			incr(s, at(0), k)
		}
		var got []string
		for _, e := range *ev {
			got = append(got, e.key)
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: evicted %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestStoreInsertMovesBounded: an insert moves at most maxPromote used keys to the front
// under its shard's lock, so an idle key behind more used keys than that is not dropped
// by it but by the next Sweep.
func TestStoreInsertMovesBounded(t *testing.T) {
	s, ev := newCountingStore(t, StoreConfig[int]{Shards: 1, IdleTimeout: time.Second})
	for i := range maxPromote + 1 {
		incr(s, at(0), "k"+strconv.Itoa(i))
	}
	incr(s, at(0), "idle")
	for i := range maxPromote + 1 { // used: each due a move to the front
		incr(s, at(500*time.Millisecond), "k"+strconv.Itoa(i))
	}
	incr(s, at(time.Second), "new")
	if len(*ev) != 0 || !s.Peek("idle", func(*int, int64) {}) {
		t.Errorf("the insert evicted %v, want nothing: the idle key lies behind %d used ones", *ev, maxPromote+1)
	}
	if n := s.Sweep(at(time.Second), 0); n != 1 {
		t.Errorf("Sweep dropped %d, want the idle key", n)
	}
}

// TestStoreInspectNoIdle: with idle expiry off, Inspect finds a held key however long it
// has been idle, sees its latest instant and leaves it unused; it finds no absent key.
func TestStoreInspectNoIdle(t *testing.T) {
	s, _ := newCountingStore(t, StoreConfig[int]{Shards: 1})
	incr(s, at(0), "k")
	for _, tc := range []struct {
		key  string
		now  time.Duration
		held bool
	}{
		{"k", 0, true}, {"k", 1000 * time.Hour, true}, {"absent", 0, false},
	} {
		var got *Entry[int]
		s.Inspect(tc.key, at(tc.now), func(e *Entry[int]) { got = e })
		if (got != nil) != tc.held {
			t.Errorf("Inspect(%q) at t0+%v found it %v, want %v", tc.key, tc.now, got != nil, tc.held)
		} else if got != nil && (got.Val != 1 || got.Last != at(0) || got.Used) {
			t.Errorf("Inspect(%q) saw value %d, last t0+%v, used %v; want 1, t0+0s, false", tc.key, got.Val, time.Duration(got.Last-t0), got.Used)
		}
	}
}
