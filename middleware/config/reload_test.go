package config_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// The versions of a rules file the reload tests go through. Every good
// version keeps the api rule as it is.
const (
	fileV1 = `rules:
  - {name: api, match: {path: /api/*}, key: global, limits: [{requests: 5, window: 1m}]}
`
	fileV2 = `rules:
  - {name: api, match: {path: /api/*}, key: global, limits: [{requests: 5, window: 1m}]}
  - {name: admin, match: {path: /admin}, key: global, limits: [{requests: 1, window: 1m}]}
`
	fileBad = `rules:
  - {name: api, match: {path: /api/*}, key: global, limits: [{requests: 5, window: 1m}]}
  - {name: admin, match: {path: /admin}, key: global, limits: [{requests: 1, window: 5x}]}
`
)

// writeFile writes a rules file.
// writeFile replaces path's contents atomically, as editors and deploy
// tools do, so that a watcher never sees a half-written file.
func writeFile(t testing.TB, path, src string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// openFile writes src to a new file and opens it on a frozen clock.
func openFile(t *testing.T, src string) (*config.Reloader, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, path, src)
	clk := newClock()
	rl, err := config.Open(path, config.Env{}, middleware.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.Limiter().Close() })
	return rl, path
}

// status sends one request through the Reloader's Limiter and returns its
// status and X-RateLimit-Remaining.
func status(rl *config.Reloader, path string) (int, string) {
	rec := serve(rl.Limiter().Handler(okHandler), request("GET", path, "192.0.2.1:1"))
	return rec.Code, rec.Header().Get(headers.Remaining)
}

func TestReloaderCheck(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, fileV1)
	for range 2 {
		status(rl, "/api/x")
	}
	if code, _ := status(rl, "/admin"); code != 200 {
		t.Fatalf("/admin under v1: %d, want unlimited", code)
	}
	check := func(wantTried bool, wantErr string) {
		t.Helper()
		tried, err := rl.Check()
		gotErr := ""
		if err != nil {
			gotErr = err.Error()
		}
		if tried != wantTried || gotErr != wantErr {
			t.Errorf("Check() = %v, %q; want %v, %q", tried, gotErr, wantTried, wantErr)
		}
	}
	check(false, "") // unchanged

	writeFile(t, file, fileV2)
	check(true, "")
	if n := len(rl.Document().Rules); n != 2 {
		t.Errorf("%d rules after reload, want 2", n)
	}
	// The api rule's counter carried on: 2 of 5 used, now 3.
	if code, rem := status(rl, "/api/x"); code != 200 || rem != "2" {
		t.Errorf("api after reload: %d, remaining %s; want 200, 2", code, rem)
	}
	status(rl, "/admin")
	if code, _ := status(rl, "/admin"); code != 429 {
		t.Errorf("second /admin under v2: %d, want 429", code)
	}

	// A bad file is reported once and the rules in force stay.
	writeFile(t, file, fileBad)
	check(true, file+`:3: rules[1].limits[0].window: bad duration "5x"`)
	check(false, "")
	if n := len(rl.Document().Rules); n != 2 || rl.Document().Rules[1].Limits[0].Window != time.Minute {
		t.Errorf("rules in force after a bad file: %+v", rl.Document().Rules)
	}
	if code, rem := status(rl, "/api/x"); code != 200 || rem != "1" {
		t.Errorf("api after a bad file: %d, remaining %s; want 200, 1", code, rem)
	}

	// Back to v1: /admin is free again.
	writeFile(t, file, fileV1)
	check(true, "")
	if code, _ := status(rl, "/admin"); code != 200 {
		t.Errorf("/admin back under v1: %d", code)
	}
}

// An explicit Reload, as on SIGHUP, reads the file whether or not it
// changed.
func TestReloaderReload(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, fileV1)
	before := rl.Document()
	if err := rl.Reload(); err != nil {
		t.Fatal(err)
	}
	if rl.Document() == before {
		t.Error("Reload of an unchanged file kept the old Document")
	}
	status(rl, "/api/x")

	writeFile(t, file, fileBad)
	if err := rl.Reload(); err == nil || err.Error() != file+`:3: rules[1].limits[0].window: bad duration "5x"` {
		t.Errorf("Reload(bad): %v", err)
	}
	// Every explicit Reload reports the error again.
	if err := rl.Reload(); err == nil {
		t.Error("second Reload(bad) succeeded")
	}
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("Check after Reload(bad): %v, %v; the version was already tried", tried, err)
	}
	if n := len(rl.Document().Rules); n != 1 {
		t.Errorf("%d rules in force, want v1's 1", n)
	}

	writeFile(t, file, fileV2)
	if err := rl.Reload(); err != nil {
		t.Fatal(err)
	}
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("Check after Reload: %v, %v; the version was already loaded", tried, err)
	}
	if code, rem := status(rl, "/api/x"); code != 200 || rem != "3" {
		t.Errorf("api: %d, remaining %s; want 200, 3", code, rem)
	}
}

