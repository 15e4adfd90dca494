package hybrid

import (
	"fmt"
	"time"
)

// Mode is a Limit's kind: how a request that this server's tokens cannot serve reaches
// Redis. docs/limits.md states what each guarantees and costs. Modes are comparable.
type Mode struct {
	kind modeKind
	d    time.Duration // ChargeLater's within, Windowed's report interval
}

type modeKind uint8

const (
	modeExact modeKind = iota
	modeChargeLater
	modeWindowed
)

// Exact is the default Mode: servers lease tokens in batches from a bucket in Redis; any
// window W admits at most 2·Burst + Rate·W.
func Exact() Mode { return Mode{} }

// ChargeLater is the Mode for per-client keys spread over more servers than their burst:
// a request the lease cannot serve is admitted at once, unless the key is known low, and
// charged to the bucket within the given time (at least 1ms; 0 is Exact). On a Redis
// Cluster the keys known low are shared in 10 sets spread over the masters.
func ChargeLater(within time.Duration) Mode { return mode(modeChargeLater, within) }

// Windowed is the Mode for per-client keys at modest rates over many servers: each key
// gets Burst requests per window of Burst/Rate, counted in Redis, each server reporting
// its counts every report (1ms to 10s and at most half the window; 0 is Exact). On a
// Redis Cluster the limit's keys are counted in 60 shards spread over the masters.
func Windowed(report time.Duration) Mode { return mode(modeWindowed, report) }

// mode is the Mode of kind with duration d; a zero d makes Exact.
func mode(kind modeKind, d time.Duration) Mode {
	if d == 0 {
		return Mode{}
	}
	return Mode{kind: kind, d: d}
}

// String describes the mode: "exact", "charge-later(100ms)" or "windowed(120ms)".
func (m Mode) String() string {
	switch m.kind {
	case modeChargeLater:
		return fmt.Sprintf("charge-later(%v)", m.d)
	case modeWindowed:
		return fmt.Sprintf("windowed(%v)", m.d)
	}
	return "exact"
}
