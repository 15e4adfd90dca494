package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// Env is where and how a report was measured.
type Env struct {
	Date          string            `json:"date"`
	Command       string            `json:"command"`
	CPUs          int               `json:"cpus"`
	CPUModel      string            `json:"cpu_model,omitempty"`
	Uname         string            `json:"uname"`
	GoVersion     string            `json:"go_version"`
	RedisServer   string            `json:"redis_server"`
	RedisVersion  string            `json:"redis_version"`
	FleetlimitRev string            `json:"fleetlimit_rev,omitempty"`
	Modules       map[string]string `json:"modules"`
	DurationS     float64           `json:"duration_s"`
	Repeats       int               `json:"repeats"`
	// LoadStart and LoadEnd are the machine's load averages (1, 5 and 15 minutes, from
	// /proc/loadavg) when the measurements started and when they ended: other work on
	// the machine slows the rows.
	LoadStart string `json:"load_start,omitempty"`
	LoadEnd   string `json:"load_end,omitempty"`
}

// environment describes this machine, this binary's module versions and the Redis
// server at hand.
func environment(ctx context.Context, redisBin, redisVersion string, args []string) Env {
	e := Env{
		Date:         time.Now().UTC().Format("2006-01-02 15:04 UTC"),
		Command:      strings.TrimSpace("cd bench && go run ./cmd/compare " + strings.Join(args, " ")),
		CPUs:         runtime.NumCPU(),
		CPUModel:     cpuModel(),
		Uname:        output(ctx, "uname", "-a"),
		GoVersion:    runtime.Version(),
		RedisServer:  output(ctx, redisBin, "--version"),
		RedisVersion: redisVersion,
		Modules:      moduleVersions(),
		LoadStart:    loadAvg(),
	}
	if rev := output(ctx, "git", "rev-parse", "--short=12", "HEAD"); rev != "" {
		e.FleetlimitRev = rev
		if output(ctx, "git", "status", "--porcelain", "--untracked-files=no", "--", "..") != "" {
			e.FleetlimitRev += " with uncommitted changes"
		}
	}
	return e
}

// moduleVersions returns the version of every module this binary was built with, as
// go.mod and go.sum pinned them; a module replaced by a directory reads "=> dir".
func moduleVersions() map[string]string {
	m := make(map[string]string)
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return m
	}
	for _, d := range bi.Deps {
		v := d.Version
		if d.Replace != nil {
			v = "=> " + d.Replace.Path
			if d.Replace.Version != "" {
				v += " " + d.Replace.Version
			}
		}
		m[d.Path] = v
	}
	return m
}

// output runs a command and returns its trimmed output, or "" if it fails.
func output(ctx context.Context, name string, args ...string) string {
	b, err := exec.CommandContext(ctx, name, args...).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// cpuModel returns the processor's model name from /proc/cpuinfo, or "".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// loadAvg returns the load averages over 1, 5 and 15 minutes from /proc/loadavg, or "".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// String is the environment in one line, for the log.
func (e Env) String() string {
	s := fmt.Sprintf("%s; %d CPUs; %s; redis %s", e.Date, e.CPUs, e.GoVersion, e.RedisVersion)
	if e.LoadStart != "" {
		s += "; load average " + e.LoadStart
	}
	return s
}
