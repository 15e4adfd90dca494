//go:build race

package fleetlimit_test

// raceEnabled reports whether the tests run under the race detector.
const raceEnabled = true
