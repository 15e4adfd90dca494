// Package snippet keeps a README's code snippets equal to the compiled, run Examples
// they are taken from: the README's ```go block after a marker comment must be the
// Example's code between "// README:start" and "// README:end", one tab less indented.
package snippet

import (
	"fmt"
	"os"
	"strings"
)

// Check compares the ```go block that follows marker in the file readme with the
// README region of the Go file example, and returns an error that says what to put in
// the README when they differ.
func Check(readme, example, marker string) error {
	rd, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	src, err := os.ReadFile(example)
	if err != nil {
		return err
	}
	_, region, ok := strings.Cut(string(src), "// README:start\n")
	region, _, ok2 := strings.Cut(region, "\t// README:end")
	if !ok || !ok2 {
		return fmt.Errorf("%s: no README:start / README:end region", example)
	}
	var want strings.Builder
	for _, line := range strings.SplitAfter(region, "\n") {
		want.WriteString(strings.TrimPrefix(line, "\t"))
	}
	_, after, ok := strings.Cut(string(rd), marker)
	if !ok {
		return fmt.Errorf("%s: no %q marker", readme, marker)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	block, _, ok2 = strings.Cut(block, "```\n")
	if !ok || !ok2 {
		return fmt.Errorf("%s: no ```go block after %q", readme, marker)
	}
	if block != want.String() {
		return fmt.Errorf("%s's snippet after %q differs from %s; put this in it:\n```go\n%s```", readme, marker, example, want.String())
	}
	return nil
}
