package config_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// rulesDoc is a rules document of one rule of n requests a minute per
// address.
func rulesDoc(n int) string {
	return fmt.Sprintf("rules:\n  - name: api\n    key: ip\n    limits: [{requests: %d, window: 1m}]\n", n)
}

// rulesService is a rules service on a real HTTP server whose document and
// failure mode a test changes as it goes.
type rulesService struct {
	srv *httptest.Server

	mu   sync.Mutex
	doc  string
	mode string // "", "500", "slow", "drop", "cut"

	gets, notModified atomic.Int64
}

func newRulesService(t *testing.T, doc string) *rulesService {
	s := &rulesService{doc: doc}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *rulesService) set(doc, mode string) {
	s.mu.Lock()
	s.doc, s.mode = doc, mode
	s.mu.Unlock()
}

func (s *rulesService) serve(w http.ResponseWriter, r *http.Request) {
	s.gets.Add(1)
	s.mu.Lock()
	doc, mode := s.doc, s.mode
	s.mu.Unlock()
	switch mode {
	case "500":
		http.Error(w, "boom", http.StatusInternalServerError)
		return
	case "slow":
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
		return
	case "drop":
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	case "cut":
		// Headers and half the body, then the connection goes.
		w.Header().Set("Content-Length", fmt.Sprint(len(doc)))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(doc[:len(doc)/2]))
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
		return
	}
	etag := fmt.Sprintf("%q", fmt.Sprintf("%x", len(doc))+"-"+fmt.Sprint(hashString(doc)))
	w.Header().Set("ETag", etag)
	if r.Header.Get("If-None-Match") == etag {
		s.notModified.Add(1)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	_, _ = w.Write([]byte(doc))
}

func hashString(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint32(s[i])) * 16777619
	}
	return h
}

// admitted sends n requests from one address through lim and counts
// those admitted.
func admitted(lim *middleware.Limiter, n int, addr string) int {
	h := lim.Handler(okHandler)
	ok := 0
	for range n {
		if serve(h, request("GET", "/", addr+":1")).Code == http.StatusOK {
			ok++
		}
	}
	return ok
}

// openHTTP opens a Reloader on the rules service.
func openHTTP(t *testing.T, s *rulesService, so config.SourceOptions) (*config.Reloader, error) {
	t.Helper()
	rl, err := config.OpenSource(context.Background(), &config.HTTPSource{URL: s.srv.URL + "/rules.yaml"}, config.Env{}, so)
	if err == nil {
		t.Cleanup(func() { rl.Limiter().Close() })
	}
	return rl, err
}

// TestHTTPSourceReachesThreeLimiters changes the document of a rules
// service polled by three app servers and requires the change in force on
// all three within one poll interval, the polls in between being
// conditional.
func TestHTTPSourceReachesThreeLimiters(t *testing.T) {
	t.Parallel()
	s := newRulesService(t, rulesDoc(1))
	const interval = 200 * time.Millisecond
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var rls []*config.Reloader
	for range 3 {
		rl, err := openHTTP(t, s, config.SourceOptions{Interval: interval})
		if err != nil {
			t.Fatal(err)
		}
		go rl.Watch(ctx, 0, nil)
		rls = append(rls, rl)
	}
	time.Sleep(2 * interval) // a few polls, answered 304
	if s.notModified.Load() == 0 {
		t.Errorf("no conditional request answered 304 in %d requests", s.gets.Load())
	}
	s.set(rulesDoc(3), "")
	changed := time.Now()
	for i, rl := range rls {
		for rl.Document().Rules[0].Limits[0].Requests != 3 {
			// One interval, its jitter (10%), and time for the request.
			if time.Since(changed) > interval+interval/10+150*time.Millisecond {
				t.Fatalf("server %d: change not in force after %v", i, time.Since(changed))
			}
			time.Sleep(5 * time.Millisecond)
		}
		if got := admitted(rl.Limiter(), 4, "192.0.2.1"); got != 3 {
			t.Errorf("server %d: %d admitted, want 3", i, got)
		}
		st := rl.Status()
		if st.Err != nil || st.Version != rl.Document().Version() || st.SourceVersion == "" || st.LoadedAt.Before(changed) {
			t.Errorf("server %d: status %+v", i, st)
		}
	}
}

