package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// TestExampleServers runs the example's routes on every framework, with the
// built-in rules and with example/rules.yaml, and checks the limits the
// example advertises.
func TestExampleServers(t *testing.T) {
	t.Parallel()
	type probe struct {
		method, path string
		header       [2]string
		times        int // send it this many times
		want         int // status of the last one, or the first that is not 200
	}
	// The paths whose limit has a ceiling that an idle server opens: on a
	// busy machine the capacity signal may close it while a probe runs,
	// which a 429 then says in its RateLimit-Policy (a quota below the
	// probe's count).
	elastic := map[string]bool{"/api/burst": true}
	builtin := []probe{
		{"GET", "/search", [2]string{}, 5, 200},
		{"GET", "/search", [2]string{}, 1, 429},
		{"GET", "/api/data", [2]string{}, 1, 400},
		{"GET", "/api/data", [2]string{"X-API-Key", "demo"}, 10, 200},
		{"GET", "/api/data", [2]string{"X-API-Key", "demo"}, 1, 429},
		{"GET", "/api/data", [2]string{"X-API-Key", "other"}, 1, 200},
	}
	fromFile := []probe{
		{"POST", "/api/login", [2]string{}, 5, 200},
		{"POST", "/api/login", [2]string{}, 1, 429},
		{"POST", "/api/login", [2]string{"X-User", "alice"}, 1, 429}, // login counts per address
		{"GET", "/api/data", [2]string{"X-User", "bob"}, 1, 200},
		{"GET", "/api/quote", [2]string{}, 8, 200}, // token bucket: a burst of 8
		{"GET", "/api/quote", [2]string{}, 1, 429},
		{"POST", "/api/export", [2]string{}, 3, 200}, // 3 a calendar day
		{"POST", "/api/export", [2]string{}, 1, 429},
		{"GET", "/api/report", [2]string{}, 5, 200}, // 1000 a day
		{"GET", "/api/burst", [2]string{}, 20, 200}, // 10/s, but the idle server lets it reach 50
		{"GET", "/api/work", [2]string{"X-Checkout", "1"}, 1, 200},
	}
	for name, serve := range frameworks {
		for _, file := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/builtin", true: "/rules.yaml"}[file], func(t *testing.T) {
				t.Parallel()
				probes := builtin
				if file {
					probes = fromFile
				}
				_, addr := serveDemo(t, serve, file)
				client := &http.Client{Timeout: 5 * time.Second}
				for _, p := range probes {
					var code int
					var policy string
					for range p.times {
						req, _ := http.NewRequest(p.method, "http://"+addr+p.path, nil)
						if p.header[0] != "" {
							req.Header.Set(p.header[0], p.header[1])
						}
						resp, err := client.Do(req)
						if err != nil {
							t.Fatal(err)
						}
						resp.Body.Close()
						code, policy = resp.StatusCode, resp.Header.Get("RateLimit-Policy")
						if code != 200 {
							break
						}
					}
					if elastic[p.path] && code == 429 && quotaBelow(policy, p.times) {
						t.Logf("%s %s ×%d: 429 with RateLimit-Policy %q: the machine was busy and the ceiling closed", p.method, p.path, p.times, policy)
						continue
					}
					if code != p.want {
						t.Fatalf("%s %s %v ×%d: status %d, want %d", p.method, p.path, p.header, p.times, code, p.want)
					}
				}
			})
		}
	}
}

// quotaBelow reports whether the RateLimit-Policy field policy announces a
// quota (q) below n.
func quotaBelow(policy string, n int) bool {
	for _, param := range strings.Split(policy, ";") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(param), "q="); ok {
			q, err := strconv.Atoi(v)
			return err == nil && q < n
		}
	}
	return false
}

// TestAdminListener: the admin handler refuses requests without the token
// and answers those with it.
func TestAdminListener(t *testing.T) {
	t.Setenv("SLUICE_ADMIN_TOKEN", "t0ken")
	lim, err := middleware.NewRules(builtinRules())
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if got, err := serveAdmin(ctx, addr, lim, func() (string, string) { return "built-in rules", "" }); err != nil || got != addr {
		t.Fatalf("serveAdmin on %s: %s, %v", addr, got, err)
	}
	for _, tt := range []struct {
		auth string
		want int
	}{{"", 403}, {"Bearer nope", 403}, {"Bearer t0ken", 200}} {
		req, _ := http.NewRequest("GET", "http://"+addr+"/rules", nil)
		if tt.auth != "" {
			req.Header.Set("Authorization", tt.auth)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tt.want {
			t.Errorf("Authorization %q: %d, want %d", tt.auth, res.StatusCode, tt.want)
		}
	}
}

// TestAdminListenerPortTaken: with another process listening on the admin
// address (Prometheus's default port is the example's default too), the
// admin handler starts on a free port of the same host, and answers there.
func TestAdminListenerPortTaken(t *testing.T) {
	t.Setenv("SLUICE_ADMIN_TOKEN", "t0ken")
	lim, err := middleware.NewRules(builtinRules())
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got, err := serveAdmin(ctx, taken.Addr().String(), lim, func() (string, string) { return "built-in rules", "" })
	if err != nil {
		t.Fatalf("serveAdmin on a taken address: %v", err)
	}
	host, port, _ := net.SplitHostPort(got)
	if host != "127.0.0.1" || got == taken.Addr().String() || port == "0" {
		t.Fatalf("serveAdmin listens on %s, want another port of 127.0.0.1 than %s", got, taken.Addr())
	}
	req, _ := http.NewRequest("GET", "http://"+got+"/rules", nil)
	req.Header.Set("Authorization", "Bearer t0ken")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("GET /rules on %s: %d, want 200", got, res.StatusCode)
	}
}

