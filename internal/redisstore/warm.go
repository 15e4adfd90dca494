package redisstore

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
)

// WarmConns is how many connections Warm opens to each Redis node: the calls of one
// hybrid.Limiter go out one at a time, and a call given up at its deadline may hold a
// connection until its reply comes.
const WarmConns = 2

// Warm readies Redis and the client for a limiter's first requests, so that they cost
// what every later request costs: it loads the scripts into the script cache of every
// node (of every master of a Cluster, every shard of a Ring) and opens WarmConns connections to each. A first
// call that waited for both could run past a breaker's 10 ms deadline on a healthy
// Redis. hybrid.New starts it (Limiter.Ready waits for it); calls that run before or
// while Warm does are served as usual.
//
// It returns the errors of the nodes it could not ready, classified as the Store's
// calls are; a Scripter that is not a go-redis client only gets its scripts loaded.
func (s *Store) Warm(ctx context.Context) error {
	if walk := nodesOf(s.c); walk != nil {
		return onEachNode(ctx, walk, "warm", func(ctx context.Context, c *redis.Client) error {
			return warmNode(ctx, c, c)
		})
	}
	c, _ := s.c.(*redis.Client)
	return warmNode(ctx, s.c, c)
}

// warmNode loads the scripts through sc and, if c is set, opens WarmConns connections of
// its pool.
func warmNode(ctx context.Context, sc redis.Scripter, c *redis.Client) error {
	at := "warm"
	if c != nil {
		at += " " + c.Options().Addr
	}
	for _, script := range []*redis.Script{luascript.Take, luascript.Refund, luascript.Heartbeat, luascript.Low, luascript.Bucket} {
		if err := script.Load(ctx, sc).Err(); err != nil {
			return wrap(at, err)
		}
	}
	if c == nil {
		return nil
	}
	conns := make([]*redis.Conn, 0, WarmConns)
	defer func() {
		for _, cn := range conns {
			_ = cn.Close() // back to the pool, open and idle
		}
	}()
	for range WarmConns {
		cn := c.Conn()
		conns = append(conns, cn)
		if err := cn.Ping(ctx).Err(); err != nil {
			return wrap(at, err)
		}
	}
	return nil
}
