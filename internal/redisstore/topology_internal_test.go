package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestHookOnce: the Stores made on one Cluster client hook it once, whatever their
// number; another client gets its own hook.
func TestHookOnce(t *testing.T) {
	a := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRedirects: -1})
	b := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, MaxRedirects: -1})
	defer a.Close()
	defer b.Close()
	for i := range 3 {
		if _, err := New(a, Prefix("t"+string(rune('a'+i))+":")); err != nil {
			t.Fatal(err)
		}
	}
	if hookOnce(a) {
		t.Error("a client three Stores were made on was hooked again")
	}
	if !hookOnce(b) || hookOnce(b) {
		t.Error("another client: want hooked once, on its first call")
	}
}
