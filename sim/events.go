package sim

import "time"

// event is one thing that happens at a virtual instant. Events at the same instant run in
// the order they were scheduled (seq), so a run is a pure function of its seed.
type event struct {
	at  time.Duration
	seq uint64
	fn  func()
	// afn(arg) runs instead of fn when set: a shared function with an argument saves
	// allocating a closure for events as frequent as request arrivals.
	afn func(int64)
	arg int64
}

// events is the discrete-event loop in virtual time: a binary heap of events ordered by
// (at, seq). Nothing in it reads the wall clock and nothing runs concurrently.
type events struct {
	now time.Duration
	seq uint64
	q   []event
	ran uint64 // events run so far
	// deadline, when set, reports the next instant something outside the heap happens
	// (a guarded call's deadline, see bubble); the loop stops there first and calls
	// expire with the clock at that instant.
	deadline func() (time.Duration, bool)
	expire   func()
}

// at schedules fn at virtual instant t (never in the past).
func (e *events) at(t time.Duration, fn func()) {
	if t < e.now {
		t = e.now
	}
	e.seq++
	e.q = append(e.q, event{at: t, seq: e.seq, fn: fn})
	e.up(len(e.q) - 1)
}

// atArg schedules afn(arg) at virtual instant t (never in the past).
func (e *events) atArg(t time.Duration, afn func(int64), arg int64) {
	if t < e.now {
		t = e.now
	}
	e.seq++
	e.q = append(e.q, event{at: t, seq: e.seq, afn: afn, arg: arg})
	e.up(len(e.q) - 1)
}

// after schedules fn d after now.
func (e *events) after(d time.Duration, fn func()) { e.at(e.now+d, fn) }

// runUntil runs every event due at or before t, then leaves the clock at t.
func (e *events) runUntil(t time.Duration) {
	for {
		next := t
		if len(e.q) > 0 && e.q[0].at <= t {
			next = e.q[0].at
		}
		if e.deadline != nil {
			if d, ok := e.deadline(); ok && d <= next {
				e.now = max(e.now, d)
				e.expire()
				continue
			}
		}
		if len(e.q) == 0 || e.q[0].at > t {
			break
		}
		ev := e.pop()
		e.now = ev.at
		e.ran++
		if ev.afn != nil {
			ev.afn(ev.arg)
		} else {
			ev.fn()
		}
	}
	e.now = max(e.now, t)
}

func (e *events) less(i, j int) bool {
	a, b := &e.q[i], &e.q[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (e *events) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !e.less(i, p) {
			return
		}
		e.q[i], e.q[p] = e.q[p], e.q[i]
		i = p
	}
}

func (e *events) pop() event {
	n := len(e.q) - 1
	top := e.q[0]
	e.q[0] = e.q[n]
	e.q[n] = event{}
	e.q = e.q[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && e.less(r, l) {
			m = r
		}
		if !e.less(m, i) {
			break
		}
		e.q[i], e.q[m] = e.q[m], e.q[i]
		i = m
	}
	return top
}
