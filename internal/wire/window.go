package wire

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
)

// A windowed limit counts each key's requests per window of burst/rate in a counter array
// shared by every key of the limit: one Redis string per limit and window, updated with
// BITFIELD. What follows is its part of the format promise: servers of two versions share
// a windowed limit's counts only if they compute the same window of a key at an instant,
// the same counters of a key, and the same key names.

// WindowRows is how many rows of counters a window's array holds: two rows of a
// count-min sketch (a key's count is the smaller of its two counters, at least its true
// count), then one row of demand counters (DemandRow).
const WindowRows = 3

// DemandRow is the row of an array that counts requests of over-limit keys for odds
// rather than admissions; a collision there only lowers a key's odds.
const DemandRow = 2

// WindowMicros is a windowed limit's window length in microseconds: burst/rate seconds,
// rounded to the nearest microsecond, at least 1.
func WindowMicros(rate float64, burst int) int64 {
	return max(1, int64(math.Round(float64(burst)*1e6/rate)))
}

// WindowHash is the hash a windowed limit derives a key's phase and counters from:
// FNV-1a over id's bytes, then xor salt and SplitMix64's finalizer. Salt 0 gives the
// phase, salt 1+r the counter of row r.
func WindowHash(id string, salt uint64) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h ^= uint64(id[i])
		h *= 1099511628211
	}
	h ^= salt * 0x9e3779b97f4a7c15
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// WindowPhase is the offset of key id's windows in microseconds, in [0, w): the key's
// windows start at the instants t with (t + phase) a multiple of w, so that the keys of
// a limit do not all start a window at once.
func WindowPhase(id string, w int64) int64 { return int64(WindowHash(id, 0) % uint64(w)) }

// WindowIndex is the index of the window of a key of phase phase at instant us
// (microseconds since 1970, on Redis's clock): floor((us + phase) / w).
func WindowIndex(us, phase, w int64) int64 {
	x := us + phase
	if x < 0 {
		return -((-x + w - 1) / w)
	}
	return x / w
}

// WindowStart is when window win of a key of phase phase starts, in microseconds since
// 1970 (it ends at WindowStart(win+1, ...)).
func WindowStart(win, phase, w int64) int64 { return win*w - phase }

// WindowCounter is the index of key id's counter in row row of an array of width
// counters a row (a power of two): in [row·width, (row+1)·width).
func WindowCounter(id string, row, width int) int {
	return row*width + int(WindowHash(id, uint64(1+row))&uint64(width-1))
}

// WindowBits is the width of a counter for a limit of burst: 16 bits up to a burst of
// 2^14, else 32. Counters saturate (BITFIELD OVERFLOW SAT), and a window's count may pass
// its burst by what servers admitted before hearing of it, so a counter is four times
// the largest burst it serves.
func WindowBits(burst int) int {
	if burst <= 1<<14 {
		return 16
	}
	return 32
}

// WindowShards is how many shards a windowed limit's arrays and marks are split into:
// a key is counted, and marked, in one shard (WindowShard), each shard under a hash tag
// of its own (ShardTag), so that a limit's Redis work spreads over every master of a
// Cluster instead of loading the one that holds the limit's slot. 60 shards at evenly
// spaced slots put 6 of them on each of 10 masters (20 on each of 3), and their 20 sets
// of marks (WindowMarksGroup) 2 on each of 10. Servers that count a limit in another
// number of shards write other keys: the number is part of the limit's representation
// (package engine, reps.go), and one shard is the unsharded format, whose keys carry
// the limit's name alone.
const WindowShards = 60

// DefaultWindowWidth is the counters per row of a windowed limit's arrays, over all its
// shards, that hybrid.Limiter counts in: 2^18, two rows of a 16-bit sketch and a demand
// row, 1.5 MB per window (on a Cluster, WindowShards arrays of 2^12 counters a row).
// Servers that count a limit in other widths write other counters.
const DefaultWindowWidth = 1 << 18

// WindowShard is the shard of key id among shards (at least 1): its hash with salt
// 1+WindowRows, modulo shards.
func WindowShard(id string, shards int) int {
	if shards <= 1 {
		return 0
	}
	return int(WindowHash(id, 1+WindowRows) % uint64(shards))
}

// WindowMarksGroup is how many shards of shards share one set of marks: shards/16, at
// least 1 (3 of WindowShards, 20 sets; 4 of 64, 16 sets). A read of the marks reads
// every set, each a command however few marks it holds, and every server reads them
// four times a second: a set for a few shards, evenly spaced as their shards are, keeps
// that cost near one set's while spreading it over the masters. The rule is part of the
// format: servers that count a limit in the same number of shards mark its keys in the
// same sets.
func WindowMarksGroup(shards int) int { return max(1, shards/16) }

