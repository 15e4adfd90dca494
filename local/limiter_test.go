package local

import (
	"errors"
	"math"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(d time.Duration) time.Time { return t0.Add(d) }

func newTestLimiter(t testing.TB, cfg Config) *Limiter {
	t.Helper()
	l, err := NewLimiter(cfg)
	if err != nil {
		t.Fatalf("NewLimiter(%+v): %v", cfg, err)
	}
	t.Cleanup(l.Close)
	return l
}

type step struct {
	at   time.Duration // since t0
	key  string
	n    int
	want bool
}

func runSteps(t *testing.T, l *Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		if got := l.AllowN(at(s.at), s.key, s.n); got != s.want {
			t.Fatalf("step %d: AllowN(t0+%v, %q, %d) = %v, want %v", i, s.at, s.key, s.n, got, s.want)
		}
	}
}

func TestLimiterSteps(t *testing.T) {
	tests := []struct {
		name  string
		rate  rate.Limit
		burst int
		steps []step
	}{
		{"burst then refill", 10, 3, []step{
			{0, "a", 1, true}, {0, "a", 1, true}, {0, "a", 1, true}, {0, "a", 1, false},
			{99 * time.Millisecond, "a", 1, false},
			{100 * time.Millisecond, "a", 1, true},
			{100 * time.Millisecond, "a", 1, false},
			{time.Second, "a", 3, true}, // refilled to burst, not beyond
			{time.Second, "a", 1, false},
		}},
		{"keys are independent", 1, 2, []step{
			{0, "a", 2, true}, {0, "a", 1, false},
			{0, "b", 2, true}, {0, "b", 1, false},
			{0, "", 1, true}, {0, "", 1, true}, {0, "", 1, false}, // the empty key is a key
		}},
		{"n edge cases", 1, 5, []step{
			{0, "a", 6, false}, // more than burst: never
			{0, "a", 0, true},  // nothing asked: allowed, nothing taken
			{0, "a", -1, false},
			{0, "a", 5, true},
			{0, "a", 0, true},
			{0, "a", 1, false},
		}},
		{"fractional rate", 0.5, 1, []step{
			{0, "a", 1, true}, {time.Second, "a", 1, false}, {2 * time.Second, "a", 1, true},
		}},
		{"infinite rate", rate.Inf, 1, []step{
			{0, "a", 1, true}, {0, "a", 1, true}, {0, "a", 1000, true},
		}},
		{"idle key comes back full", 1, 2, []step{
			{0, "a", 2, true}, {0, "a", 1, false},
			{time.Hour, "a", 2, true}, {time.Hour, "a", 1, false},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			runSteps(t, newTestLimiter(t, Config{Rate: tt.rate, Burst: tt.burst}), tt.steps)
		})
	}
}

// TestLimiterTimeBackwards alternates two instants 10 s apart for one key.
// A bare rate.Limiter refills the 10 s every time the clock jumps forward
// again; the keyed limiter treats the earlier instant as the later one.
func TestLimiterTimeBackwards(t *testing.T) {
	const r, burst, rounds = 1, 10, 100
	l := newTestLimiter(t, Config{Rate: r, Burst: burst})
	bare := rate.NewLimiter(r, burst)
	var keyed, unclamped int
	for i := range rounds {
		now := at(0)
		if i%2 == 0 {
			now = at(10 * time.Second)
		}
		for range 2 {
			if l.AllowN(now, "k", 1) {
				keyed++
			}
			if bare.AllowN(now, 1) {
				unclamped++
			}
		}
	}
	// Over an elapsed 10 s the most that can pass is burst + 10 s × rate.
	if want := burst + 10*r; keyed > want {
		t.Errorf("keyed limiter allowed %d of %d with the clock stepping back, want at most %d", keyed, 2*rounds, want)
	}
	t.Logf("alternating instants 10 s apart, %d calls: keyed allowed %d, bare rate.Limiter %d", 2*rounds, keyed, unclamped)
	if unclamped <= burst+10*r {
		t.Logf("note: bare rate.Limiter no longer creates tokens when time steps back")
	}

	// Tokens and the key's time stay put when asked about the past.
	if got := l.TokensAt(at(0), "k"); got < 0 || got > 1 {
		t.Errorf("TokensAt(earlier) = %v, want the spent bucket at its latest instant", got)
	}
}

