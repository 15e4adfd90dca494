package rediscost

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/luascript"
)

// takePart is a part of the take script cut out, to measure what it costs: the
// script's text with old replaced by new.
type takePart struct {
	name     string
	old, new string
}

// takeParts are the parts of a take that a leaner script could hope to save: its Redis
// commands, the checks of its arguments, and reading and writing its fields as text (the
// credit's, and the server's record: a constant in their place, of the same kind). TIME
// is not among them: a take without it must be given a clock, and a fixed one changes
// what the take writes (its credit stops growing); nor the parameters' field p: a
// constant read there is stale, and the take writes p anew every call.
var takeParts = []takePart{
	{"HSET", "redis.call('HSET', KEYS[1], unpack(set))", "local _ = set"},
	{"PEXPIRE", "redis.call('PEXPIRE', KEYS[1], ", "local _ = math.max(0, "},
	{"HLEN", "if state[1] and redis.call('HLEN', KEYS[1]) > 256 then", "if false then"},
	{"argument checks", "if not (capacity and rate and want", "if false and not (capacity and rate and want"},
	{"reading the credit", "local held_credit, c_at = string.match(state[5] or '', '^(%S+) (%S+)$')", "local held_credit, c_at = '0', '0'"},
	{"formatting the credit", "local credit_s = string.format('%.17g', credit)", "local credit_s = '1'"},
	{"reading the record", "local rseq = num(string.match(rec, '^(%S+) '))", "local rseq = 0"},
	{"formatting the record", "field, ARGV[6] .. ' ' .. granted .. ' ' .. left .. ' ' .. (wait == 0 and '0' or wait) .. ' ' .. now_s }", "field, 'x' }"},
}

// TestTakeParts measures, on a redis-server of its own, what each part of a take costs
// Redis on per-client keys: the take on the keys of the comparison's "zipf 10k"
// scenario (10,000 keys, Zipf s = 1.1, a limit of 1,000,000/s and burst, 1-3 tokens a
// take) by 8 servers, against the same script with one part cut out, from INFO
// commandstats (Redis's time executing EVALSHA, network excluded). Each variant runs on
// an empty server that the whole take fills first (10,240 calls), then 30,016 calls of
// the variant are measured, 64 a round trip: a variant that writes less still finds the
// hashes a take finds. The variants take turns, 5 rounds, and the medians are logged.
//
//	go -C bench test ./rediscost -run TestTakeParts -v -args -rediscost
func TestTakeParts(t *testing.T) {
	ctx, c := ownServer(t)
	// The whole take first, then a variant per part; each variant's per-call costs by round.
	type variant struct {
		name    string
		script  *redis.Script
		perCall []float64
	}
	vs := []*variant{{name: "take", script: luascript.Take}}
	for _, p := range takeParts {
		if strings.Count(luascript.TakeSource, p.old) != 1 {
			t.Fatalf("the take script no longer holds %q once: update takeParts", p.old)
		}
		vs = append(vs, &variant{name: "without " + p.name, script: redis.NewScript(strings.Replace(luascript.TakeSource, p.old, p.new, 1))})
	}
	for _, v := range vs { // FLUSHALL keeps the script cache
		if err := v.script.Load(ctx, c).Err(); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
	}
	const fill, measured, servers = 10240, 30016, 8 // multiples of the round trip's 64
	for round := range 5 {
		for _, v := range vs {
			if err := c.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, uint64(round)))
			zipf := rand.NewZipf(r, 1.1, 1, 9999)
			var seq [servers]int
			for i := 0; i < fill+measured; i += 64 {
				s := vs[0].script
				if i >= fill {
					s = v.script
				}
				if i == fill {
					if err := c.ConfigResetStat(ctx).Err(); err != nil {
						t.Fatal(err)
					}
				}
				p := c.Pipeline()
				for j := i; j < i+64; j++ {
					k, sv := zipf.Uint64(), r.IntN(servers)
					seq[sv]++
					s.EvalSha(ctx, p, []string{"fl:{zipf}:k" + strconv.FormatUint(k, 10)}, 1e6, 1e6, 1+j%3, 1, "srv"+strconv.Itoa(sv), seq[sv], 1)
				}
				if _, err := p.Exec(ctx); err != nil {
					t.Fatalf("%s: %v", v.name, err)
				}
			}
			n, us := commandStat(ctx, t, c, "evalsha")
			v.perCall = append(v.perCall, us/n)
		}
	}
	median := func(xs []float64) float64 {
		xs = slices.Clone(xs)
		slices.Sort(xs)
		return xs[len(xs)/2]
	}
	whole := median(vs[0].perCall)
	t.Logf("a take on per-client keys by %d servers: %.2f µs per call (rounds %.2f)", servers, whole, vs[0].perCall)
	for _, v := range vs[1:] {
		m := median(v.perCall)
		t.Logf("%-30s %.2f µs per call: the part costs %5.2f µs, %4.1f%% (rounds %.2f)", v.name, m, whole-m, 100*(whole-m)/whole, v.perCall)
	}
}
