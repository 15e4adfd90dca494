package wire

import "testing"

// TestSlot pins Slot to the values CLUSTER KEYSLOT gives (Redis Cluster specification;
// redis-cli on Redis 7), hash tags included.
func TestSlot(t *testing.T) {
	for _, c := range []struct {
		key  string
		want int
	}{
		{"", 0},
		{"123456789", 12739}, // the specification's CRC16 check value 0x31C3
		{"foo", 12182},
		{"bar", 5061},
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"user1000", 3443},
		{"foo{}{bar}", 8363}, // an empty tag: the whole key
		{"foo{{bar}}zap", 4015},
		{"foo{bar}{zap}", 5061},
		{"fl:{api:client-7}", Slot("api:client-7")},
	} {
		if got := Slot(c.key); got != c.want {
			t.Errorf("Slot(%q) = %d, want %d", c.key, got, c.want)
		}
	}
}
