package breaker

import (
	"context"
	"io"
	"testing"
	"time"
)

// BenchmarkDo is the cost of guarding a call that answers at once: the
// deadline context, the call's goroutine and the bookkeeping. A Redis round
// trip is tens of microseconds or more.
func BenchmarkDo(b *testing.B) {
	br, err := New(Settings{Timeout: time.Second}) // a busy machine must not time it out
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	answer := func(context.Context) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := br.Do(ctx, answer); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDoOpen is the cost of a call refused while the breaker is open:
// what a request pays to learn that it must go to its fallback.
func BenchmarkDoOpen(b *testing.B) {
	br, err := New(Settings{FailureThreshold: 1, OpenTimeout: 1 << 62})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	br.Do(ctx, func(context.Context) error { return io.EOF })
	b.ReportAllocs()
	for b.Loop() {
		br.Do(ctx, nil)
	}
}
