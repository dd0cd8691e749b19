package compare

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// distinctClients is the number of client addresses of the "distinct-100k"
// cases.
const distinctClients = 100_000

// bare is the handler every middleware wraps, and the baseline.
var bare = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

// newRequest returns a GET request from the client ip.
func newRequest(ip string) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = ip + ":1234"
	return r
}

// BenchmarkMiddleware measures each limiter's net/http middleware over its
// in-memory store beside the bare handler it wraps (baseline), in the same
// run:
//
//	go test -run '^$' -bench BenchmarkMiddleware -count 6
//
// Every limiter has its default options, keys by the peer address
// (RemoteAddr) as its documentation shows, and allows 10^9 requests a
// minute, so the allow path is measured: key, decision, headers. Requests
// are served with b.RunParallel (one goroutine per GOMAXPROCS), each into a
// fresh httptest.NewRecorder(); the *http.Request values are built once and
// reused, the same for every limiter. "hot-key" sends every request from
// one address; "distinct-100k" cycles through 100,000 addresses, each of
// which has been served once before the timer starts, so counters exist.
// A new limiter is built for every run of a case.
//
// Every response must be a 200, and one in 64 must carry
// X-RateLimit-Remaining (all five limiters send it), or the benchmark
// fails: a limiter that denied or skipped its decision would not be
// measuring the work.
func BenchmarkMiddleware(b *testing.B) {
	hot := []*http.Request{newRequest(hotIP)}
	distinct := make([]*http.Request, distinctClients)
	for i := range distinct {
		distinct[i] = newRequest(ipv4(i))
	}
	for _, keys := range []struct {
		name string
		reqs []*http.Request
	}{
		{"hot-key", hot},
		{"distinct-100k", distinct},
	} {
		b.Run(keys.name+"/baseline", func(b *testing.B) {
			serve(b, bare, keys.reqs, false)
		})
		for _, l := range httpLimiters {
			b.Run(keys.name+"/"+l.name, func(b *testing.B) {
				h := l.wrap(b, bare)
				for _, r := range keys.reqs { // every client seen once before timing
					rec := httptest.NewRecorder()
					h.ServeHTTP(rec, r)
					if rec.Code != http.StatusOK {
						b.Fatalf("warm-up: status %d for %s", rec.Code, r.RemoteAddr)
					}
				}
				serve(b, h, keys.reqs, true)
			})
		}
	}
}

// serve serves b.N requests, cycling through reqs from b.RunParallel's
// goroutines, and fails b if a response is not a 200 or, when limited, if
// a sampled response has no X-RateLimit-Remaining field.
func serve(b *testing.B, h http.Handler, reqs []*http.Request, limited bool) {
	var next, bad, unlimited atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(7919)) // goroutines start far apart in reqs
		for pb.Next() {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, reqs[i%len(reqs)])
			if rec.Code != http.StatusOK {
				bad.Add(1)
			}
			if limited && i&63 == 0 && rec.Header().Get("X-RateLimit-Remaining") == "" {
				unlimited.Add(1)
			}
			i++
		}
	})
	b.StopTimer()
	if n := bad.Load(); n > 0 {
		b.Fatalf("%d of %d responses were not 200", n, b.N)
	}
	if n := unlimited.Load(); n > 0 {
		b.Fatalf("%d sampled responses had no X-RateLimit-Remaining", n)
	}
}