// TestHTTPSourceFailuresKeepRules serves a bad document, a 500, a request
// that times out, a dropped connection and a body cut short, and requires
// each to leave the good rules in force, with an error that names the URL.
func TestHTTPSourceFailuresKeepRules(t *testing.T) {
	t.Parallel()
	s := newRulesService(t, rulesDoc(2))
	var statuses []config.Status
	var mu sync.Mutex
	rl, err := openHTTP(t, s, config.SourceOptions{Timeout: 200 * time.Millisecond, OnStatus: func(st config.Status) {
		mu.Lock()
		statuses = append(statuses, st)
		mu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	good := rl.Document().Version()
	url := s.srv.URL + "/rules.yaml"
	i := 0
	for _, tc := range []struct {
		doc, mode, want string
	}{
		{"rules:\n  - name: api\n    key: ip\n    limits: [{requests: 5, window: 5x}]\n", "", url + ":4: rules[0].limits[0].window: bad duration \"5x\""},
		{rulesDoc(9), "500", url + ": GET: unexpected status 500"},
		{rulesDoc(9), "slow", "context deadline exceeded"},
		{rulesDoc(9), "drop", "EOF"},
		{rulesDoc(9), "cut", "unexpected EOF"},
	} {
		i++
		s.set(tc.doc, tc.mode)
		tried, err := rl.Check()
		if !tried || err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), url) {
			t.Errorf("%s: Check() = %v, %v; want an error with %q and the URL", tc.mode, tried, err, tc.want)
		}
		if v := rl.Document().Version(); v != good {
			t.Errorf("%s: version %s in force, want %s", tc.mode, v, good)
		}
		if got := admitted(rl.Limiter(), 3, "192.0.2."+fmt.Sprint(i)); got != 2 {
			t.Errorf("%s: %d admitted, want 2 (the good rules)", tc.mode, got)
		}
		if st := rl.Status(); st.Err == nil || st.Version != good {
			t.Errorf("%s: status %+v", tc.mode, st)
		}
	}
	// The same failure again is not reported again.
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("repeated failure: Check() = %v, %v; want false, nil", tried, err)
	}
	if st := rl.Status(); st.Failures < 2 {
		t.Errorf("failures %d, want at least 2", st.Failures)
	}
	s.set(rulesDoc(4), "")
	if tried, err := rl.Check(); !tried || err != nil {
		t.Fatalf("recovery: Check() = %v, %v", tried, err)
	}
	if st := rl.Status(); st.Err != nil || st.Failures != 0 || st.Version == good {
		t.Errorf("after recovery: status %+v", st)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(statuses) < 7 {
		t.Errorf("OnStatus called %d times, want one per attempt", len(statuses))
	}
}

// TestHTTPSourceStartup starts with the rules service down: with a copy
// saved by an earlier run it starts with that copy, and without one it
// fails with an error that says so.
func TestHTTPSourceStartup(t *testing.T) {
	t.Parallel()
	s := newRulesService(t, rulesDoc(2))
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	// A first run saves the document it loads.
	if _, err := openHTTP(t, s, config.SourceOptions{CachePath: cache}); err != nil {
		t.Fatal(err)
	}
	if data, err := os.ReadFile(cache); err != nil || string(data) != rulesDoc(2) {
		t.Fatalf("saved copy %q, %v", data, err)
	}
	for _, mode := range []string{"500", "drop"} {
		s.set(rulesDoc(9), mode)
		rl, err := openHTTP(t, s, config.SourceOptions{CachePath: cache})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		st := rl.Status()
		if !st.FromCache || st.Err == nil || rl.Document().File != cache {
			t.Errorf("%s: status %+v, file %s", mode, st, rl.Document().File)
		}
		if got := admitted(rl.Limiter(), 3, "192.0.2.1"); got != 2 {
			t.Errorf("%s: %d admitted, want 2", mode, got)
		}
		// The service comes back: its document replaces the copy.
		s.set(rulesDoc(3), "")
		if tried, err := rl.Check(); !tried || err != nil {
			t.Fatalf("%s: back: Check() = %v, %v", mode, tried, err)
		}
		if st := rl.Status(); st.FromCache || st.Err != nil || rl.Document().Rules[0].Limits[0].Requests != 3 {
			t.Errorf("%s: back: status %+v", mode, st)
		}
		s.set(rulesDoc(2), "") // what the cache held, for the next round
		_, _ = rl.Check()
	}
	// A bad document at start also falls back to the copy.
	s.set("rules: [", "")
	if rl, err := openHTTP(t, s, config.SourceOptions{CachePath: cache}); err != nil || !rl.Status().FromCache {
		t.Errorf("bad document at start: %v", err)
	}
	// Without a copy, start-up fails and says why.
	s.set("", "500")
	_, err := openHTTP(t, s, config.SourceOptions{})
	if err == nil || !strings.Contains(err.Error(), "unexpected status 500") || !strings.Contains(err.Error(), "no SourceOptions.CachePath") {
		t.Errorf("no cache: %v", err)
	}
	_, err = openHTTP(t, s, config.SourceOptions{CachePath: filepath.Join(t.TempDir(), "missing.yaml")})
	if err == nil || !strings.Contains(err.Error(), "no saved copy") || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing cache: %v", err)
	}
}

// TestHTTPSourceBacksOff counts the requests Watch makes to a failing
// service: after each failure it waits twice as long, up to MaxBackoff.
func TestHTTPSourceBacksOff(t *testing.T) {
	t.Parallel()
	s := newRulesService(t, rulesDoc(2))
	rl, err := openHTTP(t, s, config.SourceOptions{Interval: 20 * time.Millisecond, Jitter: -1, MaxBackoff: 160 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s.set("", "500")
	start := s.gets.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	defer cancel()
	var reports atomic.Int64
	rl.Watch(ctx, 0, func(error) { reports.Add(1) })
	// Waits of 20, 40, 80, 160, 160... ms: 7 requests in 700 ms, where
	// polling without backoff would make 35.
	if n := s.gets.Load() - start; n < 4 || n > 9 {
		t.Errorf("%d requests in 700 ms while failing, want about 7", n)
	}
	if n := reports.Load(); n != 1 {
		t.Errorf("the failure was reported %d times, want once", n)
	}
}