// Settings that take effect only when the Limiter is built are not
// reloaded: a file that changes them is rejected.
func TestReloaderRejectsConstructionSettings(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, "headers: legacy\n"+fileV1)
	writeFile(t, file, "headers: draft\n"+fileV2)
	err := rl.Reload()
	if want := file + ":1: headers: changed from legacy to draft, which takes a restart: rules not reloaded"; err == nil || err.Error() != want {
		t.Errorf("Reload: %v, want %s", err, want)
	}
	writeFile(t, file, fileV2) // no headers: the default, both
	err = rl.Reload()
	if want := file + ": headers: changed from legacy to both, which takes a restart: rules not reloaded"; err == nil || err.Error() != want {
		t.Errorf("Reload: %v, want %s", err, want)
	}
	if n := len(rl.Document().Rules); n != 1 {
		t.Errorf("%d rules in force, want 1", n)
	}
	writeFile(t, file, "headers: legacy\n"+fileV2)
	if err := rl.Reload(); err != nil {
		t.Error(err)
	}
}

func TestReloaderMissingFile(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, fileV1)
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if tried, err := rl.Check(); !tried || err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Check of a missing file: %v, %v", tried, err)
	}
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("second Check of a missing file: %v, %v; report once", tried, err)
	}
	if err := rl.Reload(); err == nil {
		t.Error("Reload of a missing file succeeded")
	}
	if code, _ := status(rl, "/api/x"); code != 200 {
		t.Errorf("rules lost with the file: %d", code)
	}
	// An editor that replaced the file with the same contents.
	writeFile(t, file, fileV1)
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("Check of the same file back: %v, %v", tried, err)
	}
	writeFile(t, file, fileV2)
	if tried, err := rl.Check(); !tried || err != nil {
		t.Errorf("Check of a new file: %v, %v", tried, err)
	}
}

// A file changed without a change of size or modification time is still
// noticed while its time is recent; once its time is old, Check trusts the
// time and size and only Reload reads it.
func TestReloaderChangeDetection(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, fileV1)
	fi, err := os.Stat(file)
	if err != nil {
		t.Fatal(err)
	}
	mod := fi.ModTime()
	same := func(src string, at time.Time) {
		t.Helper()
		writeFile(t, file, src)
		if err := os.Chtimes(file, at, at); err != nil {
			t.Fatal(err)
		}
	}
	// Same size as fileV1, same (recent) time.
	v1b := fileV1[:len(fileV1)-len("5, window: 1m}]}\n")] + "6, window: 1m}]}\n"
	same(v1b, mod)
	if tried, err := rl.Check(); !tried || err != nil {
		t.Errorf("same size and recent time: Check = %v, %v; want a reload", tried, err)
	}
	if got := rl.Document().Rules[0].Limits[0].Requests; got != 6 {
		t.Errorf("requests %d after reload, want 6", got)
	}

	old := time.Now().Add(-time.Hour)
	same(v1b, old) // a touch: time changed, contents not
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("touched file: Check = %v, %v; want no reload", tried, err)
	}
	same(fileV1, old) // changed behind the trusted time and size
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("old time and same size: Check = %v, %v; want the stat trusted", tried, err)
	}
	if err := rl.Reload(); err != nil || rl.Document().Rules[0].Limits[0].Requests != 5 {
		t.Errorf("Reload: %v, requests %d", err, rl.Document().Rules[0].Limits[0].Requests)
	}
}

// NewReloader attaches to a Limiter built by the program; it does not
// reload a file that has not changed.
func TestNewReloader(t *testing.T) {
	t.Parallel()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	writeFile(t, file, fileV1)
	cfg, err := config.Load(file, config.Env{})
	if err != nil {
		t.Fatal(err)
	}
	lim, _ := limiter(t, cfg)
	rl := config.NewReloader(lim, cfg, config.Env{})
	if rl.Limiter() != lim || rl.Document() != cfg {
		t.Error("NewReloader does not report its Limiter and Document")
	}
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("Check of the file cfg came from: %v, %v", tried, err)
	}
	writeFile(t, file, fileV2)
	if tried, err := rl.Check(); !tried || err != nil || len(rl.Document().Rules) != 2 {
		t.Errorf("Check of a new version: %v, %v", tried, err)
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, fileV1)
	ctx, cancel := context.WithCancel(context.Background())
	reloads := make(chan error, 10)
	done := make(chan struct{})
	go func() {
		rl.Watch(ctx, time.Millisecond, func(err error) { reloads <- err })
		close(done)
	}()
	wait := func() error {
		t.Helper()
		select {
		case err := <-reloads:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Watch did not notice the change")
			return nil
		}
	}
	writeFile(t, file, fileBad)
	if err := wait(); err == nil {
		t.Error("Watch reported no error for a bad file")
	}
	writeFile(t, file, fileV2)
	if err := wait(); err != nil {
		t.Errorf("Watch: %v", err)
	}
	if n := len(rl.Document().Rules); n != 2 {
		t.Errorf("%d rules after Watch reloaded, want 2", n)
	}
	cancel()
	<-done
}