// WindowMarksShard is the shard whose set holds the marks of key id: the first shard of
// its group (WindowMarksGroup). Its marks share that shard's tag, so a round trip for
// the shard writes and reads them in one transaction with its arrays.
func WindowMarksShard(id string, shards int) int {
	g := WindowMarksGroup(shards)
	return WindowShard(id, shards) / g * g
}

// ShardTag is the hash tag of shard i of shards of a limit's structure shared by its
// keys (a windowed limit's arrays and marks, a charge-later limit's low-key sets): with
// one shard the limit's name, else <limit>#<shards>.<i>.<5 hex digits>, the digits the
// first (in numeric order) that put the tag in slot Slot(limit) + i·Slots/shards (mod
// Slots), so that a limit's shards are evenly spaced over the slots whatever its name.
// No limit name holds '#', so no tag of one shard is a tag of several.
func ShardTag(limit string, shards, i int) string {
	if shards <= 1 {
		return limit
	}
	var b strings.Builder
	b.Grow(len(limit) + 20)
	b.WriteString(limit)
	b.WriteByte('#')
	b.WriteString(strconv.Itoa(shards))
	b.WriteByte('.')
	b.WriteString(strconv.Itoa(i))
	b.WriteByte('.')
	pre := b.String()
	target := (Slot(limit) + int(int64(i)*Slots/int64(shards))) % Slots
	// CRC16 with no initial value nor final xor is linear: the CRC of pre and the
	// digits is the CRC of pre and five zero bytes, xor the digits' own.
	zeros := crc16(crc16(0, pre), "\x00\x00\x00\x00\x00")
	b.WriteString(suffixes()[(target^int(zeros))%Slots])
	return b.String()
}

// suffixes maps each slot v to the first string of five hex digits whose CRC16 is v
// modulo Slots (every slot has one).
var suffixes = sync.OnceValue(func() *[Slots]string {
	var t [Slots]string
	left := Slots
	const hex = "0123456789abcdef"
	var d [5]byte
	for n := 0; left > 0 && n < 1<<20; n++ {
		for k := range d {
			d[k] = hex[n>>(16-4*k)&15]
		}
		if v := crc16(0, string(d[:])) % Slots; t[v] == "" {
			t[v], left = string(d[:]), left-1
		}
	}
	return &t
})

// WindowKey is the Redis key of limit's array for window win of length w (microseconds)
// in shard i of shards: <prefix>win:{<ShardTag>}:<w>:<win>. The hash tag puts every
// array of a shard, and its marks, in one Cluster slot.
func WindowKey(prefix, limit string, shards, i int, w, win int64) string {
	tag := ShardTag(limit, shards, i)
	var b strings.Builder
	b.Grow(len(prefix) + len(tag) + 48)
	b.WriteString(prefix)
	b.WriteString("win:{")
	b.WriteString(tag)
	b.WriteString("}:")
	b.WriteString(strconv.FormatInt(w, 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatInt(win, 10))
	return b.String()
}

// MarksKey is the Redis key of the sorted set of the marks of shard i of shards of a
// windowed limit: <prefix>marks:{<ShardTag>}.
func MarksKey(prefix, limit string, shards, i int) string {
	return prefix + "marks:{" + ShardTag(limit, shards, i) + "}"
}

// Mark flags: what a mark says of a key.
const (
	// MarkLow: the key's count came near its burst; it stays low until window Win ends.
	MarkLow = 1 << iota
	// MarkSpent: window Win of the key is spent.
	MarkSpent
	// MarkOver: the key asks at several times its rate, from when the mark was recorded.
	MarkOver
)

// MarkMember is a mark's member in the marks' sorted set: the window index in decimal,
// ':' and the key's ID. A key has one member per window: the servers that mark it for
// that window overwrite each other's, and a reader reads it once.
func MarkMember(win int64, id string) string {
	return strconv.FormatInt(win, 10) + ":" + id
}

// MarkScore is a mark's score: when it was recorded, in milliseconds since 1970 on Redis's
// clock (as its writer estimated it), times 8, plus its flags. Scores order marks by
// time, and a read from an instant is a read from MarkScore(ms, 0).
func MarkScore(ms int64, flags int) float64 { return float64(ms*8 + int64(flags&7)) }

// ParseMark decodes a mark's member and score.
func ParseMark(member string, score float64) (flags int, win int64, id string, ms int64, err error) {
	num, id, ok := strings.Cut(member, ":")
	win, err = strconv.ParseInt(num, 10, 64)
	x := int64(score)
	if !ok || err != nil || win < 0 || !ValidID(id) || float64(x) != score || x < 0 || x&7 == 0 {
		return 0, 0, "", 0, fmt.Errorf("mark %.30q %v: want <window>:<key ID> and a score of MarkScore", member, score)
	}
	return int(x & 7), win, id, x >> 3, nil
}
