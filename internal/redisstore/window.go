package redisstore

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Windowed limits.
//
// A windowed limit admits a key Burst requests per window of Burst/Rate, each key's
// windows offset by a phase of its own (wire.WindowPhase), on Redis's clock. Redis keeps,
// per limit, shard of its keys (wire.WindowShards) and window, one counter array for
// every key of the shard: a count-min sketch
// of two rows of BITFIELD counters at hashes of the key, so that a key's count, the
// smaller of its two counters, is at least its true count (a collision only denies), and
// a third row counting the requests of keys over their limit. No script runs: a server's
// round trip is, per shard, a transaction of one BITFIELD per window it touches, the
// shard's sorted set of marks (which keys are low, spent or over) that every server adds
// to and reads, and Redis's TIME. Store.Windows makes that round trip; what a server does with the counts
// is the windowed mode of package hybrid.

// Limits of a WindowTrip.
const (
	// MinWindowWidth and MaxWindowWidth bound WindowTrip.Width (ShardWidth).
	MinWindowWidth = 1 << 4
	MaxWindowWidth = 1 << 20
	// MaxWindowShards bounds WindowTrip.Shards.
	MaxWindowShards = 1 << 10
	// MaxWindowOps is the most ops one WindowTrip may carry.
	MaxWindowOps = 1 << 14
	// MaxWindowBurst is the largest Burst of a windowed limit: a count may pass the burst
	// by what servers admitted before hearing of it, and counters saturate at 2^32 - 1.
	MaxWindowBurst = 1 << 30
	// MaxMarksRead is the most marks one read returns, the oldest first: a reader that
	// got that many reads again from the last one's time.
	MaxMarksRead = 10000
)

// WindowOp is one change to a key's count in a WindowTrip: N added to the count of key ID
// in its window Win (wire.WindowIndex on Redis's clock), or taken back when negative.
// Counts saturate at 0 and at the counters' top (wire.WindowBits).
type WindowOp struct {
	ID  KeyID
	Win int64
	N   int
	// Demand counts N in the window's demand row instead of its count: the requests of a
	// key over its limit, which a server turns into odds of admitting it.
	Demand bool
	// Count is the answer: the key's count in Win after N (of the demand row with Demand).
	Count int
}

// WindowMark is what a server tells the others of a key of a windowed limit, and what it
// reads back of theirs.
type WindowMark struct {
	ID KeyID
	// Flags are wire.MarkLow (low until window Win ends), wire.MarkSpent (window Win
	// spent) and wire.MarkOver (over its limit for WindowTrip.Memory from At).
	Flags int
	Win   int64
	// At is when the mark was recorded, on Redis's clock as its writer estimated it
	// (WindowTrip.At); read marks only.
	At time.Time
}

