package wire

import (
	"strconv"
	"testing"
)

// TestWindowFormat pins the windowed limits' part of the format promise: a key's phase
// and counters, the window index, the key names and the marks' encoding. Servers of two
// versions share a windowed limit's counts only while these hold.
func TestWindowFormat(t *testing.T) {
	const w = 1_000_000 // 1 s
	tests := []struct {
		id                 string
		phase              int64
		row0, row1, demand int
	}{
		{"alice", 220572, 145616, 308996, 639456},
		{"", 26203, 170016, 460279, 535505},
		{"{0123456789abcdef0123456789abcdef", 978515, 174429, 286549, 562287},
	}
	for _, tt := range tests {
		if got := WindowPhase(tt.id, w); got != tt.phase {
			t.Errorf("WindowPhase(%q) = %d, want %d", tt.id, got, tt.phase)
		}
		got := [3]int{WindowCounter(tt.id, 0, 1<<18), WindowCounter(tt.id, 1, 1<<18), WindowCounter(tt.id, DemandRow, 1<<18)}
		if want := [3]int{tt.row0, tt.row1, tt.demand}; got != want {
			t.Errorf("WindowCounter(%q, rows 0-2, 2^18) = %v, want %v", tt.id, got, want)
		}
		for row, c := range got {
			if c < row<<18 || c >= (row+1)<<18 {
				t.Errorf("WindowCounter(%q, %d) = %d, outside its row", tt.id, row, c)
			}
		}
	}
	if got := WindowKey("fl:", "api", 1, 0, w, 1764000000); got != "fl:win:{api}:1000000:1764000000" {
		t.Errorf("WindowKey, one shard = %q", got)
	}
	if got := MarksKey("fl:", "api", 1, 0); got != "fl:marks:{api}" {
		t.Errorf("MarksKey, one shard = %q", got)
	}
	if got := WindowKey("fl:", "api", 64, 7, w, 1764000000); got != "fl:win:{api#64.7.0b408}:1000000:1764000000" {
		t.Errorf("WindowKey, shard 7 of 64 = %q", got)
	}
	if got := MarksKey("fl:", "api", 64, 63); got != "fl:marks:{api#64.63.00fcc}" {
		t.Errorf("MarksKey, shard 63 of 64 = %q", got)
	}
	shards := [3]int{WindowShard("alice", 64), WindowShard("", 64), WindowShard("{0123456789abcdef0123456789abcdef", 64)}
	if want := [3]int{0, 46, 23}; shards != want {
		t.Errorf("WindowShard(ids, 64) = %v, want %v", shards, want)
	}
	// Rounded to the nearest microsecond (2/3 s: 666,667): servers that round otherwise
	// count a key in other windows.
	if WindowMicros(50, 50) != 1_000_000 || WindowMicros(3, 1) != 333_333 || WindowMicros(3, 2) != 666_667 || WindowMicros(1e9, 1) != 1 {
		t.Errorf("WindowMicros: %d, %d, %d, %d", WindowMicros(50, 50), WindowMicros(3, 1), WindowMicros(3, 2), WindowMicros(1e9, 1))
	}
	if WindowBits(1<<14) != 16 || WindowBits(1<<14+1) != 32 {
		t.Errorf("WindowBits(2^14) = %d, WindowBits(2^14+1) = %d", WindowBits(1<<14), WindowBits(1<<14+1))
	}
}

// TestWindowShards checks that a limit's shards are at evenly spaced slots, whatever its
// name, and that keys spread over them.
func TestWindowShards(t *testing.T) {
	for _, limit := range []string{"api", "client", "a-much-longer-limit-name.v2"} {
		for _, n := range []int{2, 16, 64, 256} {
			base := Slot(limit)
			for i := range n {
				want := (base + i*Slots/n) % Slots
				key := WindowKey("fl:", limit, n, i, 1000, 5)
				if Slot(key) != want || Slot(MarksKey("x:", limit, n, i)) != want {
					t.Fatalf("%s: shard %d of %d in slot %d, want %d", key, i, n, Slot(key), want)
				}
			}
		}
	}
	var count [64]int
	for k := range 64000 {
		count[WindowShard("k"+strconv.Itoa(k), 64)]++
	}
	for i, c := range count {
		if c < 800 || c > 1200 {
			t.Errorf("shard %d holds %d of 64,000 keys", i, c)
		}
	}
	marks := map[int]int{}
	for k := range 64000 {
		id := "k" + strconv.Itoa(k)
		m := WindowMarksShard(id, 64)
		if m%4 != 0 || m > WindowShard(id, 64) || WindowShard(id, 64) >= m+4 {
			t.Fatalf("%s: shard %d, marks in shard %d, not the first of its group of 4", id, WindowShard(id, 64), m)
		}
		marks[m]++
	}
	if len(marks) != 16 || WindowMarksShard("alice", 64) != 0 || WindowMarksShard("", 64) != 44 || WindowMarksGroup(8) != 1 {
		t.Errorf("64 shards' marks in %d sets, alice's in %d, \"\"'s in %d; 8 shards in groups of %d", len(marks), WindowMarksShard("alice", 64), WindowMarksShard("", 64), WindowMarksGroup(8))
	}
	if WindowShard("alice", 1) != 0 || ShardTag("api", 1, 0) != "api" {
		t.Error("one shard: not the unsharded format")
	}
}

