package global

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/wire"
	"github.com/redis/go-redis/v9"
)

// Windowed limits.
//
// A windowed limit admits a key Burst requests per window of Burst/Rate, each key's
// windows offset by a phase of its own (wire.WindowPhase), on Redis's clock. Redis keeps,
// per limit and window, one counter array for every key of the limit: a count-min sketch
// of two rows of BITFIELD counters at hashes of the key, so that a key's count, the
// smaller of its two counters, is at least its true count (a collision only denies), and
// a third row counting the requests of keys over their limit. No script runs: a server's
// round trip is a pipeline of one BITFIELD per window it touches, a sorted set of marks
// (which keys are low, spent or over) that every server adds to and reads, and Redis's
// TIME. Store.Windows makes that round trip; what a server does with the counts
// is the windowed mode of package hybrid.

// Limits of a WindowTrip.
const (
	// MinWindowWidth and MaxWindowWidth bound WindowTrip.Width.
	MinWindowWidth = 1 << 8
	MaxWindowWidth = 1 << 20
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
	// Width is the counters per row of the limit's arrays: a power of two from
	// MinWindowWidth to MaxWindowWidth. Every server of the limit must use the same.
	// An array takes WindowRows × Width counters of wire.WindowBits(Burst) bits.
	Width int
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
	// Got are the marks read, oldest first.
	Got []WindowMark
}

// checkWindowTrip reports what is wrong with t, wrapping ErrInvalidLimit.
func checkWindowTrip(t *WindowTrip) error {
	if err := t.Limit.Validate(); err != nil {
		return err
	}
	l := t.Limit
	if l.Burst > MaxWindowBurst {
		return fmt.Errorf("%w: windowed limit %q: burst %d above %d", ErrInvalidLimit, l.Name, l.Burst, MaxWindowBurst)
	}
	if t.Width < MinWindowWidth || t.Width > MaxWindowWidth || t.Width&(t.Width-1) != 0 {
		return fmt.Errorf("%w: windowed limit %q: width %d is not a power of two from %d to %d",
			ErrInvalidLimit, l.Name, t.Width, MinWindowWidth, MaxWindowWidth)
	}
	if len(t.Ops) > MaxWindowOps {
		return fmt.Errorf("%w: windowed limit %q: %d ops, more than %d", ErrInvalidLimit, l.Name, len(t.Ops), MaxWindowOps)
	}
	if (len(t.Marks) > 0 || t.Read || t.Tidy) && t.Memory < time.Millisecond {
		return fmt.Errorf("%w: windowed limit %q: mark memory %v is shorter than 1ms", ErrInvalidLimit, l.Name, t.Memory)
	}
	for _, op := range t.Ops {
		if !wire.ValidID(string(op.ID)) {
			return fmt.Errorf("%w: key ID %q is not one IDOf returns", ErrInvalidLimit, op.ID)
		}
		if op.Win < 0 || op.N < -MaxWindowBurst || op.N > MaxWindowBurst {
			return fmt.Errorf("%w: windowed limit %q: op window %d, count %d", ErrInvalidLimit, l.Name, op.Win, op.N)
		}
	}
	for _, m := range t.Marks {
		if !wire.ValidID(string(m.ID)) {
			return fmt.Errorf("%w: key ID %q is not one IDOf returns", ErrInvalidLimit, m.ID)
		}
		if m.Flags == 0 || m.Flags&^(wire.MarkLow|wire.MarkSpent|wire.MarkOver) != 0 || m.Win < 0 {
			return fmt.Errorf("%w: windowed limit %q: mark flags %d, window %d", ErrInvalidLimit, l.Name, m.Flags, m.Win)
		}
	}
	if (len(t.Marks) > 0 || t.Tidy) && t.At.IsZero() {
		return fmt.Errorf("%w: windowed limit %q: marks and Tidy need At, Redis's time", ErrInvalidLimit, l.Name)
	}
	return nil
}

// windowArray is one BITFIELD of a WindowTrip: the ops of one window.
type windowArray struct {
	win  int64
	ops  []int // indexes into Ops
	args []any
	cmd  *redis.IntSliceCmd
}

