package doccheck

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// module is the root module's path.
const module = "github.com/sluicehq/sluice"

// layers are the boundaries ARCHITECTURE.md's code map states: for each
// package (a directory under the root), the imports its non-test files may
// not have, as prefixes (a prefix of the module names the module's own
// packages below it). A package that starts to know what it should not
// fails TestLayers, and either the code or the map must change.
var layers = []struct {
	dir    string
	forbid []string
	why    string
}{
	{"internal/redispipe", []string{module}, "the pipeliner runs scripts and knows no algorithm"},
	{"internal/window", []string{module, "github.com/redis/"}, "the algorithms' arithmetic is pure"},
	{"internal/fleet", []string{module + "/internal/redis", module + "/middleware", "github.com/redis/"}, "the fleet arithmetic is pure"},
	{"internal/fleetstore", []string{module + "/internal/redis", module + "/middleware", "github.com/redis/"}, "the fleet layer talks to a Backend, not to Redis"},
	{"internal/memstore", []string{module + "/middleware", "github.com/redis/"}, "the memory store knows no Redis and no HTTP"},
	{"internal/redisstore", []string{module + "/middleware", module + "/keyfunc", "net/http"}, "the Redis store knows algorithms, not HTTP"},
	{"internal/usage", []string{module}, "the usage ledger is pure"},
	{"internal/topk", []string{module}, "the summaries are pure"},
	{"internal/hitters", []string{module + "/middleware", module + "/internal/redis", "github.com/redis/"}, "top clients reach Redis through a Backend"},
	{"internal/adaptive", []string{module}, "the overload controller is pure"},
	{"internal/ratefields", []string{module}, "the upstream fields' parser is pure"},
	{"internal/keyguard", []string{module}, "the key guard knows no store, only scripts"},
	{"middleware/sluicetest", []string{module + "/internal/redis", "github.com/alicebob/"}, "users' tests with sluicetest start no server"},
	{"keyfunc", []string{module + "/middleware", module + "/headers"}, "key functions know nothing of limits"},
	{"headers", []string{module + "/middleware"}, "the header writer knows nothing of decisions"},
	{"adapters/gin", []string{module + "/internal/"}, "adapters translate through the public API only"},
	{"adapters/echo", []string{module + "/internal/"}, "adapters translate through the public API only"},
	{"adapters/fiber", []string{module + "/internal/"}, "adapters translate through the public API only"},
}

// TestLayers checks the imports of the packages that ARCHITECTURE.md says
// must not know about others (see layers).
func TestLayers(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	for _, l := range layers {
		files, err := filepath.Glob(filepath.Join(root, filepath.FromSlash(l.dir), "*.go"))
		if err != nil || len(files) == 0 {
			t.Errorf("%s: no Go files (%v)", l.dir, err)
			continue
		}
		for _, path := range files {
			if strings.HasSuffix(path, "_test.go") {
				continue
			}
			src, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			f, err := parser.ParseFile(fset, path, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				p, _ := strconv.Unquote(imp.Path.Value)
				for _, bad := range l.forbid {
					if p == bad || strings.HasPrefix(p, bad) && (strings.HasSuffix(bad, "/") || strings.HasPrefix(p[len(bad):], "/")) {
						t.Errorf("%s imports %s: %s", filepath.ToSlash(path), p, l.why)
					}
				}
			}
		}
	}
}
