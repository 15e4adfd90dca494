package keystore

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// lruModel is the Store's eviction rules on one shard, written as plainly as they can
// be: the LRU list a slice, front first. FuzzStoreMatchesModel holds the Store to it.
type lruModel struct {
	list []*modelEntry // front first
	cap  int
	idle time.Duration
	out  []evicted // what the Store would tell OnEvict, in order
	pend int       // evictions recorded by the call in progress
}

type modelEntry struct {
	key  string
	last int64
	used bool
}

func (m *lruModel) find(key string) int {
	return slices.IndexFunc(m.list, func(e *modelEntry) bool { return e.key == key })
}

func (m *lruModel) evict(i int, reason EvictReason) {
	m.out = append(m.out, evicted{key: m.list[i].key, reason: reason})
	m.list = slices.Delete(m.list, i, i+1)
	m.pend++
}

func (m *lruModel) toFront(i int) {
	e := m.list[i]
	m.list = slices.Insert(slices.Delete(m.list, i, i+1), 0, e)
}

// update is Store.Update of key at now.
func (m *lruModel) update(now int64, key string) {
	m.pend = 0
	if i := m.find(key); i >= 0 {
		e := m.list[i]
		if m.idle <= 0 || time.Duration(now-e.last) < m.idle {
			e.used = true
			if now > e.last {
				e.last = now
			}
			return
		}
		m.evict(i, EvictIdle)
	}
	if m.idle > 0 {
		m.sweep(now, sweepOnInsert)
	}
	if len(m.list) >= m.cap {
		m.evict(m.oldest(), EvictCapacity)
	}
	m.list = slices.Insert(m.list, 0, &modelEntry{key: key, last: now})
}

// sweep is Shard.sweep.
func (m *lruModel) sweep(now int64, max int) (n, promoted int) {
	for n < max && m.pend < maxPending && len(m.list) > 0 {
		i := len(m.list) - 1
		e := m.list[i]
		switch {
		case time.Duration(now-e.last) >= m.idle:
			m.evict(i, EvictIdle)
			n++
		case e.used && promoted < maxPromote:
			e.used = false
			m.toFront(i)
			promoted++
		default:
			return n, promoted
		}
	}
	return n, promoted
}

// oldest is Shard.oldest: the index of the entry to evict.
func (m *lruModel) oldest() int {
	for range maxPromote {
		i := len(m.list) - 1
		if !m.list[i].used {
			return i
		}
		m.list[i].used = false
		m.toFront(i)
	}
	return len(m.list) - 1
}

// storeSweep is Store.Sweep on one shard.
func (m *lruModel) storeSweep(now int64, max int) {
	if m.idle <= 0 {
		return
	}
	total, moves := 0, len(m.list)
	for max <= 0 || total < max {
		batch := maxPending
		if max > 0 {
			batch = min(batch, max-total)
		}
		m.pend = 0
		n, promoted := m.sweep(now, batch)
		total += n
		if moves -= promoted; n < batch && (promoted < maxPromote || moves <= 0) {
			break
		}
	}
}

// FuzzStoreMatchesModel runs a sequence of calls, read from the input, on a Store of one
// shard and on lruModel, and requires the same evictions, in the same order and for the
// same reasons, and the same keys held after every call. In half the inputs the keys'
// hashes keep only their lowest bit, so that the shard's keys share two hashes and
// the table tells most of them apart by their keys.
func FuzzStoreMatchesModel(f *testing.F) {
	f.Add([]byte{4, 10, 0, 1, 2, 3, 4, 5, 0, 0, 6, 1, 7, 2, 0x41, 0x82, 0xc3, 9})
	f.Add([]byte{2, 0, 0, 1, 0, 2, 0, 1, 3, 4, 5, 6, 7, 0xc0, 0x80, 1, 2})
	f.Add([]byte{0x84, 10, 0, 1, 2, 3, 4, 5, 0, 0, 6, 1, 7, 2, 0x41, 0x8a, 0x89, 0xc3, 9, 3})
	f.Add([]byte{0x85, 0, 0, 1, 2, 3, 4, 5, 6, 7, 0x88, 0x8b, 0, 7, 6, 0xc0, 1, 2, 0x8c, 5})
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) < 2 {
			return
		}
		capacity, idle := 1+int(in[0]&0x7f%24), time.Duration(in[1]%16)*time.Millisecond
		s, got := newCountingStore(t, StoreConfig[int]{MaxKeys: capacity, Shards: 1, IdleTimeout: idle})
		if in[0]&0x80 != 0 {
			s.hashBits = 1
		}
		m := &lruModel{cap: capacity, idle: idle}
		now := t0
		for step, b := range in[2:] {
			key := fmt.Sprint("k", int(b&7)+8*(step%4)) // 32 keys: tables grow
			switch b >> 6 {
			case 0, 1: // the common call, with time moving on by 0–7 ms
				now += int64(time.Duration(b>>3&7) * time.Millisecond)
				incr(s, now, key)
				m.update(now, key)
			case 2:
				if b&8 != 0 {
					s.Remove(key)
					if i := m.find(key); i >= 0 {
						m.evict(i, EvictRemoved)
					}
				} else {
					s.Sweep(now, int(b>>4&3))
					m.storeSweep(now, int(b>>4&3))
				}
			case 3:
				if b&0x3f == 0 {
					s.Purge()
					for len(m.list) > 0 {
						m.evict(len(m.list)-1, EvictPurged)
					}
				} else {
					now += int64(time.Duration(b&0x3f) * time.Millisecond)
				}
			}
			var keys []string
			for _, e := range m.list {
				keys = append(keys, e.key)
			}
			for k := range 32 {
				key := fmt.Sprint("k", k)
				held := s.Peek(key, func(*int, int64) {})
				if held != slices.Contains(keys, key) {
					t.Fatalf("step %d (%#x): %s held %v, the model holds %v", step, b, key, held, keys)
				}
			}
			if len(*got) != len(m.out) {
				t.Fatalf("step %d (%#x): evicted %v, the model %v", step, b, *got, m.out)
			}
			for i, e := range *got {
				if e.key != m.out[i].key || e.reason != m.out[i].reason {
					t.Fatalf("step %d (%#x): eviction %d is %s (%v), the model's %s (%v)", step, b, i, e.key, e.reason, m.out[i].key, m.out[i].reason)
				}
			}
		}
	})
}
