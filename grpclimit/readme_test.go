package grpclimit_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEMatchesExample keeps the README's gRPC snippet equal to the code between
// "README:start" and "README:end" in Example, which compiles and runs.
func TestREADMEMatchesExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	_, region, ok := strings.Cut(string(src), "// README:start\n")
	region, _, ok2 := strings.Cut(region, "\t// README:end")
	if !ok || !ok2 {
		t.Fatal("example_test.go: no README:start / README:end region")
	}
	var want strings.Builder
	for _, line := range strings.SplitAfter(region, "\n") {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}
	const marker = "<!-- from grpclimit/example_test.go Example"
	_, after, ok := strings.Cut(string(readme), marker)
	if !ok {
		t.Fatalf("README.md: no %q marker", marker)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	block, _, ok2 = strings.Cut(block, "```\n")
	if !ok || !ok2 {
		t.Fatal("README.md: no ```go block after the marker")
	}
	if block != want.String() {
		t.Errorf("README.md's gRPC snippet differs from Example; put this in README.md:\n```go\n%s```", want.String())
	}
}
