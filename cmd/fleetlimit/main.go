// Command fleetlimit answers the questions of the people who run a fleetlimit
// deployment, without writing Go:
//
//	fleetlimit doctor  -addr host:port [-cluster] [-deadline 10ms] [-prefix fl:]
//	    Is this Redis (or Cluster) fit to hold the limits? Each check prints PASS, WARN
//	    or FAIL and, when it does not pass, the fix: version, eviction policy, scripts,
//	    BITFIELD, round-trip time (against the breaker's deadline the fleet runs with),
//	    and on a Cluster its state and full-coverage setting. Exit status 1 if a check
//	    fails.
//	fleetlimit inspect -addr host:port [-cluster] -limit NAME -key KEY [-prefix fl:]
//	    What does Redis hold for this limit and key right now: the bucket's fields and
//	    expiry (with -rate and -burst: the windowed limit's count in the key's window).
//	fleetlimit simulate FILE -out DIR [-src DIR]
//	    What will this configuration do on our fleet: runs the scenario FILE (a JSON
//	    object of sim.Scenario's fields) through the fleet simulator under each strategy
//	    and writes DIR/index.html, each run's figures and the plots of admissions and
//	    breakers over time. It runs the simulator with the Go toolchain (go test ./sim
//	    in fleetlimit's source: the checkout it is run in, or the module cache).
//
// Every command takes -user and -password (default $REDIS_USERNAME and $REDIS_PASSWORD)
// for a Redis with ACL users, and -tls (with -tls-ca FILE for a CA of your own) for one
// that speaks TLS.
//
// Build it from a clone of the repository: go -C cmd/fleetlimit build -o fleetlimit .
// (its go.mod takes the library from the checkout, which go run …@version refuses).
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetlimit/fleetlimit/internal/redisstore"
	"github.com/fleetlimit/fleetlimit/internal/wire"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command with its arguments and outputs: its exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(stderr, "usage: fleetlimit doctor|inspect|simulate [flags]; fleetlimit <command> -h for its flags")
		return 2
	}
	if args[0] == "simulate" {
		return simulate(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet(args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:6379", "Redis address (for a Cluster, any node's)")
	cluster := fs.Bool("cluster", false, "the address is a Redis Cluster node")
	user := fs.String("user", "", "Redis ACL user (default $REDIS_USERNAME, else the default user)")
	useTLS := fs.Bool("tls", false, "connect with TLS, the server's certificate checked against the system's roots")
	tlsCA := fs.String("tls-ca", "", "with -tls: a PEM file of the CA certificates to check the server's against, instead of the system's")
	// Read after parsing: a default is printed in the usage text.
	password := fs.String("password", "", "Redis password (default $REDIS_PASSWORD)")
	ins := inspectFlags{width: wire.DefaultWindowWidth}
	fs.StringVar(&ins.prefix, "prefix", "fl:", "the Store's key prefix (global.Prefix): doctor's test key goes under it too, for an ACL of key patterns")
	timeout := fs.Duration("timeout", 5*time.Second, "how long the whole command may take")
	var deadline *time.Duration
	switch args[0] {
	case "doctor":
		deadline = fs.Duration("deadline", 10*time.Millisecond, "the breaker's deadline the fleet runs with (breaker.Settings.Timeout): round trips are judged against it")
	case "inspect":
		fs.StringVar(&ins.limit, "limit", "", "the limit's name")
		fs.StringVar(&ins.key, "key", "", "the client key")
		fs.Float64Var(&ins.rate, "rate", 0, "a windowed limit's rate per second (with -burst): read its window counts")
		fs.IntVar(&ins.burst, "burst", 0, "a windowed limit's burst (with -rate)")
		fs.IntVar(&ins.width, "width", ins.width, "a windowed limit's counters per row over all its shards: hybrid.Limiter's are the default")
	default:
		fmt.Fprintf(stderr, "fleetlimit: unknown command %q: doctor, inspect or simulate\n", args[0])
		return 2
	}
	if err := fs.Parse(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		// The flags stop at the first argument that is not one: "doctor 10.0.0.5:6379
		// -cluster" would check the default address, without -cluster.
		fmt.Fprintf(stderr, "fleetlimit %s: unexpected argument %q: every option is a flag (-addr host:port), and flags come first\n", args[0], fs.Arg(0))
		return 2
	}
	if *password == "" {
		*password = os.Getenv("REDIS_PASSWORD")
	}
	if *user == "" {
		*user = os.Getenv("REDIS_USERNAME")
	}
	if deadline != nil && *deadline <= 0 {
		fmt.Fprintf(stderr, "fleetlimit: -deadline %v: want a positive duration\n", *deadline)
		return 2
	}
	if *timeout <= 0 {
		fmt.Fprintf(stderr, "fleetlimit: -timeout %v: want a positive duration\n", *timeout)
		return 2
	}
	if w := ins.width; w < redisstore.MinWindowWidth || w > redisstore.MaxWindowWidth || w&(w-1) != 0 {
		fmt.Fprintf(stderr, "fleetlimit: -width %d: want a power of two from %d to %d\n", w, redisstore.MinWindowWidth, redisstore.MaxWindowWidth)
		return 2
	}
	var tc *tls.Config
	if *useTLS {
		var err error
		if tc, err = tlsConfig(*addr, *tlsCA); err != nil {
			fmt.Fprintln(stderr, "fleetlimit:", err)
			return 2
		}
	} else if *tlsCA != "" {
		fmt.Fprintln(stderr, "fleetlimit: -tls-ca needs -tls")
		return 2
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	var c redis.UniversalClient
	if ins.shards = 1; *cluster {
		ins.shards = wire.WindowShards
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{*addr}, Username: *user, Password: *password, MaxRedirects: -1, TLSConfig: tc})
	} else {
		c = redis.NewClient(&redis.Options{Addr: *addr, Username: *user, Password: *password, MaxRetries: -1, TLSConfig: tc})
	}
	defer c.Close()
	if !*cluster && clusterNode(ctx, c) {
		// Its keys are on every master: a plain client would check or read one node's,
		// and a key of another's slot answers MOVED.
		fmt.Fprintf(stderr, "fleetlimit %s: %s is a Redis Cluster node: add -cluster\n", args[0], *addr)
		return 2
	}
	var err error
	if args[0] == "doctor" {
		var failed bool
		failed, err = doctor(ctx, c, *cluster, *deadline, ins.prefix, stdout)
		if err == nil && failed {
			return 1
		}
	} else {
		err = inspect(ctx, c, ins, stdout)
	}
	if err != nil {
		fmt.Fprintln(stderr, "fleetlimit:", err)
		if errors.Is(err, errUsage) {
			return 2
		}
		return 1
	}
	return 0
}

var errUsage = errors.New("usage")

// clusterNode reports whether c's server says it is a Redis Cluster node (INFO cluster);
// false when it cannot tell (no answer, INFO refused), which the command's own calls
// then report.
func clusterNode(ctx context.Context, c redis.UniversalClient) bool {
	info, err := c.Info(ctx, "cluster").Result()
	return err == nil && field(info, "cluster_enabled") == "1"
}

// tlsConfig is the TLS configuration of a connection to addr: each server's certificate
// checked for the host it is dialled at (addr's, and on a Cluster each node's: the
// config names none, so the dial takes it from the address) against the system's roots,
// or the CA certificates of the PEM file ca when it is not empty.
func tlsConfig(addr, ca string) (*tls.Config, error) {
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("-addr %q: %w", addr, err)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca %s: no PEM certificate in it", ca)
		}
	}
	return tc, nil
}