// A WindowTrip is one round trip of a server for a windowed limit: counts to add, marks
// to record and read, Redis's time. Windows fills in the answers.
type WindowTrip struct {
	// Limit is the windowed limit: Burst requests per window of Burst/Rate. Its Burst is
	// at most MaxWindowBurst.
	Limit Limit
	// Width is the counters per row of each of the limit's arrays (one per shard and
	// window): a power of two from MinWindowWidth to MaxWindowWidth. Every server of the
	// limit must use the same. An array takes WindowRows × Width counters of
	// wire.WindowBits(Burst) bits.
	Width int
	// Shards is how many shards the limit's keys are counted in (0 or 1: one, the
	// unsharded format; at most MaxWindowShards), and Shard the one this trip works on:
	// every op is of a key of that shard (wire.WindowShard), and every mark of a key
	// whose marks it holds (wire.WindowMarksShard). Every server of the limit that counts
	// in the same keys must use the same.
	Shards, Shard int
	// Ops are the counts to change, in order. Their Count fields are answers.
	Ops []WindowOp
	// Marks are added to the limit's set of marks, recorded at At. A key has one mark
	// per window (wire.MarkMember): the last server to mark it for that window sets its
	// flags, and a reader reads it once however many servers marked it.
	Marks []WindowMark
	// Read asks for the marks recorded at Since or later (zero: every mark kept), the
	// oldest first; Windows appends them to Got. A reader that reads again from a little
	// before its last read's time misses no mark of a writer whose clock estimate is
	// off by less than that.
	Read  bool
	Since time.Time
	// Skip leaves out the first Skip members recorded at Since or later: what a read
	// that resumes within one millisecond's marks has read of them (Resume).
	Skip int
	// Memory is how long the set keeps a mark, at least 1ms when Marks, Read or Tidy
	// are set.
	Memory time.Duration
	// Tidy drops the marks recorded more than Memory before At and sets the set to expire
	// Memory from now. Once a second or so is plenty; it requires At.
	Tidy bool
	// Clock asks for Redis's time, answered in Now.
	Clock bool
	// At is the caller's estimate of Redis's time: when its marks are recorded. It is
	// required with Marks.
	At time.Time

	// Now is Redis's time (TIME) when the trip ran, if Clock was set.
	Now time.Time
	// Got are the marks read, oldest first. A member of the set that does not decode as
	// a mark (written by another program) is left out, and counted in Skipped: it must
	// not fail the trip, whose counts ran, nor stop the reads of the marks after it.
	Got     []WindowMark
	Skipped int
	// More reports that the read returned MaxMarksRead members, so that more may follow:
	// the next read goes from Resume, skipping ResumeSkip members there (Since, Skip).
	// One writer records all its marks of a trip in one millisecond, and a read from a
	// millisecond reads all of it: a millisecond of MaxMarksRead marks or more is read
	// through by skipping what was read of it, not read again without end.
	More       bool
	Resume     time.Time
	ResumeSkip int
}

// checkWindowTrip reports what is wrong with t, wrapping ErrInvalidLimit.
func checkWindowTrip(t *WindowTrip) error {
	if err := t.Limit.Validate(); err != nil {
		return err
	}
	l := t.Limit
	if l.Burst > MaxWindowBurst {
		return fmt.Errorf("%w: windowed limit %q: burst %d above %d", storeerr.ErrInvalidLimit, l.Name, l.Burst, MaxWindowBurst)
	}
	if t.Width < MinWindowWidth || t.Width > MaxWindowWidth || t.Width&(t.Width-1) != 0 {
		return fmt.Errorf("%w: windowed limit %q: width %d is not a power of two from %d to %d",
			storeerr.ErrInvalidLimit, l.Name, t.Width, MinWindowWidth, MaxWindowWidth)
	}
	if !validShard(t.Shards, t.Shard) {
		return fmt.Errorf("%w: windowed limit %q: shard %d of %d (at most %d shards)", storeerr.ErrInvalidLimit, l.Name, t.Shard, t.Shards, MaxWindowShards)
	}
	if len(t.Ops) > MaxWindowOps {
		return fmt.Errorf("%w: windowed limit %q: %d ops, more than %d", storeerr.ErrInvalidLimit, l.Name, len(t.Ops), MaxWindowOps)
	}
	if t.Skip < 0 {
		return fmt.Errorf("%w: windowed limit %q: skip %d of the marks", storeerr.ErrInvalidLimit, l.Name, t.Skip)
	}
	if (len(t.Marks) > 0 || t.Read || t.Tidy) && t.Memory < time.Millisecond {
		return fmt.Errorf("%w: windowed limit %q: mark memory %v is shorter than 1ms", storeerr.ErrInvalidLimit, l.Name, t.Memory)
	}
	for _, op := range t.Ops {
		if !validID(string(op.ID)) {
			return fmt.Errorf("%w: key ID %q is not one IDOf returns", storeerr.ErrInvalidLimit, op.ID)
		}
		if wire.WindowShard(string(op.ID), t.Shards) != t.Shard {
			return fmt.Errorf("%w: windowed limit %q: key ID %q is not of shard %d of %d", storeerr.ErrInvalidLimit, l.Name, op.ID, t.Shard, t.Shards)
		}
		if op.Win < 0 || op.N < -MaxWindowBurst || op.N > MaxWindowBurst {
			return fmt.Errorf("%w: windowed limit %q: op window %d, count %d", storeerr.ErrInvalidLimit, l.Name, op.Win, op.N)
		}
	}
	for _, m := range t.Marks {
		if !validID(string(m.ID)) {
			return fmt.Errorf("%w: key ID %q is not one IDOf returns", storeerr.ErrInvalidLimit, m.ID)
		}
		if wire.WindowMarksShard(string(m.ID), t.Shards) != t.Shard {
			return fmt.Errorf("%w: windowed limit %q: key ID %q's marks are not in shard %d of %d", storeerr.ErrInvalidLimit, l.Name, m.ID, t.Shard, t.Shards)
		}
		if m.Flags == 0 || m.Flags&^(wire.MarkLow|wire.MarkSpent|wire.MarkOver) != 0 || m.Win < 0 {
			return fmt.Errorf("%w: windowed limit %q: mark flags %d, window %d", storeerr.ErrInvalidLimit, l.Name, m.Flags, m.Win)
		}
	}
	if (len(t.Marks) > 0 || t.Tidy) && t.At.IsZero() {
		return fmt.Errorf("%w: windowed limit %q: marks and Tidy need At, Redis's time", storeerr.ErrInvalidLimit, l.Name)
	}
	return nil
}

