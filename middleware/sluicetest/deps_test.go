package sluicetest_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestImportsNothingHeavy checks that the package imports only the
// standard library, go-redis (through middleware) and sluice's own
// packages, and that the main module's requirements (go.mod, which lists
// its whole module graph) have no miniredis: that lives in the nested
// module middleware/sluicetest/miniredis.
func TestImportsNothingHeavy(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			p, _ := strconv.Unquote(imp.Path.Value)
			first, _, _ := strings.Cut(p, "/")
			if strings.Contains(first, ".") && !strings.HasPrefix(p, "github.com/sluicehq/sluice/") {
				t.Errorf("%s imports %s", f, p)
			}
		}
	}
	for _, name := range []string{"go.mod", "go.sum"} {
		b, err := os.ReadFile(filepath.Join("..", "..", name))
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(b), "miniredis") {
			t.Errorf("the main module's %s mentions miniredis", name)
		}
	}
}
