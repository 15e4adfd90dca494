package redisstore

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/storeerr"
)

// TestWindowBlockAnswer: a transaction of windowsNode's pipeline is the trip's answer
// once EXEC's answer was read whole, even when go-redis gave the pipeline's later error
// to EXEC too (a connection lost after it was read): the trip ran, and must not be
// failed, for its counts would go again. Without EXEC's answer the error is MULTI's,
// else the first command's, else EXEC's.
func TestWindowBlockAnswer(t *testing.T) {
	ctx := context.Background()
	refused := replyError("MOVED 3999 127.0.0.1:6381")
	for _, tc := range []struct {
		name     string
		exec     any // EXEC's answer, nil if none was read
		execErr  error
		multiErr error
		sentErr  error
		wantErr  error // nil: the trip's answer is read
	}{
		{name: "answered", exec: []any{[]any{int64(3), int64(4)}, int64(1)}},
		{name: "answered, then the connection lost", exec: []any{[]any{int64(3), int64(4)}, int64(1)}, execErr: io.EOF},
		{name: "connection lost before EXEC's answer", execErr: io.EOF, multiErr: io.EOF, sentErr: io.EOF, wantErr: storeerr.ErrUnavailable},
		{name: "refused while queued", execErr: replyError("EXECABORT Transaction discarded"), sentErr: refused, wantErr: storeerr.ErrUnavailable},
		{name: "MULTI refused", execErr: replyError("ERR EXEC without MULTI"), multiErr: replyError("ERR MULTI calls can not be nested"), wantErr: storeerr.ErrRedis},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bf := redis.NewIntSliceCmd(ctx, "bitfield", "k")
			exp := redis.NewBoolCmd(ctx, "pexpireat", "k", 1)
			b := windowBlock{cmds: []redis.Cmder{bf, exp}, multi: redis.NewCmd(ctx, "multi"), exec: redis.NewCmd(ctx, "exec")}
			read := false
			b.read = func() error { read = true; return nil }
			for range b.cmds {
				c := redis.NewCmd(ctx)
				if tc.sentErr != nil {
					c.SetErr(tc.sentErr)
				}
				b.sent = append(b.sent, c)
			}
			if tc.exec != nil {
				b.exec.SetVal(tc.exec)
			}
			if tc.execErr != nil {
				b.exec.SetErr(tc.execErr)
			}
			if tc.multiErr != nil {
				b.multi.SetErr(tc.multiErr)
			}
			err := b.answer()
			if tc.wantErr == nil {
				if err != nil || !read || len(bf.Val()) != 2 || bf.Val()[1] != 4 {
					t.Fatalf("answer: %v, read %v, BITFIELD %v", err, read, bf.Val())
				}
				return
			}
			if !errors.Is(err, tc.wantErr) || read {
				t.Fatalf("answer: %v (read %v), want an error wrapping %v", err, read, tc.wantErr)
			}
			if tc.multiErr != nil && !errors.Is(err, tc.multiErr) {
				t.Fatalf("answer: %v, want MULTI's %v", err, tc.multiErr)
			}
			if tc.sentErr != nil && tc.multiErr == nil && !errors.Is(err, tc.sentErr) {
				t.Fatalf("answer: %v, want the queued command's %v", err, tc.sentErr)
			}
		})
	}
}

// replyError is an error reply of Redis, as go-redis gives one (redis.Error).
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}