// validID is wire.ValidID(id), at a few nanoseconds for a key stored as it is (a short
// key without braces, the common case) instead of thirty: a trip checks every key of
// its ops and marks. Anything else goes to wire.ValidID.
func validID(id string) bool {
	if len(id) > wire.MaxKeyLen {
		return wire.ValidID(id)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c == '{' || c == '}' {
			return wire.ValidID(id)
		}
	}
	return true
}

// txPipeliner is implemented by every go-redis client (Client, ClusterClient, Ring): a
// pipeline wrapped in MULTI/EXEC, one per slot on a Cluster.
type txPipeliner interface {
	TxPipeline() redis.Pipeliner
}

// windowArray is one BITFIELD of a WindowTrip: the ops of one window.
type windowArray struct {
	win  int64
	key  string
	rows int // counters it changes
	next int // its next value to read
	args []any
	cmd  *redis.IntSliceCmd
	vals []int64 // its answer
}

// windowScratch is what queueing a WindowTrip's commands needs for its arguments,
// reused from trip to trip (windowScratchPool): with go-redis, a command's arguments
// are a []any, and an int, a float or a string put in one costs an allocation, a
// pointer none. Every number and string of a command goes as a pointer into these
// arrays, each sized before the first pointer into it is taken, and a trip's
// commands share one argument array: building a trip allocates nothing per key.
type windowScratch struct {
	args    []any
	nums    []int     // every counter's bit offset and increment
	scores  []float64 // every mark's score
	members []string  // every mark's member, substrings of one string
	buf     []byte    // the members, back to back
	ends    []int     // by mark: where its member ends in buf
	which   []int32   // by op: its array
	arrays  []windowArray
}

var windowScratchPool = sync.Pool{New: func() any { return new(windowScratch) }}

// maxPooledArgs bounds the argument array a scratch keeps in the pool: a trip of
// MaxWindowOps takes one of about 2^17 arguments (2 MB), which should not stay.
const maxPooledArgs = 1 << 15

// release puts sc back in the pool, without what its arrays point to, unless one of
// its arrays grew past what a common trip needs.
func (sc *windowScratch) release() {
	if max(cap(sc.args), cap(sc.nums), cap(sc.buf)/8, 2*cap(sc.scores), 2*cap(sc.ends), 2*cap(sc.which)) > maxPooledArgs {
		return
	}
	clear(sc.args)
	clear(sc.members)
	clear(sc.arrays)
	sc.args, sc.members, sc.arrays = sc.args[:0], sc.members[:0], sc.arrays[:0]
	windowScratchPool.Put(sc)
}

// scratches returns n scratches from the pool, and what puts them back once the trips
// that use them are read.
func scratches(n int) ([]*windowScratch, func()) {
	sc := make([]*windowScratch, n)
	for k := range sc {
		sc[k] = windowScratchPool.Get().(*windowScratch)
	}
	return sc, func() {
		for _, x := range sc {
			x.release()
		}
	}
}