func TestLimiterSetLimit(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 10})
	if !l.AllowN(at(0), "a", 10) {
		t.Fatal("full bucket refused its burst")
	}
	// From t0+2s on the rate is 10/s and the burst 20: "a" has 2 tokens at
	// the change (old rate), then refills at the new rate.
	if err := l.SetLimitAt(at(2*time.Second), 10, 20); err != nil {
		t.Fatal(err)
	}
	if r, b := l.Limit(); r != 10 || b != 20 {
		t.Fatalf("Limit() = %v, %d, want 10, 20", r, b)
	}
	// At t0+3s: 2 + 10 = 12 tokens.
	runSteps(t, l, []step{
		{3 * time.Second, "a", 12, true},
		{3 * time.Second, "a", 1, false},
		{3 * time.Second, "new", 20, true}, // a new key gets the new burst
	})
	// Shrinking the burst caps held tokens.
	if err := l.SetLimitAt(at(4*time.Second), 10, 5); err != nil {
		t.Fatal(err)
	}
	runSteps(t, l, []step{
		{time.Minute, "a", 6, false},
		{time.Minute, "a", 5, true},
	})
	// An invalid change is refused and changes nothing.
	for _, bad := range []struct {
		r rate.Limit
		b int
	}{{0, 1}, {rate.Limit(math.NaN()), 1}, {1, 0}, {-1, 1}} {
		if err := l.SetLimitAt(at(5*time.Second), bad.r, bad.b); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("SetLimitAt(%v, %d) = %v, want ErrInvalidConfig", bad.r, bad.b, err)
		}
	}
	if r, b := l.Limit(); r != 10 || b != 5 {
		t.Fatalf("after refused changes Limit() = %v, %d, want 10, 5", r, b)
	}
	// The default idle timeout follows the limit, but does not shrink: a
	// bucket last used under the old limit needs the old time to fill.
	if got, want := l.store.IdleTimeout(), 11*time.Second; got != want {
		t.Errorf("idle timeout %v, want %v", got, want)
	}
	// It grows with a limit slower to fill (10 tokens at 0.1/s: 100 s, and a
	// second): a key let go of half-way through its refill would come back full.
	if err := l.SetLimitAt(at(6*time.Second), 0.1, 10); err != nil {
		t.Fatal(err)
	}
	if got, want := l.store.IdleTimeout(), 101*time.Second; got != want {
		t.Errorf("idle timeout %v after a limit of 101 s to fill, want %v", got, want)
	}
}

// TestLimiterSetLimitKeyAhead: a key whose clock is ahead of the instant of
// SetLimitAt takes the new limit from its own latest instant, never moving
// its bucket's time backwards.
// TestLimiterSetLimitKeyBehind: a request at an instant before the one SetLimitAt was
// given takes the new limit at its own instant: the old rate refills only up to it.
func TestLimiterSetLimitKeyBehind(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 10})
	runSteps(t, l, []step{{0, "a", 10, true}})
	if err := l.SetLimitAt(at(10*time.Second), 2, 10); err != nil {
		t.Fatal(err)
	}
	runSteps(t, l, []step{
		{time.Second, "a", 2, false}, // 1 s at the old rate: one token, not ten
		{time.Second, "a", 1, true},
		{1500 * time.Millisecond, "a", 1, true}, // the new rate from 1 s on
		{1500 * time.Millisecond, "a", 1, false},
	})
}

func TestLimiterSetLimitKeyAhead(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 10})
	runSteps(t, l, []step{{10 * time.Second, "a", 10, true}})
	if err := l.SetLimitAt(at(0), 100, 10); err != nil {
		t.Fatal(err)
	}
	runSteps(t, l, []step{
		{5 * time.Second, "a", 1, false}, // earlier than the key's latest instant: no tokens
		{10*time.Second + 50*time.Millisecond, "a", 5, true},
		{10*time.Second + 50*time.Millisecond, "a", 1, false},
	})
}

func TestNewLimiterInvalid(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"zero rate", Config{Rate: 0, Burst: 1}},
		{"negative rate", Config{Rate: -1, Burst: 1}},
		{"NaN rate", Config{Rate: rate.Limit(math.NaN()), Burst: 1}},
		{"zero burst", Config{Rate: 1, Burst: 0}},
		{"negative burst", Config{Rate: 1, Burst: -3}},
		{"rate too small for burst", Config{Rate: 1e-12, Burst: 100}},
		{"negative infinite rate", Config{Rate: rate.Limit(math.Inf(-1)), Burst: 1}},
		{"burst past 2^53", Config{Rate: 1e9, Burst: 1<<53 + 1}},
		{"infinite rate, zero burst", Config{Rate: rate.Inf, Burst: 0}},
		{"negative idle", Config{Rate: 1, Burst: 1, IdleTimeout: -time.Second}},
		{"idle of -1ns", Config{Rate: 1, Burst: 1, IdleTimeout: -time.Nanosecond}},
		{"negative max keys", Config{Rate: 1, Burst: 1, MaxKeys: -1}},
		{"negative shards", Config{Rate: 1, Burst: 1, Shards: -1}},
		{"zero value", Config{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := NewLimiter(tt.cfg)
			if !errors.Is(err, ErrInvalidConfig) || l != nil {
				t.Fatalf("NewLimiter(%+v) = %v, %v; want nil, ErrInvalidConfig", tt.cfg, l, err)
			}
			t.Log(err)
		})
	}
}

