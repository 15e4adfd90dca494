// Package keystore is a bounded map of per-key state, sharded under a mutex per shard:
// a hard cap on keys with least-recently-used eviction per shard, an optional idle
// timeout, and a callback for every key let go. local.Limiter keeps its buckets in one,
// and the engine a limit's keys.
package keystore

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"
)

// ErrInvalidConfig is wrapped by every error NewStore returns for a configuration it
// cannot honour.
var ErrInvalidConfig = errors.New("key store")

// DefaultMaxKeys is the number of keys a Store holds when its configuration leaves
// MaxKeys at zero.
const DefaultMaxKeys = 100_000

// MaxKeys returns the number of keys a Store configured with MaxKeys n holds: n, or
// DefaultMaxKeys for 0.
func MaxKeys(n int) int {
	if n == 0 {
		return DefaultMaxKeys
	}
	return n
}

// EvictReason says why a Store let go of a key.
type EvictReason uint8

const (
	// EvictCapacity: the store was full and the key was the least recently
	// used of its shard.
	EvictCapacity EvictReason = iota + 1
	// EvictIdle: the key had not been used for the idle timeout.
	EvictIdle
	// EvictRemoved: Remove was called for the key.
	EvictRemoved
	// EvictPurged: Purge or Close dropped every key.
	EvictPurged
)

// String returns the reason's name, as in "capacity" or "idle".
func (r EvictReason) String() string {
	switch r {
	case EvictCapacity:
		return "capacity"
	case EvictIdle:
		return "idle"
	case EvictRemoved:
		return "removed"
	case EvictPurged:
		return "purged"
	}
	return fmt.Sprintf("EvictReason(%d)", uint8(r))
}

// StoreConfig configures a Store. The zero value is usable: DefaultMaxKeys
// keys, no idle expiry, zero-valued entries and no eviction callback.
type StoreConfig[V any] struct {
	// MaxKeys is the hard cap on the number of keys held; when a new key
	// arrives at a full shard, the least recently used key of that shard
	// goes (approximately: a key used since it last moved in the LRU list
	// is moved to the front when it reaches the back, rather than on every
	// use). 0 means DefaultMaxKeys; negative is an error.
	MaxKeys int

	// IdleTimeout drops a key that has not been used for this long. It is
	// checked when the key is used again (the key then starts afresh), when
	// a new key is added (the two least recently used keys of its shard are
	// checked), and by Sweep. 0 disables idle expiry; negative is an error.
	IdleTimeout time.Duration

	// Shards splits the store into this many independently locked parts, by
	// a hash of the key, so that goroutines working on different keys rarely
	// wait for each other. The cap is split among the shards, so each shard
	// runs its own LRU: a key is evicted when it is the least recently used
	// of its shard, not necessarily of the whole store. 0 picks a power of
	// two near 4×GOMAXPROCS, fewer when MaxKeys is small; it is rounded up
	// to a power of two and cut down to MaxKeys.
	Shards int

	// Init, if set, initialises the value of a key that is being created,
	// with the instant of the request that created it. It runs with the
	// key's shard locked and must not call the Store. key is the Store's own
	// copy, which for a key of up to 24 bytes lives in the key's entry: a
	// string kept from it keeps the whole entry in memory, after the key is
	// let go of too, so keep a clone (strings.Clone) of it instead.
	Init func(v *V, key string, now int64)

	// OnEvict, if set, is told about every key the store lets go of, after
	// the store's locks are released, on the goroutine whose call caused the
	// eviction. The value belongs to the callback from then on: no other
	// call of the store sees it again. It may call the store. key is the
	// Store's copy, as Init's is.
	OnEvict func(key string, v *V, reason EvictReason)
}

