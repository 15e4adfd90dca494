package wire

import "strings"

// Slots is the number of hash slots of a Redis Cluster.
const Slots = 16384

// Slot returns the Redis Cluster hash slot of key, as CLUSTER KEYSLOT answers it: the
// CRC16 (XMODEM) of the key's hash tag (what lies between its first '{' and the next '}',
// if not empty) or of the whole key, modulo Slots. Every key fleetlimit writes carries a
// tag, so the prefix never moves a key to another slot.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(0, key)) % Slots
}

// crc16 continues CRC16 (XMODEM) crc over s.
func crc16(crc uint16, s string) uint16 {
	for k := 0; k < len(s); k++ {
		crc = crc<<8 ^ crc16tab[byte(crc>>8)^s[k]]
	}
	return crc
}

// crc16tab is the table of CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0).
var crc16tab = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()