// Requests racing with reloads are decided under one complete set of rules
// each, none is dropped, and the counter of the rule every version keeps is
// exact: with the clock frozen, exactly its limit is admitted in all.
func TestReloadConcurrent(t *testing.T) {
	t.Parallel()
	const limit, workers, perWorker = 40, 8, 20
	api := "  - {name: api, match: {path: /api/*}, key: global, limits: [{requests: " + strconv.Itoa(limit) + ", window: 1m}]}\n"
	versions := []string{
		"rules:\n" + api,
		"rules:\n  - {name: per-ip, key: ip, limits: [{requests: 1000, window: 1h}]}\n" + api,
		"rules:\n" + api + "  - {name: other, match: {path: /api/*, methods: [GET]}, key: ip+route, limits: [{requests: 1000, window: 1m}]}\n",
		"rules:\n" + api + "  - {name: broken, key: ip, limits: [{requests: 0, window: 1m}]}\n",
	}
	rl, file := openFile(t, versions[0])
	h := rl.Limiter().Handler(okHandler)

	var admitted, denied, other atomic.Int64
	stop := make(chan struct{})
	var reloader sync.WaitGroup
	reloader.Add(1)
	go func() {
		defer reloader.Done()
		for i := 1; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := i % len(versions)
			writeFile(t, file, versions[v])
			if err := rl.Reload(); (err != nil) != (v == 3) {
				t.Errorf("version %d: Reload: %v", v, err)
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perWorker {
				rec := serve(h, request("GET", "/api/x", fmt.Sprintf("192.0.2.%d:1", w+1)))
				switch rec.Code {
				case http.StatusOK:
					admitted.Add(1)
				case http.StatusTooManyRequests:
					denied.Add(1)
				default:
					other.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	reloader.Wait()
	if admitted.Load() != limit || denied.Load() != workers*perWorker-limit || other.Load() != 0 {
		t.Errorf("admitted %d, denied %d, other %d; want %d, %d, 0",
			admitted.Load(), denied.Load(), other.Load(), limit, workers*perWorker-limit)
	}
}

// TestReloadAlgorithmChange changes one rule's algorithm: that rule's
// counters start afresh, the other rule's carry on.
func TestReloadAlgorithmChange(t *testing.T) {
	t.Parallel()
	const (
		before = `
rules:
  - {name: api, match: {path: "/api/*"}, key: ip, limits: [{requests: 5, window: 1m}]}
  - {name: all, key: ip, limits: [{requests: 50, window: 1m}]}
`
		after = `
rules:
  - {name: api, match: {path: "/api/*"}, key: ip, algorithm: token_bucket, limits: [{requests: 5, window: 1m, burst: 5}]}
  - {name: all, key: ip, limits: [{requests: 50, window: 1m}]}
`
	)
	rl, file := openFile(t, before)
	for range 4 {
		status(rl, "/api/x")
	}
	// Remaining is the lower of the two rules' figures: api's 1.
	if code, rem := status(rl, "/api/x"); code != 200 || rem != "0" {
		t.Fatalf("5th api request: %d, remaining %s; want 200, 0", code, rem)
	}
	writeFile(t, file, after)
	if err := rl.Reload(); err != nil {
		t.Fatal(err)
	}
	// api's token bucket is new and full: 4 left after this request.
	if code, rem := status(rl, "/api/x"); code != 200 || rem != "4" {
		t.Errorf("api after the change of algorithm: %d, remaining %s; want 200, 4 (a fresh bucket)", code, rem)
	}
	// all kept its count: 6 requests of 50.
	rec := serve(rl.Limiter().Handler(okHandler), request("GET", "/other", "192.0.2.1:1"))
	if got := rec.Header().Get(headers.Remaining); got != "43" {
		t.Errorf("all after the reload: remaining %s, want 43 (its counter carried on)", got)
	}
}

// TestLogReloads: a reload is logged with the file and its version, a
// failed one at Error with the problem.
func TestLogReloads(t *testing.T) {
	t.Parallel()
	rl, file := openFile(t, fileV1)
	var buf bytes.Buffer
	log := rl.LogReloads(slog.New(slog.NewTextHandler(&buf, nil)))
	v1 := rl.Document().Version()
	if len(v1) != 12 {
		t.Fatalf("Version %q", v1)
	}
	writeFile(t, file, fileV2)
	log(rl.Reload())
	writeFile(t, file, fileBad)
	log(rl.Reload())
	out := buf.String()
	if !strings.Contains(out, "level=INFO msg=\"sluice: rules reloaded\"") || !strings.Contains(out, "rules=2") || strings.Contains(out, "version="+v1+" rules") {
		t.Errorf("reload log:\n%s", out)
	}
	if !strings.Contains(out, "level=ERROR") || !strings.Contains(out, `bad duration \"5x\"`) {
		t.Errorf("failed reload log:\n%s", out)
	}
}
