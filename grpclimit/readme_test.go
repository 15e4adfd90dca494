package grpclimit_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/internal/snippet"
)

// TestREADMEMatchesExample keeps the README's gRPC snippet equal to the code between
// "README:start" and "README:end" in Example, which compiles and runs.
func TestREADMEMatchesExample(t *testing.T) {
	if err := snippet.Check("../README.md", "example_test.go", "<!-- from grpclimit/example_test.go Example"); err != nil {
		t.Error(err)
	}
}
