package keystore

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// TestHashSpreads: at every length from 0 to 8 bytes past maxInline (where maphash takes
// over), over 32 keys a length, hash tells apart keys that differ in one bit or in their
// length alone, and each bit of the hash flips for a quarter to three quarters of the
// keys' one-bit changes (at least 256 of them a length: a fair coin's share stays within
// 8 standard deviations of a half); two hashers (two Stores) hash a key differently.
func TestHashSpreads(t *testing.T) {
	h1, h2 := newHasher(), newHasher()
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n <= maxInline+8; n++ {
		seen := map[uint64]string{}
		add := func(k string) {
			v := h1.hash(k)
			if o, ok := seen[v]; ok && o != k {
				t.Fatalf("keys %q and %q hash alike", o, k)
			}
			seen[v] = k
		}
		var flips [64]int
		changes := 0
		for range 32 {
			b := make([]byte, n)
			for i := range b {
				b[i] = byte(rng.Uint32())
			}
			key := string(b)
			add(key)
			add(key + "\x00")
			if n > 0 {
				add(key[:n-1])
			}
			for i := range n {
				for bit := range 8 {
					b[i] ^= 1 << bit
					k := string(b)
					b[i] ^= 1 << bit
					add(k)
					d := h1.hash(key) ^ h1.hash(k)
					for j := range 64 {
						flips[j] += int(d >> j & 1)
					}
					changes++
				}
			}
			if n > 0 && h1.hash(key) == h2.hash(key) {
				t.Errorf("length %d: two hashers agree on %q", n, key)
			}
		}
		if changes == 0 {
			continue
		}
		for j, f := range flips {
			if share := float64(f) / float64(changes); share < 0.25 || share > 0.75 {
				t.Errorf("length %d: bit %d of the hash flips for %.2f of %d one-bit changes", n, j, share, changes)
			}
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