// A Store is a bounded, concurrency-safe map from string keys to values of
// type V, for per-key state that must not grow without bound: it holds at
// most MaxKeys keys, drops the least recently used when full, and drops keys
// that have been idle for IdleTimeout. Time is never read from the clock:
// every call that needs it takes the instant as a parameter, so a simulator
// can drive a Store in virtual time. An instant is nanoseconds on any one
// scale the caller keeps to (the engine's: Unix nanoseconds; package local's:
// since the first instant its Limiter was given), compared by differences, so that a hit
// subtracts integers where time.Time's Sub and After are two calls.
//
// Each key also carries the latest instant it was used at; instants passed
// for a key never move it backwards (an earlier instant is treated as the
// latest one), so state kept per key sees a clock that never runs back.
//
// A Store starts no goroutines. It is safe for simultaneous use by multiple
// goroutines. Each shard keeps its keys in a table of its own and its LRU order in
// a list threaded through the entries themselves, under the shard's mutex, so that
// a hit reads the table and the entry and nothing else; docs/hot-path.md says why.
// A key is hashed once per call: the hash picks its shard and its place in the
// shard's table.
type Store[V any] struct {
	shards []Shard[V]
	empty  []slot[V] // one free slot: the table of a table with no keys yet
	mask   uint64
	hasher hasher
	// hashBits masks every key's hash: all ones, fewer in tests that make keys
	// collide (FuzzStoreMatchesModel).
	hashBits uint64
	idle     atomic.Int64 // nanoseconds; 0 = no idle expiry
	init     func(v *V, key string, now int64)
	onEvict  func(key string, v *V, reason EvictReason)
	closed   atomic.Bool
}

// maxPending is the most keys one call evicts: one for capacity and
// sweepOnInsert idle keys.
const (
	sweepOnInsert = 2
	maxPending    = 1 + sweepOnInsert
)

// Shard is one lock's part of a Store.
type Shard[V any] struct {
	mu sync.Mutex
	// The fields below are guarded by mu; those a hit reads come first, to
	// share the mutex's cache line.
	closed bool
	npend  int
	// tabs are the shard's tables of its keys, a key's picked by bits 40 and up of
	// its hash (tableOf; tmask is len(tabs)-1), so many that each holds
	// about tableKeys keys or fewer when the shard is full: a table grows by
	// doubling, placing its keys afresh under the lock, and small tables bound
	// that pause, where one table over 12,000 keys would take a millisecond or more.
	tabs    []table[V]
	tmask   uint64
	n       int       // the keys held
	front   *Entry[V] // the most recently promoted key; nil when the shard is empty
	back    *Entry[V] // the least recently promoted key
	cap     int
	pending [maxPending]eviction[V]
	_       [48]byte // neighbouring shards' mutexes on separate cache lines: 176 bytes a shard (192, line-aligned, measured no faster)
}

// Entry is a key's place in a Store: its value and its latest instant.
type Entry[V any] struct {
	// key is the key, which a hit compares: the shard's tables hold keys by their
	// hash. It is first, with the fields a hit reads, and so are its bytes when
	// they fit in kb (a key's own allocation would be a cache line more to read).
	key  string
	kb   [inlineKey]byte
	Last int64 // the latest instant the key was used at
	Used bool  // used since it was last moved to the front of the LRU list
	Val  V
	// The shard's bookkeeping, which a hit does not read: the key's hash and its
	// neighbours in the LRU list, prev toward the front.
	hash       uint64
	prev, next *Entry[V]
}

// inlineKey is the longest key an entry holds in itself, not in an allocation of its
// own: with them, and the key's hash, the engine's key state is 352 bytes, an
// allocator class, where it was 328 in the same class.
const inlineKey = 24

// table is one of a shard's tables, by open addressing with linear probing: a key's
// place is the first free slot at or after its home slot (home), and no free slot lies
// between the two. Its length is a power of two, at most three quarters of it are taken,
// and until its first key it is the Store's one free slot (Store.empty), never written.
type table[V any] struct {
	slots []slot[V]
	n     int
}

// slot is one place in a shard's table: an entry and its key's hash, which a probe
// compares before it reads the entry's key. e is nil in a free slot.
type slot[V any] struct {
	h uint64
	e *Entry[V]
}

// minSlots is the length a table takes for its first key; tableKeys the keys a table
// holds, about, when its shard is full: its rehash then places at most 768 keys.
const (
	minSlots  = 8
	tableKeys = 512
	// maxTables is the most tables a shard has, made when it is (128 KiB): a shard's
	// cap of up to 2 million keys gets tables of tableKeys; past that its tables hold
	// more each, and their growth pauses are longer. A cap meant as "no cap"
	// (MaxKeys: math.MaxInt) costs no more up front. At most 1<<24: the bits from 40.
	maxTables = 1 << 12
)

