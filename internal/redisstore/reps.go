package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
	"github.com/fleetlimit/fleetlimit/internal/storeerr"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

// Reps records members, the representations of this server's limits (how their keys
// are counted: internal/engine's reps.go), in the fleet's record (wire.RepsKey) until
// live from now by Redis's clock, and returns every member live in it, this server's
// included. It runs luascript.Low's script on the record: a member's time only moves later,
// and those whose time has passed go.
func (s *Store) Reps(ctx context.Context, members []string, live time.Duration) ([]string, error) {
	if live < time.Millisecond {
		return nil, fmt.Errorf("%w: representations live %v, shorter than 1ms", storeerr.ErrInvalidLimit, live)
	}
	args := lowArgs(members, nil, live, wire.MaxLowReply)
	reply, err := luascript.Low.Run(ctx, s.c, []string{wire.RepsKey(s.prefix)}, args...).Result()
	if err != nil {
		return nil, wrap("representations", err)
	}
	got, err := wire.ParseLow(reply)
	if err != nil {
		return nil, unexpected("representations", err.Error())
	}
	return got, nil
}
