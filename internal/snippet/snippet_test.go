package snippet

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheck: an equal snippet passes; a changed line, a missing marker and a missing
// region fail, the first saying what to write.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	example := filepath.Join(dir, "example_test.go")
	readme := filepath.Join(dir, "README.md")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(example, "func Example() {\n\t// README:start\n\tx := 1\n\tif x > 0 {\n\t\tprintln(x)\n\t}\n\t// README:end\n}\n")
	write(readme, "# r\n<!-- from e -->\n```go\nx := 1\nif x > 0 {\n\tprintln(x)\n}\n```\n")
	if err := Check(readme, example, "<!-- from e"); err != nil {
		t.Errorf("equal snippet: %v", err)
	}
	write(readme, "# r\n<!-- from e -->\n```go\nx := 2\n```\n")
	if err := Check(readme, example, "<!-- from e"); err == nil || !strings.Contains(err.Error(), "x := 1") {
		t.Errorf("changed snippet: %v, want an error showing the Example's code", err)
	}
	if err := Check(readme, example, "<!-- other"); err == nil {
		t.Error("missing marker: no error")
	}
	write(example, "func Example() {}\n")
	if err := Check(readme, example, "<!-- from e"); err == nil {
		t.Error("missing region: no error")
	}
}