// sized returns s with length n, reusing its array when it is large enough.
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// Windows makes t's round trip: one transaction (MULTI/EXEC, pipelined) of TIME (if
// t.Clock), a BITFIELD per window its ops touch (OVERFLOW SAT, one INCRBY per row an op
// counts in), each followed by the array's deadline (PEXPIREAT at the end of the window
// after it, plus a second, on Redis's clock, so every server sets the same), a ZADD of
// its marks, the set's trim (ZREMRANGEBYSCORE) if t.Tidy, the set's expiry (PEXPIRE
// Memory) with marks or t.Tidy, and a ZRANGEBYSCORE of the marks from t.Since. Every key
// it writes expires, and gets its deadline in the same atomic step that may create it:
// no fault (a killed connection, a stopped or restarted Redis, a cut link) can leave an
// array or the set without one, as it could between two commands of a plain pipeline.
// Every key of t is in its shard (t.Shard of t.Shards), under one hash tag: one slot.
//
// It fills in each op's Count, and t.Now and t.Got as asked. An invalid trip is
// refused with an error wrapping ErrInvalidLimit before any call. Otherwise the error is
// the first command's that failed, classed as every Store error is; the trip may then
// have been carried out in part, and its answers are not to be used. The client must be
// able to run a transaction (every go-redis client can); a Cluster reaches the one node
// that holds the shard's slot.
func (s *Store) Windows(ctx context.Context, t *WindowTrip) error {
	ts, errs := []WindowTrip{*t}, []error{nil}
	s.WindowsBatch(ctx, ts, errs)
	*t = ts[0]
	return errs[0]
}

// validShard reports whether shard is one of shards (0 or 1: one; at most
// MaxWindowShards), the sets a limit's shared structure is split into.
func validShard(shards, shard int) bool {
	return shards >= 0 && shards <= MaxWindowShards && shard >= 0 && shard < max(1, shards)
}

// ShardWidth is WindowTrip.Width, the counters per row of a shard's array, for a limit
// of width counters a row over shards (0 or 1: one): width/shards rounded down to a power
// of two (a key's counter is its hash masked), at least MinWindowWidth. Every server and
// tool that reads a limit's arrays computes it so.
func ShardWidth(width, shards int) int {
	n := width / max(shards, 1)
	if n < MinWindowWidth {
		return MinWindowWidth
	}
	return 1 << (bits.Len(uint(n)) - 1)
}