func TestLimiterClose(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 1})
	l.AllowN(at(0), "a", 1)
	l.Close()
	l.Close() // idempotent
	if l.AllowN(at(0), "b", 1) {
		t.Error("closed Limiter allowed a request")
	}
	if n := l.Len(); n != 0 {
		t.Errorf("closed Limiter holds %d keys", n)
	}
}

// TestLimiterEvictedKeyComesBackFull: a key evicted for capacity starts
// again with a full bucket.
func TestLimiterEvictedKeyComesBackFull(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 3, MaxKeys: 2, Shards: 1})
	runSteps(t, l, []step{
		{0, "a", 3, true}, {0, "a", 1, false},
		{0, "b", 1, true},
		{0, "c", 1, true}, // evicts "a", the least recently used
		{0, "a", 3, true}, // back, full
	})
	if n := l.Len(); n != 2 {
		t.Errorf("Len() = %d, want the cap 2", n)
	}
}

func TestLimiterIdleExpiry(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 10, Burst: 5, MaxKeys: 64, Shards: 1})
	// Default idle timeout: ceil(5/10 s × 1000) ms + 1 s.
	if got, want := l.store.IdleTimeout(), 1500*time.Millisecond; got != want {
		t.Fatalf("idle timeout %v, want %v", got, want)
	}
	for i := range 10 {
		l.AllowN(at(0), strconv.Itoa(i), 1)
	}
	if got := l.Sweep(at(1499*time.Millisecond), 0); got != 0 {
		t.Errorf("Sweep before the idle timeout dropped %d", got)
	}
	if got := l.Sweep(at(1500*time.Millisecond), 4); got != 4 {
		t.Errorf("Sweep(max 4) dropped %d", got)
	}
	// A new key's arrival sweeps two idle keys.
	l.AllowN(at(2*time.Second), "new", 1)
	if got := l.Len(); got != 10-4-2+1 {
		t.Errorf("Len() = %d after an insert with idle keys, want %d", got, 10-4-2+1)
	}
	if got := l.Sweep(at(2*time.Second), 0); got != 4 {
		t.Errorf("Sweep(all) dropped %d, want the 4 left", got)
	}
}

// TestLimiterManyKeys sends 1,000,000 distinct keys (100,000 under -short)
// through a limiter capped at 10,000 keys: the keys held stay at the cap
// and the heap grows by about the cap's worth of buckets, not the keys'.
func TestLimiterManyKeys(t *testing.T) {
	n := 1_000_000
	if testing.Short() {
		n = 100_000
	}
	const maxKeys = 10_000
	l := newTestLimiter(t, Config{Rate: 1, Burst: 1, MaxKeys: maxKeys})
	before := heapInUse()
	buf := make([]byte, 0, 32)
	for i := range n {
		buf = strconv.AppendInt(append(buf[:0], "client-"...), int64(i), 10)
		if !l.AllowN(at(0), string(buf), 1) {
			t.Fatalf("new key %d refused", i)
		}
		if i%100_000 == 0 {
			if held := l.Len(); held > maxKeys {
				t.Fatalf("after %d keys %d are held, cap %d", i+1, held, maxKeys)
			}
		}
	}
	if held := l.Len(); held != maxKeys {
		t.Fatalf("after %d keys %d are held, want the cap %d", n, held, maxKeys)
	}
	grew := heapInUse() - before
	perKey := float64(grew) / maxKeys
	t.Logf("%d distinct keys, cap %d: %d held, heap grew %.2f MiB (%.0f B per held key)",
		n, maxKeys, l.Len(), float64(grew)/(1<<20), perKey)
	// A bucket with its entry and key is a few hundred bytes; 2 KiB per
	// held key is a ceiling that only unbounded growth would break.
	if perKey > 2048 {
		t.Errorf("heap grew %d B for %d held keys: not bounded by the cap", grew, maxKeys)
	}
	runtime.KeepAlive(l)
}

