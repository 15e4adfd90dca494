package wire

import (
	"fmt"
	"math"
	"strconv"
	"strings"
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

// WindowKey is the Redis key of limit's array for window win of length w (microseconds):
// <prefix>win:{<limit>}:<w>:<win>. The hash tag puts every array of a limit, and its
// marks, in one Cluster slot: a server's round trip for a limit reaches one node.
func WindowKey(prefix, limit string, w, win int64) string {
	var b strings.Builder
	b.Grow(len(prefix) + len(limit) + 48)
	b.WriteString(prefix)
	b.WriteString("win:{")
	b.WriteString(limit)
	b.WriteString("}:")
	b.WriteString(strconv.FormatInt(w, 10))
	b.WriteByte(':')
	b.WriteString(strconv.FormatInt(win, 10))
	return b.String()
}

// MarksKey is the Redis key of the sorted set of a windowed limit's marks:
// <prefix>marks:{<limit>}.
func MarksKey(prefix, limit string) string {
	return prefix + "marks:{" + limit + "}"
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