// TestExampleMetrics: /metrics answers in the Prometheus text format on
// every framework's listener, unlimited, with the decisions of real
// traffic.
func TestExampleMetrics(t *testing.T) {
	t.Parallel()
	for name, serve := range frameworks {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			reg := prometheus.NewRegistry()
			m, err := sluiceprom.New(reg)
			if err != nil {
				t.Fatal(err)
			}
			lim, err := middleware.NewRules(builtinRules(), middleware.WithObserver(m))
			if err != nil {
				t.Fatal(err)
			}
			defer lim.Close()
			m.Watch(lim)
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- serve(ctx, ln, lim, promhttp.HandlerFor(reg, promhttp.HandlerOpts{})) }()
			defer func() { cancel(); <-done }()
			base := "http://" + ln.Addr().String()
			for range 7 {
				res, err := http.Get(base + "/search")
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
			}
			var body string
			for range 40 { // scraped more often than any rule allows: never limited
				res, err := http.Get(base + "/metrics")
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("/metrics: %d", res.StatusCode)
				}
				body = string(b)
			}
			for _, want := range []string{
				`sluice_decisions_total{outcome="allowed",rule="search"} 5`,
				`sluice_decisions_total{outcome="denied",rule="search"} 2`,
				"# TYPE sluice_memory_keys gauge",
			} {
				if !strings.Contains(body, want) {
					t.Errorf("/metrics lacks %q:\n%s", want, body)
				}
			}
		})
	}
}

// TestRulesFromService loads example/rules.yaml from a rules service by
// URL, as -config does, and checks that -config accepts each form.
func TestRulesFromService(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.FileServer(http.Dir(".")))
	t.Cleanup(srv.Close)
	rl, every, closeSource, err := openRules(context.Background(), srv.URL+"/rules.yaml", 50*time.Millisecond, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer closeSource()
	defer rl.Limiter().Close()
	if every != 50*time.Millisecond || rl.Document().File != srv.URL+"/rules.yaml" || len(rl.Document().Rules) == 0 {
		t.Errorf("every %v, config %+v", every, rl.Document())
	}
	if tried, err := rl.Check(); tried || err != nil {
		t.Errorf("Check() = %v, %v: want unchanged (304)", tried, err)
	}
	src, closeRedis, err := rulesSource("redis://localhost:6379/2?key=sluice:rules&dial_timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer closeRedis()
	if rs, ok := src.(*config.RedisSource); !ok || rs.Key != "sluice:rules" || rs.Client.(*redis.Client).Options().DB != 2 {
		t.Errorf("redis source %#v", src)
	}
	if _, _, err := rulesSource("redis://localhost:6379/0"); err == nil || !strings.Contains(err.Error(), "key=") {
		t.Errorf("redis URL without a key: %v", err)
	}
	if src, _, err := rulesSource("rules.yaml"); src != nil || err != nil {
		t.Errorf("path: %v, %v", src, err)
	}
	if _, _, _, err := openRules(context.Background(), srv.URL+"/missing.yaml", time.Second, "", nil); err == nil || !strings.Contains(err.Error(), "404") {
		t.Errorf("missing document: %v", err)
	}
}

// serveDemo serves the example's limiter, from rules.yaml when file is set
// or from builtinRules otherwise, with serve on a loopback port until the
// test ends, and returns the limiter and the server's address.
func serveDemo(t *testing.T, serve serveFunc, file bool) (*middleware.Limiter, string) {
	t.Helper()
	var lim *middleware.Limiter
	if file {
		rl, err := config.Open("rules.yaml", demoEnv)
		if err != nil {
			t.Fatal(err)
		}
		lim = rl.Limiter()
	} else {
		var err error
		if lim, err = middleware.NewRules(builtinRules()); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { lim.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serve(ctx, ln, lim, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return lim, ln.Addr().String()
}