func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestLimiterConcurrent: with the clock frozen, goroutines racing on the
// same keys are admitted exactly burst times per key.
func TestLimiterConcurrent(t *testing.T) {
	const burst, keys, goroutines, calls = 50, 20, 16, 500
	l := newTestLimiter(t, Config{Rate: 1, Burst: burst, MaxKeys: 1000})
	var allowed [keys]atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range calls {
				k := (g + i) % keys
				if l.AllowN(at(0), "k"+strconv.Itoa(k), 1) {
					allowed[k].Add(1)
				}
				if i%50 == 0 { // other methods, concurrently
					l.TokensAt(at(0), "k0")
					l.Len()
					l.Sweep(at(0), 1)
				}
			}
		})
	}
	// A limit change in the middle, to the same values, must not add tokens.
	wg.Go(func() {
		for range 10 {
			if err := l.SetLimitAt(at(0), 1, burst); err != nil {
				t.Error(err)
			}
		}
	})
	wg.Wait()
	for k := range allowed {
		if got := allowed[k].Load(); got != burst {
			t.Errorf("key %d: %d allowed with a frozen clock, want exactly %d", k, got, burst)
		}
	}
}

// FuzzLimiter checks the keyed limiter against a reference: one bare
// rate.Limiter per key fed a clock that never runs backwards, with no cap
// and no idle expiry to differ. Instants move back and forth.
func FuzzLimiter(f *testing.F) {
	f.Add([]byte{0, 10, 1, 1, 200, 1, 2, 5, 3, 0, 100, 4})
	f.Add([]byte{1, 255, 2, 1, 0, 2, 1, 255, 2, 1, 0, 2})
	f.Add([]byte{3, 3, 3, 3, 3, 3, 3, 3, 3})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const r, burst = 7, 5
		l, err := NewLimiter(Config{Rate: r, Burst: burst, IdleTimeout: 1000 * time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		ref := map[string]*rate.Limiter{}
		last := map[string]time.Time{}
		now := t0
		for i := 0; i+2 < len(ops); i += 3 {
			key := strconv.Itoa(int(ops[i] % 4))
			// -64..+191 ms: mostly forwards, sometimes back.
			now = now.Add(time.Duration(int(ops[i+1])-64) * time.Millisecond)
			n := int(ops[i+2]%8) - 1

			rl, ok := ref[key]
			tk := now
			if p, seen := last[key]; seen && tk.Before(p) {
				tk = p
			}
			want := n == 0
			if n >= 0 { // a negative n touches nothing
				if !ok {
					rl = rate.NewLimiter(r, burst)
					ref[key] = rl
				}
				last[key] = tk
				want = n == 0 || rl.AllowN(tk, n)
			}
			if got := l.AllowN(now, key, n); got != want {
				t.Fatalf("op %d: AllowN(%v, %q, %d) = %v, reference %v", i/3, now.Sub(t0), key, n, got, want)
			}
			// TokensAt reads at the key's latest instant when now is earlier, and does not
			// advance it: the reference's latest is its AllowN's alone.
			wantTokens := float64(burst)
			if rl, ok := ref[key]; ok {
				wantTokens = rl.TokensAt(tk)
			}
			if got := l.TokensAt(now, key); math.Abs(got-wantTokens) > 1e-9 {
				t.Fatalf("op %d: TokensAt(%q) = %v, reference %v", i/3, key, got, wantTokens)
			}
		}
	})
}

// TestLimiterTokensAtIsReadOnly: TokensAt says it does not make a key more recently
// used, so looking at a key (a metrics loop, say) must not keep it from expiring.
func TestLimiterTokensAtIsReadOnly(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 0.1, Burst: 10, MaxKeys: 64, Shards: 1, IdleTimeout: time.Second})
	if !l.AllowN(at(0), "k", 1) {
		t.Fatal("first AllowN denied")
	}
	for _, d := range []time.Duration{500 * time.Millisecond, 900 * time.Millisecond} {
		if got := l.TokensAt(at(d), "k"); math.Abs(got-(9+0.1*d.Seconds())) > 1e-9 {
			t.Fatalf("TokensAt(+%v) = %v", d, got)
		}
	}
	// Idle since 0: at 1.2 s the key starts afresh, as AllowN would find it.
	if got := l.TokensAt(at(1200*time.Millisecond), "k"); got != 10 {
		t.Fatalf("TokensAt after the idle timeout = %v, want a full bucket (10)", got)
	}
	if got := l.Sweep(at(1200*time.Millisecond), 0); got != 1 {
		t.Fatalf("Sweep after the idle timeout dropped %d keys, want 1", got)
	}
}