func TestWindowIndex(t *testing.T) {
	tests := []struct {
		us, phase, w, want int64
	}{
		{0, 0, 10, 0},
		{9, 0, 10, 0},
		{10, 0, 10, 1},
		{5, 5, 10, 1},
		{4, 5, 10, 0},
		{-1, 0, 10, -1},
		{-10, 0, 10, -1},
		{-11, 0, 10, -2},
		{1_764_000_000_123_456, 250_000, 1_000_000, 1_764_000_000},
	}
	for _, tt := range tests {
		got := WindowIndex(tt.us, tt.phase, tt.w)
		if got != tt.want {
			t.Errorf("WindowIndex(%d, %d, %d) = %d, want %d", tt.us, tt.phase, tt.w, got, tt.want)
		}
		if s := WindowStart(got, tt.phase, tt.w); tt.us < s || tt.us >= s+tt.w {
			t.Errorf("instant %d outside its window [%d, %d)", tt.us, s, s+tt.w)
		}
	}
}

func TestMarks(t *testing.T) {
	tests := []struct {
		flags  int
		win    int64
		id     string
		ms     int64
		member string
		score  float64
	}{
		{MarkLow, 7, "alice", 1764000000123, "7:alice", 14112000000985},
		{MarkSpent, 0, "", 0, "0:", 2},
		{MarkOver, 1764000000, "a:b:c", 5, "1764000000:a:b:c", 44},
		{MarkLow | MarkSpent | MarkOver, 12, "{0123456789abcdef0123456789abcdef", 1, "12:{0123456789abcdef0123456789abcdef", 15},
	}
	for _, tt := range tests {
		if got := MarkMember(tt.win, tt.id); got != tt.member {
			t.Errorf("MarkMember(%d, %q) = %q, want %q", tt.win, tt.id, got, tt.member)
		}
		if got := MarkScore(tt.ms, tt.flags); got != tt.score {
			t.Errorf("MarkScore(%d, %d) = %v, want %v", tt.ms, tt.flags, got, tt.score)
		}
		f, w, id, ms, err := ParseMark(tt.member, tt.score)
		if err != nil || f != tt.flags || w != tt.win || id != tt.id || ms != tt.ms {
			t.Errorf("ParseMark(%q, %v) = %d, %d, %q, %d, %v", tt.member, tt.score, f, w, id, ms, err)
		}
	}
	for _, bad := range []struct {
		member string
		score  float64
	}{{"", 9}, {"a", 9}, {"x:a", 9}, {"-1:a", 9}, {"1.5:a", 9}, {"1:{x", 9}, {"1:a", 8}, {"1:a", 9.5}, {"1:a", -7}} {
		if _, _, _, _, err := ParseMark(bad.member, bad.score); err == nil {
			t.Errorf("ParseMark(%q, %v) gave no error", bad.member, bad.score)
		}
	}
}

func FuzzMark(f *testing.F) {
	f.Add("12:alice", 15.0)
	f.Add("3:", 1.0)
	f.Fuzz(func(t *testing.T, member string, score float64) {
		flags, win, id, ms, err := ParseMark(member, score)
		if err != nil {
			return
		}
		f2, w2, id2, ms2, err := ParseMark(MarkMember(win, id), MarkScore(ms, flags))
		if err != nil || f2 != flags || w2 != win || id2 != id || ms2 != ms {
			t.Fatalf("%q %v: decoded %d %d %q %d, again %d %d %q %d %v", member, score, flags, win, id, ms, f2, w2, id2, ms2, err)
		}
	})
}

// TestWindowMarksGroup: the shards that share a set of marks: shards/16, at least 1.
func TestWindowMarksGroup(t *testing.T) {
	for _, tt := range []struct{ shards, group int }{
		{0, 1}, {1, 1}, {15, 1}, {16, 1}, {31, 1}, {32, 2}, {WindowShards, 3}, {64, 4}, {256, 16},
	} {
		if got := WindowMarksGroup(tt.shards); got != tt.group {
			t.Errorf("WindowMarksGroup(%d) = %d, want %d", tt.shards, got, tt.group)
		}
	}
}
