package httplimit_test

import (
	"testing"

	"github.com/fleetlimit/fleetlimit/internal/snippet"
)

// TestREADMEMatchesExample keeps the README's use snippet equal to the code between
// "README:start" and "README:end" in Example_service, which compiles and runs: the
// snippet a reader copies is code that works.
func TestREADMEMatchesExample(t *testing.T) {
	if err := snippet.Check("../README.md", "example_test.go", "<!-- from httplimit/example_test.go Example_service"); err != nil {
		t.Error(err)
	}
}