// TestLimiterTokensAtEarlierInstant: TokensAt at an instant before the key's latest,
// which a zero-cost AllowN set without spending, reads the bucket at that latest instant.
func TestLimiterTokensAtEarlierInstant(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 10})
	runSteps(t, l, []step{{0, "a", 10, true}, {4 * time.Second, "a", 0, true}})
	for _, d := range []time.Duration{2 * time.Second, 4 * time.Second} {
		if got := l.TokensAt(at(d), "a"); math.Abs(got-4) > 1e-9 {
			t.Errorf("TokensAt(+%v) = %v, want 4, the tokens at the key's latest instant (+4s)", d, got)
		}
	}
}

// TestLimiterTokensAtAppliesLimit: TokensAt after SetLimitAt moves the key's time to the
// change's instant, so the key is idle from then, not from its last use.
func TestLimiterTokensAtAppliesLimit(t *testing.T) {
	l := newTestLimiter(t, Config{Rate: 1, Burst: 10, Shards: 1, IdleTimeout: time.Minute})
	runSteps(t, l, []step{{0, "a", 1, true}})
	if err := l.SetLimitAt(at(50*time.Second), 1, 10); err != nil {
		t.Fatal(err)
	}
	l.TokensAt(at(55*time.Second), "a")
	if got := l.Sweep(at(70*time.Second), 0); got != 0 {
		t.Fatalf("Sweep 20 s after the change dropped %d keys, want 0", got)
	}
	if got := l.Sweep(at(110*time.Second), 0); got != 1 {
		t.Fatalf("Sweep a minute after the change dropped %d keys, want 1", got)
	}
}

// TestLimiterIdleTimeout: the idle timeout is the one configured, however short; left to
// its default it is the refill time plus a second (a second for rate.Inf), and SetLimitAt
// grows it, never shrinks it, and leaves a configured one alone.
func TestLimiterIdleTimeout(t *testing.T) {
	type limit struct {
		r     rate.Limit
		burst int
	}
	tests := []struct {
		name string
		cfg  Config
		set  []limit
		want time.Duration
	}{
		{"configured 1ns", Config{Rate: 1, Burst: 1, IdleTimeout: time.Nanosecond}, nil, time.Nanosecond},
		{"default", Config{Rate: 10, Burst: 5}, nil, 1500 * time.Millisecond},
		{"default, rate Inf", Config{Rate: rate.Inf, Burst: 5}, nil, time.Second},
		{"default grows", Config{Rate: 10, Burst: 5}, []limit{{1, 10}}, 11 * time.Second},
		{"default never shrinks", Config{Rate: 1, Burst: 10}, []limit{{10, 5}}, 11 * time.Second},
		{"configured stays", Config{Rate: 10, Burst: 5, IdleTimeout: time.Second}, []limit{{0.01, 10}}, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := newTestLimiter(t, tt.cfg)
			for _, s := range tt.set {
				if err := l.SetLimitAt(at(0), s.r, s.burst); err != nil {
					t.Fatal(err)
				}
			}
			if got := l.store.IdleTimeout(); got != tt.want {
				t.Errorf("idle timeout %v, want %v", got, tt.want)
			}
		})
	}
}

// TestLimiterAnyClock: a Limiter works on any clock whose instants lie within 292 years of
// its first: a virtual one from the zero Time, one in 1700 or 2400, one with a monotonic
// reading. A full bucket of 5 spends, refills at its rate 10 s later, and an idle key is
// swept after its idle timeout.
func TestLimiterAnyClock(t *testing.T) {
	for _, base := range []time.Time{{}, time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2400, 1, 1, 0, 0, 0, 0, time.UTC), time.Now()} {
		t.Run(base.String(), func(t *testing.T) {
			l := newTestLimiter(t, Config{Rate: 10, Burst: 5, IdleTimeout: time.Minute})
			for i := range 5 {
				if !l.AllowN(base, "k", 1) {
					t.Fatalf("request %d of a full bucket of 5 denied", i+1)
				}
			}
			if l.AllowN(base, "k", 1) {
				t.Fatal("a sixth request admitted from a bucket of 5")
			}
			later := base.Add(10 * time.Second)
			if got := l.TokensAt(later, "k"); got != 5 {
				t.Fatalf("10 s later the bucket holds %v tokens, want 5", got)
			}
			if !l.AllowN(later, "k", 5) {
				t.Fatal("10 s later a cost of 5 is denied")
			}
			if n := l.Sweep(later.Add(time.Hour), 0); n != 1 || l.Len() != 0 {
				t.Fatalf("an hour later Sweep dropped %d keys, %d left; want 1 and 0", n, l.Len())
			}
		})
	}
}
