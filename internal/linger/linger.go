// Package linger marks a breaker call whose answer its caller reads even when it comes
// after breaker.Do has given up on it: a take (a refill's, or a reservation's claim),
// whose grant Redis has spent once the take ran. Such a call keeps its context, and so its connection's read deadline, to
// the breaker's longer probe deadline (breaker.Settings.HalfOpenProbes) rather than
// ending when Do returns at the breaker's Timeout.
package linger

import "context"

type key struct{}

// With returns ctx marked: a breaker call made with it lingers.
func With(ctx context.Context) context.Context { return context.WithValue(ctx, key{}, true) }

// Wanted reports whether ctx is marked.
func Wanted(ctx context.Context) bool {
	v, _ := ctx.Value(key{}).(bool)
	return v
}
