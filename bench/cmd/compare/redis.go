package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a private redis-server this command started: no persistence, bound to
// loopback on a port the kernel chose, its files in a temporary directory.
type redisServer struct {
	Addr    string
	Version string
	cmd     *exec.Cmd
	dir     string
	exited  chan struct{}
}

// startRedis starts bin (a redis-server) on a spare loopback port and waits until it
// answers PING. The caller must call stop, on every path.
func startRedis(ctx context.Context, bin string) (*redisServer, error) {
	path, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redis-server not found (install it, or pass -redis-server): %w", err)
	}
	port, err := sparePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "fleetlimit-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("temp dir for redis-server: %w", err)
	}
	s := &redisServer{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, exited: make(chan struct{})}
	s.cmd = exec.Command(path,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
		"--daemonize", "no")
	s.cmd.SysProcAttr = childAttr()
	if err := s.cmd.Start(); err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	go func() { _ = s.cmd.Wait(); close(s.exited) }()

	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer func() { _ = rdb.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err = rdb.Ping(ctx).Err()
		if err == nil {
			break
		}
		select {
		case <-s.exited:
			s.stop()
			return nil, fmt.Errorf("redis-server exited at start (see its log above): %w", err)
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			s.stop()
			return nil, fmt.Errorf("redis-server at %s does not answer: %w", s.Addr, errors.Join(err, ctx.Err()))
		}
		time.Sleep(20 * time.Millisecond)
	}
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("INFO server: %w", err)
	}
	s.Version = infoFields(info)["redis_version"]
	return s, nil
}

// stop ends the server (SIGTERM, then SIGKILL after two seconds) and removes its files;
// it prints the server's log when the server did not run to the end.
func (s *redisServer) stop() {
	if s.cmd.Process != nil {
		select {
		case <-s.exited:
			if b, err := os.ReadFile(filepath.Join(s.dir, "redis.log")); err == nil {
				fmt.Fprintf(os.Stderr, "redis-server log:\n%s", b)
			}
		default:
			_ = s.cmd.Process.Signal(terminate)
			select {
			case <-s.exited:
			case <-time.After(2 * time.Second):
				_ = s.cmd.Process.Kill()
				<-s.exited
			}
		}
	}
	_ = os.RemoveAll(s.dir)
}

// sparePort returns a loopback TCP port nobody listens on now, never Redis's 6379.
func sparePort() (int, error) {
	for range 10 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a spare port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if port != 6379 {
			return port, nil
		}
	}
	return 0, errors.New("find a spare port: the kernel keeps offering 6379")
}

// infoFields parses the reply of INFO into its name:value fields.
func infoFields(info string) map[string]string {
	m := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
