package hybrid

import (
	"fmt"
	"time"
)

// Mode is a Limit's kind: how a request that this server's tokens cannot serve reaches
// Redis. Exact (the zero Mode, the default), ChargeLater and Windowed make one;
// docs/limits.md states what each guarantees and costs. Modes are comparable values:
// l.Mode == Windowed(l.Mode.Duration()) reports a windowed limit.
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

// Exact is the default Mode, the zero Mode: a token bucket in Redis that servers lease
// tokens from in batches; a request the lease cannot serve waits for Redis. Any window
// W admits at most 2·Burst + Rate·W.
func Exact() Mode { return Mode{} }

// ChargeLater is the Mode for per-client keys spread over more servers than their burst:
// a request the lease cannot serve is admitted at once, unless this server knows the key's
// bucket is low, and charged to the bucket within the given time (at least 1ms;
// ChargeLater(0) is Exact()). docs/limits.md, "Charge later", states its bound and costs.
func ChargeLater(within time.Duration) Mode { return mode(modeChargeLater, within) }

// Windowed is the Mode for per-client keys at modest rates over many servers, at a tenth
// of a bucket's Redis work: each key gets Burst requests per window of Burst/Rate, counted
// in Redis without a script, each server reporting its counts every report: at least 1ms,
// at most 10s and half the window (120ms suits windows of a quarter second or more).
// Windowed(0) is Exact(). docs/limits.md, "Windowed limits", states its bound and costs.
func Windowed(report time.Duration) Mode { return mode(modeWindowed, report) }

// mode is the Mode of kind with duration d; a zero d makes Exact.
func mode(kind modeKind, d time.Duration) Mode {
	if d == 0 {
		return Mode{}
	}
	return Mode{kind: kind, d: d}
}

// Duration returns ChargeLater's within or Windowed's report interval: 0 for Exact.
func (m Mode) Duration() time.Duration { return m.d }

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
