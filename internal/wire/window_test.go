package wire

import (
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
	if got := WindowKey("fl:", "api", w, 1764000000); got != "fl:win:{api}:1000000:1764000000" {
		t.Errorf("WindowKey = %q", got)
	}
	if got := MarksKey("fl:", "api"); got != "fl:marks:{api}" {
		t.Errorf("MarksKey = %q", got)
	}
	if WindowMicros(50, 50) != 1_000_000 || WindowMicros(3, 1) != 333_333 || WindowMicros(1e9, 1) != 1 {
		t.Errorf("WindowMicros: %d, %d, %d", WindowMicros(50, 50), WindowMicros(3, 1), WindowMicros(1e9, 1))
	}
	if WindowBits(1<<14) != 16 || WindowBits(1<<14+1) != 32 {
		t.Errorf("WindowBits(2^14) = %d, WindowBits(2^14+1) = %d", WindowBits(1<<14), WindowBits(1<<14+1))
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
		flags int
		win   int64
		enc   string
	}{
		{MarkLow, 7, "L7"},
		{MarkSpent, 0, "S0"},
		{MarkOver, 1764000000, "O1764000000"},
		{MarkLow | MarkSpent | MarkOver, 12, "LSO12"},
	}
	for _, tt := range tests {
		if got := EncodeMark(tt.flags, tt.win); got != tt.enc {
			t.Errorf("EncodeMark(%d, %d) = %q, want %q", tt.flags, tt.win, got, tt.enc)
		}
		f, w, err := ParseMark(tt.enc)
		if err != nil || f != tt.flags || w != tt.win {
			t.Errorf("ParseMark(%q) = %d, %d, %v", tt.enc, f, w, err)
		}
	}
	for _, bad := range []string{"", "12", "L", "Lx", "X1", "L1.5"} {
		if _, _, err := ParseMark(bad); err == nil {
			t.Errorf("ParseMark(%q) gave no error", bad)
		}
	}
}

func TestStreamIDs(t *testing.T) {
	tests := []struct{ id, next string }{
		{"1764000000000-0", "1764000000000-1"},
		{"5-18446744073709551615", "6-0"},
	}
	for _, tt := range tests {
		if got, err := NextStreamID(tt.id); err != nil || got != tt.next {
			t.Errorf("NextStreamID(%q) = %q, %v; want %q", tt.id, got, err, tt.next)
		}
	}
	if ms, err := StreamIDMillis("1764000000000-3"); err != nil || ms != 1764000000000 {
		t.Errorf("StreamIDMillis = %d, %v", ms, err)
	}
	for _, bad := range []string{"", "12", "a-1", "1-b", "-"} {
		if _, err := NextStreamID(bad); err == nil {
			t.Errorf("NextStreamID(%q) gave no error", bad)
		}
	}
}

func FuzzMark(f *testing.F) {
	f.Add("LSO12")
	f.Add("S-3")
	f.Fuzz(func(t *testing.T, v string) {
		flags, win, err := ParseMark(v)
		if err != nil {
			return
		}
		if f2, w2, err := ParseMark(EncodeMark(flags, win)); err != nil || f2 != flags || w2 != win {
			t.Fatalf("%q: decoded %d %d, again %d %d %v", v, flags, win, f2, w2, err)
		}
	})
}
