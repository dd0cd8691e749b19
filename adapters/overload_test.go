package adapters_test

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestOverloadFrontEnds runs an adaptive concurrency limit and an elastic
// limit through every front end: over the adaptive limit, 503 with
// Retry-After: 1; the places come back when the handlers return (each
// front end calls Result.Done); and an elastic limit of 2 a minute with a
// ceiling of 5 admits 5 on an idle server, advertising the limit in force.
func TestOverloadFrontEnds(t *testing.T) {
	t.Parallel()
	for name, serve := range concurrencyServers() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim, err := middleware.NewRules([]middleware.Rule{
				{Name: "hold", Path: "/hold", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 2, Max: 2}},
				{Name: "el", Path: "/shadow", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{{Requests: 2, Window: time.Minute, Ceiling: 5}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lim.Close() })
			h := newHub()
			base := serve(t, lim, h)
			client := &http.Client{Timeout: 10 * time.Second}
			get := func(path string) (int, http.Header, string) {
				t.Helper()
				res, err := client.Get(base + path)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				defer res.Body.Close()
				body, _ := io.ReadAll(res.Body)
				return res.StatusCode, res.Header, string(body)
			}
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if code, _, _ := get("/hold"); code != 200 {
						t.Errorf("held request: %d", code)
					}
				}()
			}
			<-h.entered
			<-h.entered
			code, hdr, body := get("/hold")
			if code != 503 || hdr.Get("Retry-After") != "1" || hdr.Get("RateLimit") != "" || !strings.Contains(body, `"too many requests in flight"`) {
				t.Errorf("third /hold: %d %v %q; want 503, Retry-After 1", code, hdr, body)
			}
			close(h.release)
			wg.Wait()
			for i := range 3 { // the places came back
				if code, _, _ := get("/hold"); code != 200 {
					t.Fatalf("/hold %d after the others returned: %d", i, code)
				}
			}
			for i := range 5 {
				code, hdr, _ := get("/shadow")
				if code != 200 || hdr.Get("RateLimit-Policy") != `"el";q=5;w=60` {
					t.Fatalf("elastic request %d: %d, RateLimit-Policy %q", i, code, hdr.Get("RateLimit-Policy"))
				}
			}
			if code, _, _ := get("/shadow"); code != 429 {
				t.Errorf("sixth elastic request: %d, want 429", code)
			}
		})
	}
}
