package rediscost

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
)

// TestRefundCalls measures, on a redis-server of its own, what a refund costs Redis
// when luascript.Refund carries one key a call and when it carries several, as
// redisstore.Store.RefundBatch sends them: the refunds of a Close, 256 a round trip, to
// the per-client keys of the comparison's "zipf 10k" scenario (10,000 keys, Zipf s =
// 1.1, a limit of 1,000,000/s and burst) that 8 servers took from first (60,000 takes).
// Each width refunds 40,192 times a round, the widths take turns, 5 rounds; it logs
// Redis's CPU (INFO cpu: the commands, their parsing and the replies) per refund, and
// the medians.
//
//	go -C bench test ./rediscost -run TestRefundCalls -v -args -rediscost
func TestRefundCalls(t *testing.T) {
	ctx, c := ownServer(t)
	take, refund := luascript.Take, luascript.Refund
	for _, s := range []interface {
		Load(ctx context.Context, c redis.Scripter) *redis.StringCmd
	}{take, refund} {
		if err := s.Load(ctx, c).Err(); err != nil {
			t.Fatal(err)
		}
	}
	const servers, keys, trip = 8, 10000, 256
	r := rand.New(rand.NewPCG(1, 2))
	zipf := rand.NewZipf(r, 1.1, 1, keys-1)
	var seq [servers]int
	next := func(s int) int { seq[s]++; return seq[s] }
	key := func(k uint64) string { return "fl:{zipf}:k" + strconv.FormatUint(k, 10) }
	for i := 0; i < 60000; i += trip {
		p := c.Pipeline()
		for range trip {
			s := r.IntN(servers)
			take.EvalSha(ctx, p, []string{key(zipf.Uint64())}, 1e6, 1e6, 7, 1, "srv"+strconv.Itoa(s), next(s), 0)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cpu := func() float64 { return redisCPU(ctx, t, c) }
	widths := []int{1, 4, 32}
	per := make([][]float64, len(widths))
	const n = 157 * trip
	for round := range 5 {
		for w, width := range widths {
			c0 := cpu()
			for i := 0; i < n; i += trip {
				p := c.Pipeline()
				for j := i; j < i+trip; j += width {
					ks, args := make([]string, 0, width), make([]any, 0, 8*width)
					for q := j; q < j+width; q++ {
						s := q % servers
						ks = append(ks, key(zipf.Uint64()))
						args = append(args, 1e6, 1e6, 5, "srv"+strconv.Itoa(s), next(s), 0, 1000000, "")
					}
					refund.EvalSha(ctx, p, ks, args...)
				}
				if _, err := p.Exec(ctx); err != nil {
					t.Fatal(err)
				}
			}
			per[w] = append(per[w], (cpu()-c0)*1e6/n)
			t.Logf("round %d, %2d keys a call: %.2f µs of Redis CPU a refund", round, width, per[w][round])
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	for w, width := range widths {
		m := median(per[w])
		t.Logf("%2d keys a call: %.2f µs a refund, %.2f of one a call (rounds %.2f)", width, m, m/median(per[0]), per[w])
	}
}
