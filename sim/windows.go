package sim

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// windowRedis is the simulated Redis of windowed limits: what redisstore.Store.Windows's
// commands do (TIME, BITFIELD OVERFLOW SAT INCRBY, PEXPIREAT, ZADD, ZREMRANGEBYSCORE,
// PEXPIRE, ZRANGEBYSCORE), on Go maps, with the key names, counters and members of
// package wire. TestWindowRedisMatches holds it to a real Redis.
type windowRedis struct {
	arrays map[string]*winArray
	marks  map[string]*marksSet // by key: a shard's sorted set of marks
}

// marksSet is a sorted set of marks: member, score.
type marksSet struct {
	m   map[string]float64
	end time.Time // its expiry (PEXPIRE); zero: none
}

type winArray struct {
	c        []uint32
	deadline time.Time // zero: none
}

func newWindowRedis() *windowRedis {
	return &windowRedis{arrays: map[string]*winArray{}, marks: map[string]*marksSet{}}
}

// array returns the live array of key at at, or nil.
func (r *windowRedis) array(key string, at time.Time) *winArray {
	a := r.arrays[key]
	if a != nil && !a.deadline.IsZero() && !at.Before(a.deadline) {
		delete(r.arrays, key)
		return nil
	}
	return a
}

// cmdCost is the Redis time of the plain commands of a windowed exchange, in the
// simulator's units (a one-key script call costs ScriptTime, 8 µs), from INFO
// commandstats on redis-server 7.0.15 on a 2-vCPU machine where luascript.Take cost 13.75 µs a
// call (bench/rediscost measures them all on a redis-server of its own):
//
//	go -C bench test ./rediscost -run TestRedisCost -v -args -rediscost
//
// BITFIELD 0.35 µs with one sub-command, 0.144 µs per sub-command; ZADD 0.18 µs + 0.23
// per member; ZRANGEBYSCORE WITHSCORES 0.13 µs + 0.16 per member answered; PEXPIREAT
// after a BITFIELD 0.18-0.19 µs. Scaled by 8 / 14 and rounded up: bfCall, bfSub, zCall,
// zMember, zRead (TIME, ZREMRANGEBYSCORE and the marks' PEXPIRE cost zCall) and expire
// (rounded up to 10 ns).
var cmdCost = struct{ bfCall, bfSub, zCall, zMember, zRead, expire time.Duration }{
	bfCall: 300 * time.Nanosecond, bfSub: 100 * time.Nanosecond,
	zCall: 300 * time.Nanosecond, zMember: 200 * time.Nanosecond, zRead: 150 * time.Nanosecond,
	expire: 110 * time.Nanosecond,
}

// windowCost is the commands of t and their Redis time by cmdCost, less the read's,
// which depends on what it returns (readCost).
func windowCost(t *redisstore.WindowTrip) (cmds int, cost time.Duration) {
	if t.Clock {
		cmds, cost = cmds+1, cost+cmdCost.zCall
	}
	var wins []int64
	for _, op := range t.Ops {
		if !slices.Contains(wins, op.Win) { // BITFIELD, PEXPIREAT
			wins = append(wins, op.Win)
			cmds, cost = cmds+2, cost+cmdCost.bfCall+cmdCost.expire
		}
		cost += cmdCost.bfSub
		if !op.Demand {
			cost += cmdCost.bfSub
		}
	}
	if len(t.Marks) > 0 { // ZADD
		cmds, cost = cmds+1, cost+cmdCost.zCall+time.Duration(len(t.Marks))*cmdCost.zMember
	}
	if t.Tidy { // ZREMRANGEBYSCORE
		cmds, cost = cmds+1, cost+cmdCost.zCall
	}
	if len(t.Marks) > 0 || t.Tidy { // PEXPIRE
		cmds, cost = cmds+1, cost+cmdCost.zCall
	}
	if t.Read {
		cmds++
	}
	return cmds, cost
}

// run carries out t at Redis's instant at, as Store.Windows would.
func (r *windowRedis) run(at time.Time, t *redisstore.WindowTrip) {
	lim := t.Limit
	shards := max(1, t.Shards)
	w := wire.WindowMicros(lim.Rate, lim.Burst)
	top := int64(1)<<wire.WindowBits(lim.Burst) - 1
	if t.Clock {
		t.Now = at
	}
	var wins []int64
	for i := range t.Ops {
		op := &t.Ops[i]
		key := wire.WindowKey(keyPrefix, lim.Name, shards, t.Shard, w, op.Win)
		a := r.array(key, at)
		if a == nil {
			a = &winArray{c: make([]uint32, wire.WindowRows*t.Width)}
			r.arrays[key] = a
		}
		if !slices.Contains(wins, op.Win) {
			wins = append(wins, op.Win)
		}
		add := func(row int) int64 {
			c := &a.c[wire.WindowCounter(string(op.ID), row, t.Width)]
			*c = uint32(min(max(int64(*c)+int64(op.N), 0), top))
			return int64(*c)
		}
		if op.Demand {
			op.Count = int(add(wire.DemandRow))
		} else {
			op.Count = int(min(add(0), add(1)))
		}
	}
	for _, win := range wins {
		key := wire.WindowKey(keyPrefix, lim.Name, shards, t.Shard, w, win)
		if a := r.arrays[key]; a != nil {
			a.deadline = time.UnixMicro((win + 2) * w).Add(time.Second)
			r.array(key, at) // a deadline passed deletes at once
		}
	}
	if len(r.arrays) > 64 {
		for key := range r.arrays {
			r.array(key, at)
		}
	}
	mkey := wire.MarksKey(keyPrefix, lim.Name, shards, t.Shard)
	set := r.marks[mkey]
	if set != nil && !set.end.IsZero() && !at.Before(set.end) {
		delete(r.marks, mkey)
		set = nil
	}
	if set == nil && len(t.Marks) > 0 {
		set = &marksSet{m: map[string]float64{}}
		r.marks[mkey] = set
	}
	for _, m := range t.Marks {
		set.m[wire.MarkMember(m.Win, string(m.ID))] = wire.MarkScore(t.At.UnixMilli(), m.Flags)
	}
	if t.Tidy && set != nil {
		old := wire.MarkScore(t.At.Add(-t.Memory).UnixMilli(), 0)
		maps.DeleteFunc(set.m, func(_ string, score float64) bool { return score < old })
	}
	if (len(t.Marks) > 0 || t.Tidy) && set != nil {
		set.end = at.Add(t.Memory)
	}
	if t.Read && set != nil {
		from := math.Inf(-1)
		if !t.Since.IsZero() {
			from = wire.MarkScore(t.Since.UnixMilli(), 0)
		}
		type z struct {
			m string
			s float64
		}
		var zs []z
		for m, score := range set.m {
			if score >= from {
				zs = append(zs, z{m, score})
			}
		}
		slices.SortFunc(zs, func(a, b z) int { return cmp.Or(cmp.Compare(a.s, b.s), strings.Compare(a.m, b.m)) })
		for _, x := range zs[:min(len(zs), 10000)] {
			flags, win, id, ms, _ := wire.ParseMark(x.m, x.s)
			t.Got = append(t.Got, redisstore.WindowMark{ID: redisstore.KeyID(id), Flags: flags, Win: win, At: time.UnixMilli(ms)})
		}
	}
}

// readCost is the Redis time of t's read, once answered.
func readCost(t *redisstore.WindowTrip) time.Duration {
	if !t.Read {
		return 0
	}
	return cmdCost.zCall + time.Duration(len(t.Got))*cmdCost.zRead
}
