package keystore

import (
	"hash/maphash"
	"math/bits"
	"strconv"
	"strings"
	"testing"
)

// TestHashSpreads: hash tells apart keys that differ in one bit, or in their length
// alone, at every length to past maxInline; each bit of the hash flips for about half
// of a key's one-bit changes (the avalanche a shard's pick needs); and two hashers (two
// Stores) hash a key differently.
func TestHashSpreads(t *testing.T) {
	h1, h2 := newHasher(), newHasher()
	for n := 0; n <= maxInline+8; n++ {
		key := strings.Repeat("k", n)
		seen := map[uint64]string{}
		add := func(k string) {
			v := h1.hash(k)
			if o, ok := seen[v]; ok && o != k {
				t.Fatalf("keys %q and %q hash alike", o, k)
			}
			seen[v] = k
		}
		add(key)
		add(key + "\x00")
		if n > 0 {
			add(key[:n-1])
		}
		var flips [64]int
		changes := 0
		for i := range n {
			for bit := range 8 {
				b := []byte(key)
				b[i] ^= 1 << bit
				k := string(b)
				add(k)
				d := h1.hash(key) ^ h1.hash(k)
				for j := range 64 {
					flips[j] += int(d >> j & 1)
				}
				changes++
			}
		}
		if changes >= 64 {
			for j, f := range flips {
				if share := float64(f) / float64(changes); share < 0.25 || share > 0.75 {
					t.Errorf("length %d: bit %d of the hash flips for %.2f of one-bit changes", n, j, share)
				}
			}
		}
		if n > 0 && h1.hash(key) == h2.hash(key) {
			t.Errorf("length %d: two hashers agree", n)
		}
	}
}

// TestHashSpreadsShards: 100,000 keys of the forms services use spread evenly over 64
// shards (the hash's low bits pick one).
func TestHashSpreadsShards(t *testing.T) {
	h := newHasher()
	for _, prefix := range []string{"", "user-", "tenant-1234/user-", strings.Repeat("x", maxInline-6)} {
		var counts [64]int
		const keys = 100_000
		for i := range keys {
			counts[h.hash(prefix+strconv.Itoa(i))&63]++
		}
		for s, c := range counts {
			if c < keys/64*8/10 || c > keys/64*12/10 {
				t.Errorf("prefix %q: shard %d holds %d keys, want about %d", prefix, s, c, keys/64)
			}
		}
	}
}

// BenchmarkHash compares hash with maphash.String, at lengths inline and past it.
func BenchmarkHash(b *testing.B) {
	h := newHasher()
	seed := maphash.MakeSeed()
	for _, n := range []int{8, 16, 33, 64} {
		key := strings.Repeat("a", n)
		b.Run("inline/"+strconv.Itoa(n), func(b *testing.B) {
			var x uint64
			for b.Loop() {
				x += h.hash(key)
			}
			_ = bits.OnesCount64(x)
		})
		b.Run("maphash/"+strconv.Itoa(n), func(b *testing.B) {
			var x uint64
			for b.Loop() {
				x += maphash.String(seed, key)
			}
			_ = bits.OnesCount64(x)
		})
	}
}