// WindowsBatch makes the round trips ts at once, as Windows makes each, writing each
// one's error to errs[i], and returns the first. On a plain client (one Redis, or
// Sentinel) they are one transaction and one round trip. On a Cluster, whose
// transactions hold the keys of one slot, each trip is a transaction of its own, and the
// trips one master serves go to it in one round trip, the masters' all at once: a
// limit's 60 shards cost a round trip per master, not per shard, and one master's
// failure fails only its trips (a client that retries or follows MOVED makes a round
// trip per trip: nodePipelines). On a Ring each trip is a round trip of its own, all at
// once.
func (s *Store) WindowsBatch(ctx context.Context, ts []WindowTrip, errs []error) error {
	tx, ok := s.pipe.(txPipeliner)
	if !ok {
		err := fmt.Errorf("%w: Windows needs a client that runs transactions (TxPipeline)", storeerr.ErrInvalidConfig)
		for i := range errs {
			errs[i] = err
		}
		return err
	}
	var valid []int
	for i := range ts {
		if errs[i] = checkWindowTrip(&ts[i]); errs[i] == nil {
			valid = append(valid, i)
		}
	}
	if cc, ok := s.pipe.(*redis.ClusterClient); ok && nodePipelines(cc) {
		s.windowsCluster(ctx, cc, ts, valid, errs)
	} else if _, plain := s.pipe.(*redis.Client); plain || len(valid) == 1 {
		s.windowsTx(ctx, tx, ts, valid, errs)
	} else {
		var wg sync.WaitGroup
		for _, i := range valid {
			wg.Go(func() { s.windowsTx(ctx, tx, ts, []int{i}, errs) })
		}
		wg.Wait()
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// windowsTx makes the trips ts[idx] in one transaction and writes their errors to errs.
func (s *Store) windowsTx(ctx context.Context, tx txPipeliner, ts []WindowTrip, idx []int, errs []error) {
	if len(idx) == 0 {
		return
	}
	pipe := tx.TxPipeline()
	reads := make([]func() error, len(idx))
	ends := make([]int, len(idx)) // trip k's commands end at ends[k] in the transaction
	scratch, release := scratches(len(idx))
	defer release()
	for k, i := range idx {
		reads[k] = s.queueWindows(ctx, pipe, &ts[i], scratch[k])
		ends[k] = pipe.Len()
	}
	// Exec's error is the first command's: each trip reads its own. A command that
	// failed as EXEC ran it (one limit's key of another type: WRONGTYPE) fails its own
	// trip alone: the others' commands ran, and their counts must not be sent again. A
	// transaction that failed whole (EXECABORT, no answer) fails each trip through its
	// commands' errors, which go-redis sets to that failure.
	cmds, _ := pipe.Exec(ctx)
	start := 0
	for k, i := range idx {
		var own error // Exec returns every command queued, each with its error
		for _, c := range cmds[start:ends[k]] {
			if own = c.Err(); own != nil {
				break
			}
		}
		start = ends[k]
		switch {
		case own == nil:
			errs[i] = reads[k]()
		case strings.HasPrefix(own.Error(), "redis: can't parse"):
			// The server answered, but not as many replies as the transaction's
			// commands: one it does not know, refused at MULTI without marking the
			// transaction failed (miniredis without BITFIELD does). An answer that
			// waiting will not change, not an unavailable Redis; go-redis closes the
			// connection.
			errs[i] = unexpected("windows", own.Error())
		default:
			errs[i] = wrap("windows", own)
		}
	}
}

// nodePipelines reports whether the trips on cc may go as windowsCluster sends them,
// in a pipeline on a node's client: go-redis sends such a pipeline again after a reply
// it lost when the client retries (ClusterOptions.MaxRetries, which global.RetryingClient
// allows), which would run its transactions twice, and it does not follow MOVED, which
// a client with MaxRedirects asks for. On such a client each trip is a Cluster
// transaction of its own, which go-redis does not send again once it is written.
func nodePipelines(cc *redis.ClusterClient) bool {
	o := cc.Options()
	return o.MaxRetries < 0 && o.MaxRedirects <= 0
}

// windowsCluster makes the trips ts[idx] on a Cluster: those whose shard one master
// serves in one round trip to it (windowsNode), the masters' at once.
func (s *Store) windowsCluster(ctx context.Context, cc *redis.ClusterClient, ts []WindowTrip, idx []int, errs []error) {
	type group struct {
		node *redis.Client
		idx  []int
	}
	var groups []group
	for _, i := range idx {
		t := &ts[i]
		node, err := cc.MasterForKey(ctx, wire.MarksKey(s.prefix, t.Limit.Name, max(1, t.Shards), t.Shard))
		if err != nil {
			errs[i] = wrap("windows", err)
			continue
		}
		k := slices.IndexFunc(groups, func(g group) bool { return g.node == node })
		if k < 0 {
			groups, k = append(groups, group{node: node}), len(groups)
		}
		groups[k].idx = append(groups[k].idx, i)
	}
	if len(groups) == 1 {
		s.windowsNode(ctx, cc, groups[0].node, ts, groups[0].idx, errs)
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Go(func() { s.windowsNode(ctx, cc, g.node, ts, g.idx, errs) })
	}
	wg.Wait()
}

// windowsNode makes the trips ts[idx], every one on a slot node serves, in one round
// trip to node: a pipeline of one transaction (MULTI, the trip's commands, EXEC) per
// trip, so each trip is as atomic as windowsTx makes it. go-redis runs a Cluster's
// transaction on one slot at a time, so the trip's commands are queued as windowsTx
// queues them, sent as plain commands between MULTI and EXEC, and EXEC's answer read
// back into them (setReply) before their trip reads it. The Cluster client's hooks do
// not see a node's call: a call that fails unavailable (the node down, a slot moved)
// asks cc to reload its slot map, as the hook New adds does.
func (s *Store) windowsNode(ctx context.Context, cc *redis.ClusterClient, node *redis.Client, ts []WindowTrip, idx []int, errs []error) {
	queue, pipe := node.Pipeline(), node.Pipeline() // queue is never run: it collects the commands
	blocks := make([]windowBlock, len(idx))
	scratch, release := scratches(len(idx))
	defer release()
	for k, i := range idx {
		from := queue.Len()
		b := &blocks[k]
		b.read = s.queueWindows(ctx, queue, &ts[i], scratch[k])
		b.cmds = queue.Cmds()[from:]
		b.multi = pipe.Do(ctx, "multi")
		b.sent = make([]*redis.Cmd, len(b.cmds))
		for j, c := range b.cmds {
			b.sent[j] = redis.NewCmd(ctx, c.Args()...)
			_ = pipe.Process(ctx, b.sent[j])
		}
		b.exec = pipe.Do(ctx, "exec")
	}
	_, _ = pipe.Exec(ctx) // each trip's error is its own, below
	reload := false
	for k, i := range idx {
		errs[i] = blocks[k].answer()
		reload = reload || storeerr.IsUnavailable(errs[i])
	}
	if reload {
		cc.ReloadState(ctx)
	}
}

// windowBlock is one trip's transaction in windowsNode's pipeline.
type windowBlock struct {
	cmds  []redis.Cmder // the trip's commands, as queueWindows made them
	sent  []*redis.Cmd  // the same, as sent: each one's answer is QUEUED
	multi *redis.Cmd
	exec  *redis.Cmd
	read  func() error
}

// answer reads the transaction's answer into the trip and returns the trip's error.
// EXEC's answer, once read whole, is the trip's, whatever error go-redis gave the
// command after it (a pipeline whose connection fails part way gives its error to every
// command, the ones it read too): the trip ran, and its counts must not be sent again.
// Without it, the error is MULTI's (the commands may have run one by one), else the first
// of the commands' (one refused while queued, as MOVED, aborts the transaction), else
// EXEC's.
func (b *windowBlock) answer() error {
	vals, ok := b.exec.Val().([]any)
	if !ok || len(vals) != len(b.cmds) {
		if err := b.multi.Err(); err != nil {
			return wrap("windows", err)
		}
		for _, c := range b.sent {
			if c.Err() != nil {
				return wrap("windows", c.Err())
			}
		}
		if err := b.exec.Err(); err != nil {
			return wrap("windows", err)
		}
		return unexpected("windows", fmt.Sprintf("EXEC: %d answers for %d commands", len(vals), len(b.cmds)))
	}
	for j, c := range b.cmds {
		if err := setReply(c, vals[j]); err != nil {
			return err
		}
	}
	return b.read()
}

// setReply sets c's answer to v, an element of EXEC's answer as go-redis reads it for a
// command it does not know (RESP2 or RESP3), for the commands queueWindows sends.
func setReply(c redis.Cmder, v any) error {
	if err, ok := v.(error); ok {
		c.SetErr(err)
		return wrap("windows", err)
	}
	bad := func() error { return unexpected("windows", fmt.Sprintf("%s: %T", c.Name(), v)) }
	switch c := c.(type) {
	case *redis.IntSliceCmd: // BITFIELD
		a, ok := v.([]any)
		if !ok {
			return bad()
		}
		vals := make([]int64, len(a))
		for i, x := range a {
			if x == nil {
				continue
			}
			if vals[i], ok = x.(int64); !ok {
				return bad()
			}
		}
		c.SetVal(vals)
	case *redis.TimeCmd:
		a, ok := v.([]any)
		if !ok || len(a) != 2 {
			return bad()
		}
		sec, err1 := strconv.ParseInt(fmt.Sprint(a[0]), 10, 64)
		usec, err2 := strconv.ParseInt(fmt.Sprint(a[1]), 10, 64)
		if err1 != nil || err2 != nil {
			return bad()
		}
		c.SetVal(time.Unix(sec, usec*1000))
	case *redis.ZSliceCmd: // ZRANGEBYSCORE WITHSCORES: pairs (RESP3) or flat (RESP2)
		a, ok := v.([]any)
		if !ok {
			return bad()
		}
		var zs []redis.Z
		for i := 0; i < len(a); i++ {
			var member, score any
			if pair, ok := a[i].([]any); ok && len(pair) == 2 {
				member, score = pair[0], pair[1]
			} else if i+1 < len(a) {
				member, score = a[i], a[i+1]
				i++
			} else {
				return bad()
			}
			z := redis.Z{Member: member}
			switch x := score.(type) {
			case float64:
				z.Score = x
			case string:
				f, err := strconv.ParseFloat(x, 64)
				if err != nil {
					return bad()
				}
				z.Score = f
			default:
				return bad()
			}
			zs = append(zs, z)
		}
		c.SetVal(zs)
	case *redis.IntCmd, *redis.BoolCmd: // ZADD, ZREMRANGEBYSCORE, PEXPIRE(AT): not read
	default:
		return bad()
	}
	return nil
}

// queueWindows adds the commands of t, a valid trip, to pipe, their arguments in sc,
// and returns what reads their answers into t once pipe has run; sc is not to be used
// again before then.
func (s *Store) queueWindows(ctx context.Context, pipe redis.Pipeliner, t *WindowTrip, sc *windowScratch) func() error {
	lim := t.Limit
	w := wire.WindowMicros(lim.Rate, lim.Burst)
	bits := wire.WindowBits(lim.Burst)
	var typ any // the counters' type, boxed once
	switch bits {
	case 16:
		typ = "u16"
	case 32:
		typ = "u32"
	default:
		typ = "u" + strconv.Itoa(bits)
	}

	var clock *redis.TimeCmd
	if t.Clock {
		clock = pipe.Time(ctx)
	}
	// The arrays, in the order of their first op, and the counters each changes.
	sc.which = sized(sc.which, len(t.Ops))
	arrays := sc.arrays[:0]
	rows := 0
	for i, op := range t.Ops {
		j := 0
		for j < len(arrays) && arrays[j].win != op.Win {
			j++
		}
		if j == len(arrays) {
			arrays = append(arrays, windowArray{win: op.Win})
		}
		sc.which[i] = int32(j)
		n := 2
		if op.Demand {
			n = 1
		}
		arrays[j].rows += n
		rows += n
	}
	sc.arrays = arrays
	// Every argument of the BITFIELDs and of the ZADD, in one array: a BITFIELD takes
	// its name, its key, OVERFLOW SAT and INCRBY <type> <offset> <increment> a counter.
	nargs := 4*len(arrays) + 4*rows
	if len(t.Marks) > 0 {
		nargs += 2 + 2*len(t.Marks)
	}
	sc.args = sized(sc.args, nargs)
	sc.nums = sized(sc.nums, 2*rows)
	shards := max(1, t.Shards)
	at := 0
	for j := range arrays {
		a := &arrays[j]
		end := at + 4 + 4*a.rows
		a.key = wire.WindowKey(s.prefix, lim.Name, shards, t.Shard, w, a.win)
		a.args = append(sc.args[at:at:end], "bitfield", a.key, "OVERFLOW", "SAT")
		at = end
	}
	nums := sc.nums[:0]
	for i, op := range t.Ops {
		a := &arrays[sc.which[i]]
		id, k := string(op.ID), len(nums)
		// each counter's bit offset (= "#counter") and increment
		if op.Demand {
			nums = append(nums, wire.WindowCounter(id, wire.DemandRow, t.Width)*bits, op.N)
		} else {
			nums = append(nums, wire.WindowCounter(id, 0, t.Width)*bits, op.N, wire.WindowCounter(id, 1, t.Width)*bits, op.N)
		}
		for ; k < len(nums); k += 2 {
			a.args = append(a.args, "INCRBY", typ, &nums[k], &nums[k+1])
		}
	}
	for j := range arrays {
		a := &arrays[j]
		a.cmd = redis.NewIntSliceCmd(ctx, a.args...)
		_ = pipe.Process(ctx, a.cmd)
		// With every BITFIELD, right after it in the same transaction: any BITFIELD may
		// make the array (the first, or one after a restart, a FLUSHALL, an eviction, or
		// one that ran late, after its array expired), and none may leave it without a
		// deadline. The array is of no use once window a.win has ended for every phase; a
		// deadline already past deletes what a late BITFIELD made.
		end := (a.win + 2) * w
		pipe.PExpireAt(ctx, a.key, time.UnixMicro(end).Add(time.Second))
	}
	marks := wire.MarksKey(s.prefix, lim.Name, shards, t.Shard)
	if len(t.Marks) > 0 {
		// ZADD <key> <score> <member>..., as go-redis's ZAdd writes it; the members are
		// substrings of one string.
		ms := t.At.UnixMilli()
		sc.scores = sized(sc.scores, len(t.Marks))
		sc.members = sized(sc.members, len(t.Marks))
		sc.ends = sized(sc.ends, len(t.Marks))
		buf := sc.buf[:0]
		for i, m := range t.Marks {
			buf = appendMarkMember(buf, m.Win, string(m.ID))
			sc.ends[i] = len(buf)
		}
		sc.buf = buf
		all, from := string(buf), 0
		zadd := append(sc.args[at:at:nargs], "zadd", marks)
		for i, m := range t.Marks {
			sc.scores[i] = wire.MarkScore(ms, m.Flags)
			sc.members[i], from = all[from:sc.ends[i]], sc.ends[i]
			zadd = append(zadd, &sc.scores[i], &sc.members[i])
		}
		_ = pipe.Process(ctx, redis.NewIntCmd(ctx, zadd...))
	}
	if t.Tidy {
		old := wire.MarkScore(t.At.Add(-t.Memory).UnixMilli(), 0)
		pipe.ZRemRangeByScore(ctx, marks, "-inf", "("+strconv.FormatFloat(old, 'f', -1, 64))
	}
	if len(t.Marks) > 0 || t.Tidy { // a ZADD may make the set: never without a deadline
		pipe.PExpire(ctx, marks, t.Memory)
	}
	var read *redis.ZSliceCmd
	if t.Read {
		from := "-inf"
		if !t.Since.IsZero() {
			from = strconv.FormatFloat(wire.MarkScore(t.Since.UnixMilli(), 0), 'f', -1, 64)
		}
		read = pipe.ZRangeByScoreWithScores(ctx, marks, &redis.ZRangeBy{Min: from, Max: "+inf", Offset: int64(t.Skip), Count: MaxMarksRead})
	}
	return func() error {
		if clock != nil {
			t.Now = clock.Val()
		}
		// An array's values are its ops' counters, in order.
		for j := range arrays {
			arrays[j].vals = arrays[j].cmd.Val()
		}
		for i := range t.Ops {
			op, a := &t.Ops[i], &arrays[sc.which[i]]
			v, k := a.vals, a.next
			if op.Demand {
				if k >= len(v) {
					return unexpected("windows", "BITFIELD: too few values")
				}
				op.Count, a.next = int(v[k]), k+1
				continue
			}
			if k+1 >= len(v) {
				return unexpected("windows", "BITFIELD: too few values")
			}
			op.Count, a.next = int(min(v[k], v[k+1])), k+2
		}
		if read != nil {
			t.readMarks(read.Val())
		}
		return nil
	}
}

// appendMarkMember appends wire.MarkMember(win, id) to b.
func appendMarkMember(b []byte, win int64, id string) []byte {
	b = strconv.AppendInt(b, win, 10)
	b = append(b, ':')
	return append(b, id...)
}

// readMarks decodes a ZRANGEBYSCORE WITHSCORES of the marks into t.Got, leaving out
// (and counting in t.Skipped) the members that are not marks, and says where the next
// read goes if more may follow (More).
func (t *WindowTrip) readMarks(zs []redis.Z) {
	if len(zs) >= MaxMarksRead {
		// From the last member's millisecond, past the members of it read already: this
		// read's, and, when it began in that millisecond, those it skipped.
		ms := int64(math.Floor(zs[len(zs)-1].Score / 8))
		from := wire.MarkScore(ms, 0)
		n := 0
		for i := len(zs) - 1; i >= 0 && zs[i].Score >= from; i-- {
			n++
		}
		if !t.Since.IsZero() && t.Since.UnixMilli() == ms {
			n += t.Skip
		}
		t.More, t.Resume, t.ResumeSkip = true, time.UnixMilli(ms), n
	}
	for _, z := range zs {
		member, ok := z.Member.(string)
		if !ok {
			t.Skipped++
			continue
		}
		flags, win, id, ms, err := wire.ParseMark(member, z.Score)
		if err != nil {
			t.Skipped++
			continue
		}
		t.Got = append(t.Got, WindowMark{ID: KeyID(id), Flags: flags, Win: win, At: time.UnixMilli(ms)})
	}
}