// eviction is an entry taken out of its shard, to report to OnEvict (under its key,
// e.key) once the lock is released.
type eviction[V any] struct {
	e      *Entry[V]
	reason EvictReason
}

// NewStore returns an empty Store, or an error wrapping ErrInvalidConfig.
func NewStore[V any](cfg StoreConfig[V]) (*Store[V], error) {
	if cfg.MaxKeys < 0 {
		return nil, fmt.Errorf("%w: MaxKeys %d is negative", ErrInvalidConfig, cfg.MaxKeys)
	}
	if cfg.IdleTimeout < 0 {
		return nil, fmt.Errorf("%w: IdleTimeout %v is negative", ErrInvalidConfig, cfg.IdleTimeout)
	}
	if cfg.Shards < 0 {
		return nil, fmt.Errorf("%w: Shards %d is negative", ErrInvalidConfig, cfg.Shards)
	}
	maxKeys := MaxKeys(cfg.MaxKeys)
	n := shardCount(cfg.Shards, maxKeys)
	s := &Store[V]{
		shards:   make([]Shard[V], n),
		empty:    make([]slot[V], 1),
		mask:     uint64(n - 1),
		hasher:   newHasher(),
		hashBits: ^uint64(0),
		init:     cfg.Init,
		onEvict:  cfg.OnEvict,
	}
	s.idle.Store(int64(cfg.IdleTimeout))
	for i := range s.shards {
		c := maxKeys / n
		if i < maxKeys%n {
			c++
		}
		s.shards[i].cap = c
		s.shards[i].reset(s.empty)
	}
	return s, nil
}

// shardCount returns a power of two no larger than maxKeys (when possible)
// near the requested or default count.
func shardCount(requested, maxKeys int) int {
	want := requested
	if want == 0 {
		want = 4 * runtime.GOMAXPROCS(0)
		// Keep at least 64 keys per shard so that the per-shard LRU stays
		// close to a global one for small stores.
		if m := maxKeys / 64; want > m {
			want = m
		}
	}
	if want > maxKeys {
		want = maxKeys
	}
	n := 1
	for n < want && n < 1<<16 {
		n <<= 1
	}
	for n > 1 && n > maxKeys {
		n >>= 1
	}
	return n
}

// Update calls fn with the value stored for key, creating the key (with
// Init) if it is absent or has been idle for IdleTimeout, and marks it as the
// most recently used key of its shard. now is the instant of the request;
// fn receives the key's latest instant, max(now, the instant the key was
// last used at), so per-key time never runs backwards.
//
// fn runs with the key's shard locked: it must be short, must not block and
// must not call the Store, and v is valid only until fn returns. Evictions
// the call causes are reported to OnEvict after the lock is released.
// Update reports false, without calling fn, once the Store is closed.
func (s *Store[V]) Update(now int64, key string, fn func(v *V, now int64)) bool {
	sh, e, ok := s.Acquire(now, key)
	if !ok {
		return false
	}
	defer s.Release(sh) // a panicking fn must not leave the shard locked
	fn(&e.Val, e.Touch(now))
	return true
}

// Touch moves the key's latest instant to now if now is later, and returns it: the
// instant Update gives its function. It requires the key's shard lock (Acquire); with
// Acquire and Release it is Update for a caller on a hot path, which a function value
// would cost a closure and a call.
func (e *Entry[V]) Touch(now int64) int64 {
	if now-e.Last > 0 {
		e.Last = now
	}
	return e.Last
}

// Peek calls fn with the value stored for key, if the key is present,
// without creating it, marking it used or checking its idle time, and
// reports whether it did. The rules for fn are those of Update.
func (s *Store[V]) Peek(key string, fn func(v *V, last int64)) bool {
	h, sh := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, key)
	if e == nil {
		return false
	}
	fn(&e.Val, e.Last)
	return true
}

// Remove drops key, reporting it to OnEvict with EvictRemoved, and reports
// whether it was present.
func (s *Store[V]) Remove(key string) bool {
	h, sh := s.shardFor(key)
	sh.mu.Lock()
	e := sh.find(h, key)
	if e != nil {
		sh.evict(e, EvictRemoved)
	}
	s.Release(sh)
	return e != nil
}

