// Package rediscost measures what Redis spends executing fleetlimit's scripts and the
// commands of its windowed limits, on a redis-server it starts itself: the figures the
// simulator's Redis cost model is scaled from (see TestRedisCost).
package rediscost
