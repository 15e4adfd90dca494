package engine

import (
	"testing"
	"unsafe"
)

// TestEntrySize: a key's entry holds only what every kind needs and a pointer to a
// windowed key's state, so a bucket key costs at most 264 bytes of it (the key store
// adds its own list node and the key's bytes).
func TestEntrySize(t *testing.T) {
	size := unsafe.Sizeof(entry{})
	t.Logf("entry %d bytes (pre-check %d, lease %d), a windowed key's state %d more", size,
		unsafe.Sizeof(entry{}.pre), unsafe.Sizeof(entry{}.lease), unsafe.Sizeof(wkey{}))
	if size > 264 {
		t.Errorf("entry is %d bytes, want at most 264", size)
	}
}
