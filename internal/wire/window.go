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

// MarksKey is the Redis key of the stream of a windowed limit's marks:
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

// EncodeMark is the value of a mark in the marks stream (the field is the key's ID):
// the flags' letters (L, S, O) followed by the window index in decimal.
func EncodeMark(flags int, win int64) string {
	var b [24]byte
	s := b[:0]
	if flags&MarkLow != 0 {
		s = append(s, 'L')
	}
	if flags&MarkSpent != 0 {
		s = append(s, 'S')
	}
	if flags&MarkOver != 0 {
		s = append(s, 'O')
	}
	return string(strconv.AppendInt(s, win, 10))
}

// ParseMark decodes EncodeMark's value.
func ParseMark(v string) (flags int, win int64, err error) {
	i := 0
	for ; i < len(v); i++ {
		switch v[i] {
		case 'L':
			flags |= MarkLow
		case 'S':
			flags |= MarkSpent
		case 'O':
			flags |= MarkOver
		default:
			goto num
		}
	}
num:
	if flags == 0 {
		return 0, 0, fmt.Errorf("mark %.20q: no flag", v)
	}
	win, err = strconv.ParseInt(v[i:], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("mark %.20q: window is not an integer", v)
	}
	return flags, win, nil
}

// StreamIDMillis is the milliseconds part of a stream entry ID ("<ms>-<seq>"): when Redis
// recorded the entry.
func StreamIDMillis(id string) (int64, error) {
	ms, _, ok := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok || err != nil {
		return 0, fmt.Errorf("stream ID %.30q: want <ms>-<seq>", id)
	}
	return n, nil
}

// NextStreamID is the smallest stream ID after id: the start of a range that excludes it.
func NextStreamID(id string) (string, error) {
	ms, seq, ok := strings.Cut(id, "-")
	m, err1 := strconv.ParseUint(ms, 10, 64)
	s, err2 := strconv.ParseUint(seq, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return "", fmt.Errorf("stream ID %.30q: want <ms>-<seq>", id)
	}
	if s == math.MaxUint64 {
		return strconv.FormatUint(m+1, 10) + "-0", nil
	}
	return ms + "-" + strconv.FormatUint(s+1, 10), nil
}