// Sweep drops up to max keys (no limit if max <= 0) that have been idle for
// IdleTimeout at instant now, from the least recently moved end of each
// shard, reports each to OnEvict with EvictIdle, and returns how many it
// dropped. In each shard it stops at the first key that is neither idle nor
// used since it was last moved: a used key moves to the front lazily, when a
// sweep or an eviction finds it (as many as the shard held when its sweep
// began, maxPromote under one hold of its lock), so an idle key may wait behind
// one that is neither until a later Sweep. A Store never sweeps on its own;
// call Sweep from a goroutine of yours when idle keys must be let go of
// promptly (for example to return what they hold).
func (s *Store[V]) Sweep(now int64, max int) int {
	idle := time.Duration(s.idle.Load())
	if idle <= 0 {
		return 0
	}
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		moves := -1 // the used keys the shard's sweep may still move; -1: not read yet
		for max <= 0 || total < max {
			batch := maxPending
			if max > 0 {
				batch = min(batch, max-total)
			}
			sh.mu.Lock()
			if moves < 0 {
				moves = sh.n
			}
			n, promoted := sh.sweep(now, idle, batch)
			s.Release(sh)
			total += n
			if moves -= promoted; n < batch && (promoted < maxPromote || moves <= 0) {
				break
			}
		}
	}
	return total
}

// Len returns the number of keys held.
func (s *Store[V]) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.len()
		sh.mu.Unlock()
	}
	return n
}

// Cap returns the most keys the Store holds.
func (s *Store[V]) Cap() int {
	n := 0
	for i := range s.shards {
		n += s.shards[i].cap
	}
	return n
}

// SetIdleTimeout changes the idle timeout; 0 disables idle expiry and a
// negative value is treated as 0. It applies to keys already held.
func (s *Store[V]) SetIdleTimeout(d time.Duration) {
	s.idle.Store(int64(max(d, 0)))
}

// IdleTimeout returns the idle timeout; 0 means keys never expire for
// being idle.
func (s *Store[V]) IdleTimeout() time.Duration {
	return time.Duration(s.idle.Load())
}

// Purge drops every key, reporting each to OnEvict with EvictPurged, and
// returns how many it dropped. The Store stays usable.
func (s *Store[V]) Purge() int {
	return s.purge(false)
}

// Close drops every key like Purge and closes the Store: Update then
// reports false and Len 0. Close is idempotent.
func (s *Store[V]) Close() {
	if s.closed.Swap(true) {
		return
	}
	s.purge(true)
}

func (s *Store[V]) purge(closing bool) int {
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		if closing {
			sh.closed = true
		}
		var out []eviction[V]
		n := sh.len()
		if s.onEvict != nil && n > 0 {
			out = make([]eviction[V], 0, n)
		}
		for e := sh.back; e != nil; {
			prev := e.prev
			if out != nil {
				out = append(out, eviction[V]{e, EvictPurged})
			}
			e.prev, e.next = nil, nil
			e = prev
		}
		sh.front, sh.back = nil, nil
		sh.reset(s.empty)
		sh.mu.Unlock()
		total += n
		for _, ev := range out {
			s.onEvict(ev.e.key, &ev.e.Val, ev.reason)
		}
	}
	return total
}

// Inspect runs fn under key's shard lock with the key's entry, or with nil if the key is
// not held or has been idle for the idle timeout; it neither creates the key nor makes it
// more recently used.
func (s *Store[V]) Inspect(key string, now int64, fn func(e *Entry[V])) {
	h, sh := s.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.find(h, key)
	if idle := time.Duration(s.idle.Load()); e == nil || sh.closed || idle > 0 && time.Duration(now-e.Last) >= idle {
		e = nil
	}
	fn(e)
}

// shardFor returns key's hash and its shard.
func (s *Store[V]) shardFor(key string) (uint64, *Shard[V]) {
	h := s.hasher.hash(key) & s.hashBits
	return h, &s.shards[h&s.mask]
}

// home returns the slot a key of hash h is looked for from, in a table of mask+1
// slots: bits 16 and up of the hash, which the shard (its low bits, a Store having at
// most 1<<16 shards) leaves to it, and below 40, where the table's bits start, in any
// table of fewer than 1<<24 slots.
func home(h, mask uint64) uint64 { return h >> 16 & mask }