// Windows makes t's round trip: one pipeline of TIME (if t.Clock), a BITFIELD per window
// its ops touch (OVERFLOW SAT, one INCRBY per row an op counts in), each followed by the
// array's deadline (PEXPIREAT at the end of the window after it, plus a second, on
// Redis's clock, so every server sets the same), a ZADD of its marks, the set's trim
// (ZREMRANGEBYSCORE) if t.Tidy, the set's expiry (PEXPIRE Memory) with marks or t.Tidy,
// and a ZRANGEBYSCORE of the marks from t.Since. Every key it writes expires.
//
// It fills in each op's Count, and t.Now and t.Got as asked. An invalid trip is
// refused with an error wrapping ErrInvalidLimit before any call. Otherwise the error is
// the first command's that failed, classed as every Store error is; the trip may then
// have been carried out in part, and its answers are not to be used. The client must be
// able to pipeline (every go-redis client can); a Cluster reaches the one node that holds
// the limit's slot.
func (s *Store) Windows(ctx context.Context, t *WindowTrip) error {
	if err := checkWindowTrip(t); err != nil {
		return err
	}
	if s.pipe == nil {
		return fmt.Errorf("%w: Windows needs a client that pipelines", ErrInvalidConfig)
	}
	lim := t.Limit
	w := wire.WindowMicros(lim.Rate, lim.Burst)
	bits := wire.WindowBits(lim.Burst)
	var typ any = "u" + strconv.Itoa(bits) // boxed once, not per counter
	// Every counter's bit offset and increment, in one array, passed as pointers into
	// it: go-redis boxes an int into an interface with an allocation, a pointer without.
	rows := 0
	for _, op := range t.Ops {
		rows += 2
		if op.Demand {
			rows--
		}
	}
	nums := make([]int, 0, 2*rows)
	pipe := s.pipe.Pipeline()

	var clock *redis.TimeCmd
	if t.Clock {
		clock = pipe.Time(ctx)
	}
	var arrays []windowArray
	for i, op := range t.Ops {
		j := 0
		for j < len(arrays) && arrays[j].win != op.Win {
			j++
		}
		if j == len(arrays) {
			args := make([]any, 0, 2+4*rows) // room for every op, should one array take them all
			arrays = append(arrays, windowArray{win: op.Win, args: append(args, "OVERFLOW", "SAT")})
		}
		a := &arrays[j]
		a.ops = append(a.ops, i)
		id := string(op.ID)
		counter := func(row int) {
			nums = append(nums, wire.WindowCounter(id, row, t.Width)*bits, op.N) // its bit offset (= "#counter")
			k := len(nums)
			a.args = append(a.args, "INCRBY", typ, &nums[k-2], &nums[k-1])
		}
		if op.Demand {
			counter(wire.DemandRow)
			continue
		}
		counter(0)
		counter(1)
	}
	for i := range arrays {
		a := &arrays[i]
		key := wire.WindowKey(s.prefix, lim.Name, w, a.win)
		a.cmd = pipe.BitField(ctx, key, a.args...)
		// With every BITFIELD, right after it on the same connection: any BITFIELD may
		// make the array (the first, or one after a restart, a FLUSHALL, an eviction, or
		// one that ran late, after its array expired), and none may leave it without a
		// deadline. The array is of no use once window a.win has ended for every phase; a
		// deadline already past deletes what a late BITFIELD made.
		end := (a.win + 2) * w
		pipe.PExpireAt(ctx, key, time.UnixMicro(end).Add(time.Second))
	}
	marks := wire.MarksKey(s.prefix, lim.Name)
	if len(t.Marks) > 0 {
		at := t.At.UnixMilli()
		zs := make([]redis.Z, len(t.Marks))
		for i, m := range t.Marks {
			zs[i] = redis.Z{Score: wire.MarkScore(at, m.Flags), Member: wire.MarkMember(m.Win, string(m.ID))}
		}
		pipe.ZAdd(ctx, marks, zs...)
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
		read = pipe.ZRangeByScoreWithScores(ctx, marks, &redis.ZRangeBy{Min: from, Max: "+inf", Count: MaxMarksRead})
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return wrap("windows", err)
	}

	if clock != nil {
		t.Now = clock.Val()
	}
	for _, a := range arrays {
		v := a.cmd.Val()
		k := 0
		for _, i := range a.ops {
			op := &t.Ops[i]
			if op.Demand {
				if k >= len(v) {
					return unexpected("windows", "BITFIELD: too few values")
				}
				op.Count, k = int(v[k]), k+1
				continue
			}
			if k+1 >= len(v) {
				return unexpected("windows", "BITFIELD: too few values")
			}
			op.Count, k = int(min(v[k], v[k+1])), k+2
		}
	}
	if read != nil {
		if err := t.readMarks(read.Val()); err != nil {
			return unexpected("windows", err.Error())
		}
	}
	return nil
}

// readMarks decodes a ZRANGEBYSCORE WITHSCORES of the marks into t.Got.
func (t *WindowTrip) readMarks(zs []redis.Z) error {
	for _, z := range zs {
		member, ok := z.Member.(string)
		if !ok {
			return fmt.Errorf("ZRANGEBYSCORE: a member of type %T", z.Member)
		}
		flags, win, id, ms, err := wire.ParseMark(member, z.Score)
		if err != nil {
			return err
		}
		t.Got = append(t.Got, WindowMark{ID: KeyID(id), Flags: flags, Win: win, At: time.UnixMilli(ms)})
	}
	return nil
}
