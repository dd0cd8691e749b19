package keyguard_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redistest"
)

// root is the repository's root, from this package's directory.
var root = filepath.Join("..", "..")

// TestGuardCatches runs scripts under the guard on a real server: the
// planted violations (an undeclared key through redis.call, redis.pcall,
// a command with several keys, a command the table lacks, a key built in
// the hash slot of a declared one, with or without Dragonfly's flag) fail
// with the guard's error before the command runs; declared keys pass, and
// errors keep their line numbers.
func TestGuardCatches(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	c := srv.Client(t, nil)
	p := srv.Prefix(t)
	declared, other := p+"declared", p+"undeclared"
	ctx := context.Background()
	for _, tc := range []struct {
		name, src string
		keys      []string
		wantErr   string // "" for success
	}{
		{"declared", `redis.call('HSET', KEYS[1], 'f', 1) return redis.call('HGET', KEYS[1], 'f')`, []string{declared}, ""},
		{"no keys", `return redis.call('TIME')[1] ~= nil and 1 or 0`, nil, ""},
		{"local alias", "local call = redis.call\nreturn call('HLEN', KEYS[1])", []string{declared}, ""},
		{"undeclared call", `return redis.call('HSET', ARGV[1], 'f', 1)`, []string{declared}, `HSET touches key "` + other + `", which is not in KEYS`},
		{"undeclared pcall", `return redis.pcall('GET', ARGV[1])`, []string{declared}, `GET touches key "` + other + `"`},
		{"built name", `return redis.call('GET', KEYS[1] .. ':x')`, []string{declared}, `GET touches key "` + declared + `:x"`},
		{"second of several", `return redis.call('DEL', KEYS[1], ARGV[1])`, []string{declared}, `DEL touches key "` + other + `"`},
		{"lower case", `return redis.call('hget', ARGV[1], 'f')`, []string{declared}, `HGET touches key`},
		{"not in table", `return redis.call('SUNIONSTORE', KEYS[1], KEYS[1])`, []string{declared}, "command SUNIONSTORE has no entry"},
		{"line numbers", "local x = 1\nlocal y = 2\nerror('boom')", nil, "user_script:3:"},
		{"same hash slot", "return redis.call('HGETALL', KEYS[1] .. '7')", []string{p + "{t}:"}, `HGETALL touches key "` + p + `{t}:7", which is not in KEYS`},
		{"Dragonfly's flag", "--!df flags=allow-undeclared-keys\nreturn redis.call('HGETALL', KEYS[1] .. '7')", []string{p + "{t}:"}, `which is not in KEYS`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := redis.NewScript(keyguard.Guard(tc.src)).Run(ctx, c, tc.keys, other).Result()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("guarded script failed: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("guarded script returned %v, %v; want an error containing %q", v, err, tc.wantErr)
			}
		})
	}
	// The violation was caught before the command ran.
	if n, err := c.Exists(ctx, other).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS %s = %d, %v: the undeclared write ran", other, n, err)
	}
}

// TestShebang checks that a script with flags keeps its "#!" line first.
func TestShebang(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	c := srv.Client(t, nil)
	src := "#!lua flags=no-writes\nreturn redis.call('GET', ARGV[1])"
	_, err := redis.NewScript(keyguard.Guard(src)).Run(context.Background(), c, nil, "k").Result()
	if err == nil || !strings.Contains(err.Error(), `GET touches key "k"`) {
		t.Fatalf("guarded script with flags: %v", err)
	}
}

// TestSpecsMatchServer checks every entry of keyguard.Commands against
// the server's own key specs (COMMAND GETKEYS), on sample arguments in the
// shapes sluice's scripts use.
func TestSpecsMatchServer(t *testing.T) {
	t.Parallel()
	c := redistest.Standalone(t).Client(t, nil)
	samples := map[string][]any{
		"DEL":              {"k1", "k2", "k3"},
		"GET":              {"k1"},
		"HDEL":             {"k1", "f1", "f2"},
		"HEXISTS":          {"k1", "f"},
		"HGET":             {"k1", "f"},
		"HGETALL":          {"k1"},
		"HINCRBY":          {"k1", "f", 1},
		"HLEN":             {"k1"},
		"HMGET":            {"k1", "f1", "f2"},
		"HRANDFIELD":       {"k1", 8, "WITHVALUES"},
		"HSET":             {"k1", "f", "v", "g", "w"},
		"INCR":             {"k1"},
		"PEXPIRE":          {"k1", 100, "GT"},
		"PUBLISH":          {"ch", "msg"},
		"SET":              {"k1", "v", "PX", 100},
		"TIME":             {},
		"ZADD":             {"k1", "GT", 1, "m"},
		"ZCARD":            {"k1"},
		"ZCOUNT":           {"k1", "-inf", "+inf"},
		"ZRANGE":           {"k1", 0, -1, "WITHSCORES"},
		"ZRANGEBYSCORE":    {"k1", "-inf", "+inf", "WITHSCORES", "LIMIT", 0, 10},
		"ZREM":             {"k1", "m1", "m2"},
		"ZREMRANGEBYSCORE": {"k1", "-inf", "(5"},
		"ZSCORE":           {"k1", "m"},
	}
	for name, spec := range keyguard.Commands {
		args, ok := samples[name]
		if !ok {
			t.Errorf("%s: no sample arguments in this test", name)
			continue
		}
		var want []string
		switch spec {
		case keyguard.First:
			want = []string{args[0].(string)}
		case keyguard.All:
			for _, a := range args {
				want = append(want, a.(string))
			}
		}
		if len(args) == 0 {
			if spec != keyguard.None {
				t.Errorf("%s takes no arguments but its spec is %q", name, spec)
			}
			continue
		}
		got, err := c.Do(context.Background(), append([]any{"COMMAND", "GETKEYS", name}, args...)...).StringSlice()
		if err != nil && strings.Contains(err.Error(), "no key arguments") || err == redis.Nil {
			got, err = nil, nil
		}
		if err != nil {
			t.Errorf("COMMAND GETKEYS %s %v: %v", name, args, err)
			continue
		}
		if strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: the server says its keys are %q, the guard's spec %q says %q", name, got, spec, want)
		}
	}
}