// reset empties the shard's tables, making as many as its cap asks for.
func (sh *Shard[V]) reset(empty []slot[V]) {
	n := 1
	for n*tableKeys < sh.cap && n < maxTables {
		n <<= 1
	}
	if len(sh.tabs) != n {
		sh.tabs = make([]table[V], n)
		sh.tmask = uint64(n - 1)
	}
	for i := range sh.tabs {
		sh.tabs[i] = table[V]{slots: empty}
	}
	sh.n = 0
}

// table returns the table of the keys of hash h: bits 40 and up pick it, a fixed shift
// where one by the table count would cost a hit three instructions more for shifts of 64.
func (sh *Shard[V]) table(h uint64) *table[V] { return &sh.tabs[h>>40&sh.tmask] }

// find returns the entry of key, whose hash is h, or nil; it requires that sh.mu
// is held. Two keys of one hash (once in 2^64 pairs or so, but the Store must be
// right then too) are two slots, told apart by their keys.
func (sh *Shard[V]) find(h uint64, key string) *Entry[V] {
	slots := sh.table(h).slots
	mask := uint64(len(slots) - 1)
	for i := home(h, mask); ; i = (i + 1) & mask {
		if e := slots[i].e; e == nil || slots[i].h == h && e.key == key {
			return e
		}
	}
}

// len returns the number of keys the shard holds; it requires that sh.mu is held.
func (sh *Shard[V]) len() int { return sh.n }

// Acquire locks key's shard and returns the key's entry, created if needed
// (with e.Last = now); the caller advances e.Last (Entry.Touch) and must
// call Release(sh). ok is false, with nothing locked, if the Store is closed.
// It is Update without a function value, for a caller on a hot path.
//
// A hit does not move the key in the LRU list, which would touch two more
// entries' memory; it marks the entry used, and the eviction code moves a
// used entry to the front when it reaches the back (lazy promotion, as in
// CLOCK). The cap stays exact; the order is least recently used as of each
// key's last promotion.
func (s *Store[V]) Acquire(now int64, key string) (sh *Shard[V], e *Entry[V], ok bool) {
	h, sh := s.shardFor(key)
	sh.mu.Lock()
	if e = sh.find(h, key); e != nil && !sh.closed {
		if idle := s.idle.Load(); idle <= 0 || now-e.Last < idle {
			e.Used = true
			return sh, e, true
		}
	}
	return s.acquireSlow(sh, h, e, now, key)
}

// acquireSlow is acquire for a key that is absent (old is nil) or idle (old
// is its entry), or a closed Store; it requires that sh.mu is held.
func (s *Store[V]) acquireSlow(sh *Shard[V], h uint64, old *Entry[V], now int64, key string) (*Shard[V], *Entry[V], bool) {
	if sh.closed {
		sh.mu.Unlock()
		return nil, nil, false
	}
	idle := time.Duration(s.idle.Load())
	if old != nil {
		// Idle for too long: the key starts afresh.
		sh.evict(old, EvictIdle)
	}
	if idle > 0 {
		sh.sweep(now, idle, sweepOnInsert)
	}
	// len <= cap always holds, so the shard can only be full here if this
	// call evicted nothing yet: the pending buffer has room.
	if sh.len() >= sh.cap {
		sh.evict(sh.oldest(), EvictCapacity)
	}
	e := &Entry[V]{Last: now}
	// A copy: the caller's buffer must not be pinned, nor change under the key.
	if len(key) <= inlineKey {
		n := copy(e.kb[:], key)
		key = unsafe.String(&e.kb[0], n)
	} else {
		key = strings.Clone(key)
	}
	if s.init != nil {
		s.init(&e.Val, key, now)
	}
	sh.add(key, h, e)
	return sh, e, true
}

// Release unlocks sh and reports the evictions recorded under the lock.
func (s *Store[V]) Release(sh *Shard[V]) {
	if sh.npend == 0 {
		sh.mu.Unlock()
		return
	}
	pend := sh.pending
	n := sh.npend
	sh.pending = [maxPending]eviction[V]{}
	sh.npend = 0
	sh.mu.Unlock()
	if s.onEvict == nil {
		return
	}
	for _, ev := range pend[:n] {
		s.onEvict(ev.e.key, &ev.e.Val, ev.reason)
	}
}

