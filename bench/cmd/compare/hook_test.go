package main

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"
)

func TestCountHookCountsCommandsAndScripts(t *testing.T) {
	ctx := context.Background()
	var n callCounts
	h := countHook{&n}
	ok := func(context.Context, redis.Cmder) error { return nil }
	okPipe := func(context.Context, []redis.Cmder) error { return nil }

	_ = h.ProcessHook(ok)(ctx, redis.NewCmd(ctx, "evalsha", "abc", 1, "k"))
	noScript := redis.NewCmd(ctx, "evalsha", "abc", 1, "k")
	_ = h.ProcessHook(func(_ context.Context, c redis.Cmder) error {
		c.SetErr(errors.New("NOSCRIPT No matching script. Please use EVAL."))
		return c.Err()
	})(ctx, noScript)
	_ = h.ProcessHook(ok)(ctx, redis.NewCmd(ctx, "eval", "return 1", 0))
	_ = h.ProcessHook(ok)(ctx, redis.NewCmd(ctx, "ping"))
	_ = h.ProcessPipelineHook(okPipe)(ctx, []redis.Cmder{
		redis.NewCmd(ctx, "evalsha", "abc", 1, "a"),
		redis.NewCmd(ctx, "evalsha", "abc", 1, "b"),
		redis.NewCmd(ctx, "bitfield", "w", "overflow", "sat", "incrby", "u16", "0", "1"),
	})
	want := callSnapshot{trips: 5, commands: 7, scripts: 4}
	if got := n.snapshot(); got != want {
		t.Errorf("counted %+v, want %+v", got, want)
	}
	if d := n.snapshot().sub(callSnapshot{trips: 1, commands: 2, scripts: 3}); d != (callSnapshot{4, 5, 1}) {
		t.Errorf("sub = %+v", d)
	}
}
