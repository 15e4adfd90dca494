// Package redisstore is the Redis tier's implementation: the Store that runs the scripts
// of package lua against a go-redis client, and the calls only the engine makes on it —
// batched takes and refunds, heartbeats, low-key marks and windowed counts.
//
// Package global is its public face: global.Store wraps a Store, and the library's own
// packages reach it through Of. What a user sees of a bucket, its keys, its errors and
// its guarantees is documented there.
package redisstore

// Of returns the Store behind a *global.Store. Package global sets it when it is
// initialized; the store is passed as any because global imports this package.
var Of func(store any) *Store