// evict takes e out of the shard and records its eviction, to report once the
// lock is released; it requires that sh.mu is held and that fewer than
// maxPending are recorded.
func (sh *Shard[V]) evict(e *Entry[V], reason EvictReason) {
	sh.remove(e)
	sh.pending[sh.npend] = eviction[V]{e, reason}
	sh.npend++
}

// sweep drops up to max of the least recently used keys that are idle at
// now, and returns how many it dropped and how many used keys it moved; it
// stops at the first key that is neither idle nor used since its last move (a
// used one is moved to the front, up to maxPromote of them). It requires that
// sh.mu is held and room for max evictions.
func (sh *Shard[V]) sweep(now int64, idle time.Duration, max int) (n, promoted int) {
	for n < max && sh.npend < maxPending {
		e := sh.back
		switch {
		case e == nil:
			return n, promoted
		case time.Duration(now-e.Last) >= idle:
			sh.evict(e, EvictIdle)
			n++
		case e.Used && promoted < maxPromote:
			e.Used = false
			sh.toFront(e)
			promoted++
		default:
			return n, promoted
		}
	}
	return n, promoted
}

// maxPromote bounds the work of one oldest call.
const maxPromote = 8

// oldest returns the least recently used entry of a non-empty shard,
// first moving entries used since their last move to the front (at most
// maxPromote of them); it requires that sh.mu is held.
func (sh *Shard[V]) oldest() *Entry[V] {
	for range maxPromote {
		e := sh.back
		if !e.Used {
			return e
		}
		e.Used = false
		sh.toFront(e)
	}
	return sh.back
}

// add puts e, new, in the shard under key, whose hash is h, at the front of the
// LRU list; it requires that sh.mu is held and that key is not held.
func (sh *Shard[V]) add(key string, h uint64, e *Entry[V]) {
	e.key, e.hash = key, h
	t := sh.table(h)
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	t.place(slot[V]{h, e})
	t.n++
	sh.n++
	sh.pushFront(e)
}

// place puts s in the first free slot from its home; the table must have one.
func (t *table[V]) place(s slot[V]) {
	mask := uint64(len(t.slots) - 1)
	i := home(s.h, mask)
	for t.slots[i].e != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

// grow doubles the table (to minSlots from the Store's free slot), placing every key
// afresh.
func (t *table[V]) grow() {
	old := t.slots
	t.slots = make([]slot[V], max(minSlots, 2*len(old)))
	for _, s := range old {
		if s.e != nil {
			t.place(s)
		}
	}
}

// remove takes e out of the shard; it requires that sh.mu is held. The slots
// after e's, up to the next free one, move back where that keeps each at or
// after its home (backward-shift deletion), so a table needs no tombstones.
func (sh *Shard[V]) remove(e *Entry[V]) {
	t := sh.table(e.hash)
	mask := uint64(len(t.slots) - 1)
	i := home(e.hash, mask)
	for t.slots[i].e != e {
		i = (i + 1) & mask
	}
	for j := i; ; {
		j = (j + 1) & mask
		s := t.slots[j]
		if s.e == nil {
			break
		}
		// s may fill the gap at i unless its home lies in (i, j], cyclically.
		if (j-home(s.h, mask))&mask < (j-i)&mask {
			continue
		}
		t.slots[i] = s
		i = j
	}
	t.slots[i] = slot[V]{}
	t.n--
	sh.n--
	sh.unlink(e)
}

// toFront moves e to the front of the LRU list; it requires that sh.mu is
// held.
func (sh *Shard[V]) toFront(e *Entry[V]) {
	if sh.front != e {
		sh.unlink(e)
		sh.pushFront(e)
	}
}

func (sh *Shard[V]) pushFront(e *Entry[V]) {
	e.prev, e.next = nil, sh.front
	if sh.front != nil {
		sh.front.prev = e
	} else {
		sh.back = e
	}
	sh.front = e
}

func (sh *Shard[V]) unlink(e *Entry[V]) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		sh.front = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		sh.back = e.prev
	}
	e.prev, e.next = nil, nil
}
