package keystore

import (
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
)

// hasher is the Store's seeded hash of its keys: wyhash's mixing, inline, for a key of
// up to maxInline bytes, and maphash past that. A key's hash picks its shard, its table
// and its place there, so a hit hashes it once: maphash.String takes three calls
// down to the runtime's AES hash, this one inlined multiply-mix or two, 41 instructions
// fewer a lease hit (docs/hot-path.md). Its secrets are random per Store, as a Go map's
// seed is, and of the same class as the hash Go's maps use where the CPU has no AES. A
// key that shares another's hash costs no correctness either: its table tells the two
// apart by their keys.
type hasher struct {
	k0, k1 uint64
	seed   maphash.Seed
}

// maxInline is the longest key hash mixes inline: 48 bytes, the IDs of keys not stored
// verbatim (wire.IDLen) and most API keys among them.
const maxInline = 48

func newHasher() hasher {
	return hasher{k0: rand.Uint64(), k1: rand.Uint64() | 1, seed: maphash.MakeSeed()}
}

// hash returns the hash of key.
func (h *hasher) hash(key string) uint64 {
	n := len(key)
	if n > maxInline {
		return maphash.String(h.seed, key)
	}
	seed := h.k0
	var a, b uint64
	switch {
	case n > 16:
		for i := 0; n-i > 16; i += 16 {
			seed = mix(le64(key[i:])^h.k1, le64(key[i+8:])^seed)
		}
		a, b = le64(key[n-16:]), le64(key[n-8:])
	case n >= 8:
		a, b = le64(key), le64(key[n-8:])
	case n >= 4:
		a, b = uint64(le32(key)), uint64(le32(key[n-4:]))
	case n > 0:
		a = uint64(key[0])<<16 | uint64(key[n>>1])<<8 | uint64(key[n-1])
	}
	return mix(h.k1^uint64(n), mix(a^h.k1, b^seed))
}

// mix is wyhash's mum: the two halves of a × b, xored.
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a, b)
	return hi ^ lo
}

// le64 is the first 8 bytes of s, little-endian (the compiler makes it one load).
func le64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// le32 is the first 4 bytes of s, little-endian.
func le32(s string) uint32 {
	_ = s[3]
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}