// callRe finds the commands a script calls by name.
var callRe = regexp.MustCompile(`redis\.p?call\(\s*['"]([A-Za-z]+)['"]`)

// TestTableCoversScripts reads every Lua source of the repository (the
// .lua files and the scripts written in Go strings) and checks that every
// command called by name is in keyguard.Commands, so that no path of a
// script, tested or not, calls a command the guard would refuse.
func TestTableCoversScripts(t *testing.T) {
	t.Parallel()
	seen := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || strings.HasSuffix(path, "_test.go") || !(strings.HasSuffix(path, ".lua") || strings.HasSuffix(path, ".go")) {
			return nil
		}
		if filepath.Base(path) == "prelude.lua" {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range callRe.FindAllStringSubmatch(string(src), -1) {
			name := strings.ToUpper(m[1])
			seen[name] = append(seen[name], filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) < 10 {
		t.Fatalf("found only %d commands in the scripts: %v", len(seen), seen)
	}
	for name, where := range seen {
		if _, ok := keyguard.Commands[name]; !ok {
			t.Errorf("%s, called in %v, is not in keyguard.Commands", name, where)
		}
	}
}

// TestEveryScriptGuarded reads the non-test Go files of the repository and
// checks that every script is made through the guard: no redis.NewScript
// but keyguard's own, and every redispipe.NewBatchScript given
// keyguard.Wrap(...).
func TestEveryScriptGuarded(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	made := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == ".git" {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		slash := filepath.ToSlash(path)
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			pos := fset.Position(call.Pos())
			switch sel.Sel.Name {
			case "NewScript", "NewScriptServerSHA":
				if strings.HasSuffix(slash, "internal/keyguard/keyguard.go") || strings.HasSuffix(slash, "internal/redispipe/script.go") {
					return true
				}
				t.Errorf("%s:%d: a script made with %s, not keyguard.Script", slash, pos.Line, sel.Sel.Name)
			case "Script":
				if x, ok := sel.X.(*ast.Ident); ok && x.Name == "keyguard" {
					made++
				}
			case "NewBatchScript":
				if len(call.Args) != 1 || !isWrap(call.Args[0]) {
					t.Errorf("%s:%d: NewBatchScript of a source not passed through keyguard.Wrap", slash, pos.Line)
				}
				made++
			case "Eval", "EvalRO", "EvalSha", "EvalShaRO", "FCall", "FCallRO":
				if strings.Contains(slash, "internal/redispipe/") {
					return true // it runs the scripts it is given
				}
				// A client's Eval(ctx, src, ...) takes the source itself; a
				// Script's EvalSha(ctx, client, ...) runs a guarded script.
				if len(call.Args) > 1 {
					if _, lit := call.Args[1].(*ast.BasicLit); lit {
						t.Errorf("%s:%d: a script sent with %s; make it with keyguard.Script", slash, pos.Line, sel.Sel.Name)
					}
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if made < 20 {
		t.Fatalf("found only %d scripts made through the guard", made)
	}
}

func isWrap(e ast.Expr) bool {
	call, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := call.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && x.Name == "keyguard" && sel.Sel.Name == "Wrap"
}

// TestPreludeOneLine checks that the prelude adds no line (so errors keep
// their line numbers) and that it lists the whole table.
func TestPreludeOneLine(t *testing.T) {
	t.Parallel()
	p := keyguard.Prelude()
	if strings.Contains(p, "\n") {
		t.Fatalf("the prelude has a newline: %q", p)
	}
	for n, spec := range keyguard.Commands {
		if !strings.Contains(p, n+" = '"+string(spec)+"'") {
			t.Errorf("the prelude lacks %s = '%s'", n, spec)
		}
	}
	if got := keyguard.Wrap("return 1"); keyguard.Enabled != (got != "return 1") {
		t.Fatalf("Wrap with the guard %v returned %q", keyguard.Enabled, got)
	}
}
