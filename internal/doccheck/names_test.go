package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// codeSpanRE matches an inline code span of Markdown.
var codeSpanRE = regexp.MustCompile("`([^`\n]+)`")

// identRE matches what a document cites as a Go name: Name, Name(),
// pkg.Name, Type.Method, pkg.Type.Method.
var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,2}(\(\))?$`)

// pathExts are the endings of the files a document cites by path.
var pathExts = []string{".go", ".lua", ".md", ".yaml", ".yml", ".mod", ".html", ".css", ".js"}

// cited is one name or path a document cites, and the line it is on.
type cited struct {
	text string
	line int
}

// citations returns the code spans of doc's prose that cite a path (one
// with a slash, or a file ending of pathExts) or a Go name (see identRE)
// that is not all lower case: an exported name, a test, or a dotted name
// such as Limiter.Decide. Lower-case single words (`lease`, `exact`) are
// words of the rules file, not names to look up.
func citations(doc string) (paths, names []cited) {
	for n, line := range prose(doc) {
		for _, m := range codeSpanRE.FindAllStringSubmatch(line, -1) {
			s := strings.TrimSpace(m[1])
			switch {
			case strings.ContainsAny(s, " =:{}[]<>,;\"'|*"):
				// A command, a setting or an expression.
			case isPath(s):
				paths = append(paths, cited{s, n})
			case identRE.MatchString(s) && (strings.Contains(s, ".") || s != strings.ToLower(s)):
				names = append(names, cited{strings.TrimSuffix(s, "()"), n})
			}
		}
	}
	return paths, names
}

func isPath(s string) bool {
	if strings.Contains(s, "/") {
		return !strings.HasPrefix(s, "/") && !strings.Contains(s, "://")
	}
	for _, ext := range pathExts {
		if strings.HasSuffix(s, ext) {
			return true
		}
	}
	return false
}

// goNames indexes the declarations of every Go file of the repository
// (every module, tests included): each top-level name, each method as
// Type.Method, each struct field and interface method as Type.Field, and
// each of those prefixed with the package's name (pkg.Name,
// pkg.Type.Method).
func goNames(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	fset := token.NewFileSet()
	add := func(pkg string, parts ...string) {
		n := strings.Join(parts, ".")
		names[n] = true
		names[pkg+"."+n] = true
	}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		pkg := f.Name.Name
		names[pkg] = true
		for _, decl := range f.Decls {
			switch d := decl.(type) {
			case *ast.FuncDecl:
				if d.Recv == nil {
					add(pkg, d.Name.Name)
					continue
				}
				add(pkg, recvName(d.Recv.List[0].Type), d.Name.Name)
			case *ast.GenDecl:
				for _, spec := range d.Specs {
					switch s := spec.(type) {
					case *ast.TypeSpec:
						add(pkg, s.Name.Name)
						addMembers(s, func(m string) { add(pkg, s.Name.Name, m) })
					case *ast.ValueSpec:
						for _, n := range s.Names {
							add(pkg, n.Name)
						}
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// recvName returns the name of a method's receiver type.
func recvName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return recvName(x.X)
	case *ast.IndexExpr:
		return recvName(x.X)
	case *ast.IndexListExpr:
		return recvName(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// addMembers calls add with each field of a struct type and each method of
// an interface type.
func addMembers(s *ast.TypeSpec, add func(string)) {
	var fields *ast.FieldList
	switch t := s.Type.(type) {
	case *ast.StructType:
		fields = t.Fields
	case *ast.InterfaceType:
		fields = t.Methods
	}
	if fields == nil {
		return
	}
	for _, f := range fields.List {
		for _, n := range f.Names {
			add(n.Name)
		}
		if len(f.Names) == 0 { // embedded
			if n := recvName(f.Type); n != "" {
				add(n)
			}
		}
	}
}

// TestArchitectureNames keeps ARCHITECTURE.md true to the code, as
// TestLinks keeps the links of every document true: each path it cites
// (`middleware/limiter.go`, `internal/redispipe/`) must exist, and each Go
// name it cites (`Limiter.Decide`, `redispipe.Pipeliner`,
// `TestFleetBounds`) must be declared somewhere in the repository. A file
// renamed or a function removed without the map following fails here.
func TestArchitectureNames(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(root, "ARCHITECTURE.md"))
	if err != nil {
		t.Fatal(err)
	}
	paths, idents := citations(string(b))
	if len(paths) < 20 || len(idents) < 20 {
		t.Fatalf("ARCHITECTURE.md cites %d paths and %d names; the check expects a code map (20 of each at least): is the file whole?", len(paths), len(idents))
	}
	for _, p := range paths {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p.text))); err != nil {
			t.Errorf("ARCHITECTURE.md:%d: cites %s, which does not exist", p.line, p.text)
		}
	}
	names := goNames(t)
	for _, n := range idents {
		if !names[n.text] {
			t.Errorf("ARCHITECTURE.md:%d: cites %s, which no Go file of the repository declares", n.line, n.text)
		}
	}
}

// TestCitations checks the classifier TestArchitectureNames relies on.
func TestCitations(t *testing.T) {
	t.Parallel()
	doc := "Use `Limiter.Decide` in `middleware/limiter.go`, `decide.lua`, `sync: lease`, `lease`, `TestFleetBounds`, `redispipe.Pipeliner.Run()`, `go test ./...`, `https://x/y`.\n```\n`NotThis` in a fence\n```\n"
	paths, names := citations(doc)
	var got []string
	for _, c := range append(paths, names...) {
		got = append(got, c.text)
	}
	want := []string{"middleware/limiter.go", "decide.lua", "Limiter.Decide", "TestFleetBounds", "redispipe.Pipeliner.Run"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("citations = %q, want %q", got, want)
	}
}
