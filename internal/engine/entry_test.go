package engine

import (
	"testing"
	"unsafe"

	"github.com/fleetlimit/fleetlimit/internal/keystore"
)

// TestEntrySize: a key's entry holds only what every kind needs and a pointer to a
// windowed key's state, so a bucket key costs at most 264 bytes of it (the key store
// adds its own list node and the key's bytes). With the store's fields a key's state is
// the 328 bytes entry's pad was measured for (see the pad's comment): a field added or
// taken away must measure the layout again.
func TestEntrySize(t *testing.T) {
	size := unsafe.Sizeof(entry{})
	t.Logf("entry %d bytes (pre-check %d, lease %d), a windowed key's state %d more", size,
		unsafe.Sizeof(entry{}.pre), unsafe.Sizeof(entry{}.lease), unsafe.Sizeof(wkey{}))
	if size > 264 {
		t.Errorf("entry is %d bytes, want at most 264", size)
	}
	if got := unsafe.Sizeof(keystore.Entry[entry]{}); got != 328 {
		t.Errorf("a key's state is %d bytes, want 328: measure AllowLease10kKeys against the layout before, and set entry's pad", got)
	}
}
