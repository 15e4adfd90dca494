//go:build unix

package redisstore_test

import (
	"syscall"
	"time"
)

// processCPU is the CPU time, user and system, this process has used: with Redis in a
// process of its own, the client's cost of the calls a benchmark makes.
func processCPU() (time.Duration, bool) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
