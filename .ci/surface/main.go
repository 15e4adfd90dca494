// Command surface counts the public surface of the root module: the exported identifiers
// of every package a user imports (not internal, not sim, not a nested module, not a
// command), as pkg.go.dev lists them: types, functions, methods of exported types,
// constants and variables; struct fields are not counted. It also counts the lines of
// `go doc -all ./hybrid`, the page a newcomer reads first.
//
//	go run ./.ci/surface [-max N] [-hybrid-doc-max N]
//
// It prints one line per package and the totals, and exits 1 when a total is above its
// -max flag (0: no limit).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
)

func main() {
	maxIdents := flag.Int("max", 0, "fail when the exported identifiers are more than this (0: no limit)")
	maxDoc := flag.Int("hybrid-doc-max", 0, "fail when `go doc -all ./hybrid` has more lines than this (0: no limit)")
	flag.Parse()
	counts, err := count(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "surface:", err)
		os.Exit(1)
	}
	dirs := make([]string, 0, len(counts))
	total := 0
	for d, n := range counts {
		dirs = append(dirs, d)
		total += n
	}
	slices.Sort(dirs)
	fmt.Println("public surface of the root module (exported identifiers per package):")
	for _, d := range dirs {
		fmt.Printf("  %-20s %4d\n", d, counts[d])
	}
	doc, err := exec.Command("go", "doc", "-all", "./hybrid").Output()
	if err != nil {
		fmt.Fprintln(os.Stderr, "surface: go doc -all ./hybrid:", err)
		os.Exit(1)
	}
	lines := bytes.Count(doc, []byte("\n"))
	fmt.Printf("  %-20s %4d\n", "total", total)
	fmt.Printf("go doc -all ./hybrid: %d lines\n", lines)
	failed := false
	if *maxIdents > 0 && total > *maxIdents {
		fmt.Printf("FAIL: %d exported identifiers, more than %d\n", total, *maxIdents)
		failed = true
	}
	if *maxDoc > 0 && lines > *maxDoc {
		fmt.Printf("FAIL: go doc -all ./hybrid is %d lines, more than %d\n", lines, *maxDoc)
		failed = true
	}
	if failed {
		os.Exit(1)
	}
}

// count returns the exported identifiers of each public package under root.
func count(root string) (map[string]int, error) {
	counts := map[string]int{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p == root {
				return nil
			}
			name := d.Name()
			if name == "internal" || name == "testdata" || name == "sim" || name == "cmd" || strings.HasPrefix(name, ".") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // a nested module
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		counts[filepath.ToSlash(filepath.Dir(p))] += exported(f)
		return nil
	})
	return counts, err
}

// exported counts f's exported top-level identifiers and methods of exported types.
func exported(f *ast.File) int {
	n := 0
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Name.IsExported() && (d.Recv == nil || exportedRecv(d.Recv.List[0].Type)) {
				n++
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						n++
					}
				case *ast.ValueSpec:
					for _, name := range s.Names {
						if name.IsExported() {
							n++
						}
					}
				}
			}
		}
	}
	return n
}

// exportedRecv reports whether a method's receiver type is exported.
func exportedRecv(t ast.Expr) bool {
	for {
		switch x := t.(type) {
		case *ast.StarExpr:
			t = x.X
		case *ast.IndexExpr:
			t = x.X
		case *ast.IndexListExpr:
			t = x.X
		case *ast.Ident:
			return x.IsExported()
		default:
			return false
		}
	}
}
