package middleware_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// discardWriter is a ResponseWriter that keeps nothing, so benchmarks
// measure the middleware rather than a recorder.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

var bare = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

// floorFields are the five fields the limiter sends in these benchmarks,
// with values as long as its own, computed once.
var floorFields = [...]struct {
	name  string
	value []string
}{
	{"X-Ratelimit-Limit", []string{"1099511627"}},
	{"X-Ratelimit-Remaining", []string{"1099511626"}},
	{"X-Ratelimit-Reset", []string{"2"}},
	{"Ratelimit", []string{`"default";r=1099511626;t=2`}},
	{"Ratelimit-Policy", []string{`"default";q=1099511627;w=1`}},
}

// floor sets floorFields on every response and calls bare: no limiter,
// only what holding five fields costs the response writer.
var floor = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	for _, f := range floorFields {
		h[f.name] = f.value
	}
	bare.ServeHTTP(w, r)
})

// BenchmarkMiddleware compares a bare handler with the same handler behind
// the limiter on the in-memory store, for one hot key and for 100,000
// distinct keys. The limit is high enough that every request is allowed,
// so the allow path (decision plus headers) is what is measured. The
// response writer keeps its header map between requests, so the figures
// are the middleware's own. floor-5-fields sets five constant fields like
// the limiter's, without a limiter: the least any limiter sending them
// could cost. hot-key-observed is hot-key with an Observer that counts
// decisions. The -untracked cases turn off the tracking of top clients
// (on by default). cpu-ns/op is the process's CPU time per request, all
// threads included.
func BenchmarkMiddleware(b *testing.B) {
	benchMiddleware(b, func() func() http.ResponseWriter {
		w := &discardWriter{h: make(http.Header, 8)}
		return func() http.ResponseWriter { clear(w.h); return w }
	})
}

// BenchmarkMiddlewareRecorder is BenchmarkMiddleware under the conditions
// users and other limiters' benchmarks use: a fresh httptest.NewRecorder
// for every request, so the response headers go into a new, empty map.
// The figure that matters is the difference to baseline, measured in the
// same run.
func BenchmarkMiddlewareRecorder(b *testing.B) {
	benchMiddleware(b, func() func() http.ResponseWriter {
		return func() http.ResponseWriter { return httptest.NewRecorder() }
	})
}

// decisionCounter is an Observer that counts decisions, as the metrics
// modules do.
type decisionCounter struct {
	middleware.NopObserver
	n atomic.Int64
}

func (c *decisionCounter) Decided(keyfunc.Request, *middleware.Result) { c.n.Add(1) }

// benchMiddleware runs the cases of BenchmarkMiddleware, each goroutine
// taking its response writers from the function newWriter returns.
func benchMiddleware(b *testing.B, newWriter func() func() http.ResponseWriter) {
	const distinct = 100_000
	reqs := make([]*http.Request, distinct)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/", nil)
		reqs[i].RemoteAddr = "10." + strconv.Itoa(i>>16) + "." + strconv.Itoa(i>>8&255) + "." + strconv.Itoa(i&255) + ":1234"
	}
	var lim *middleware.Limiter // the last one newHandler made
	newHandler := func(b *testing.B, opts ...middleware.Option) http.Handler {
		var err error
		lim, err = middleware.New(middleware.PerSecond(1<<40/1000), keyfunc.RemoteIP(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		l := lim
		b.Cleanup(func() { l.Close() })
		return lim.Handler(bare)
	}
	run := func(b *testing.B, h http.Handler, n int) {
		var next atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		cpu := processCPU()
		b.RunParallel(func(pb *testing.PB) {
			w := newWriter()
			i := int(next.Add(7919))
			for pb.Next() {
				h.ServeHTTP(w(), reqs[i%n])
				i++
			}
		})
		if cpu := processCPU() - cpu; cpu > 0 {
			// The CPU time of every thread (background goroutines and GC
			// included) per request: steadier than ns/op on a shared
			// machine, where other processes take the cores.
			b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
		}
	}
	// dropped reports the share of decisions the top-client tracker could
	// not record (its ring full while it was busy: 0 but on a saturated
	// machine).
	dropped := func(b *testing.B) {
		l, err := lim.TopClients(context.Background(), middleware.DefaultRuleName, middleware.TopCharged, middleware.TopHour, 1)
		if err == nil {
			b.ReportMetric(float64(l.Dropped)/float64(b.N), "dropped/op")
		}
	}
	b.Run("baseline", func(b *testing.B) { run(b, bare, 1) })
	b.Run("floor-5-fields", func(b *testing.B) { run(b, floor, 1) })
	b.Run("hot-key", func(b *testing.B) { run(b, newHandler(b), 1); dropped(b) })
	b.Run("hot-key-observed", func(b *testing.B) {
		run(b, newHandler(b, middleware.WithObserver(&decisionCounter{})), 1)
	})
	distinctCase := func(b *testing.B, opts ...middleware.Option) {
		h := newHandler(b, opts...)
		w := newWriter()
		for _, r := range reqs { // every key exists before timing
			h.ServeHTTP(w(), r)
		}
		run(b, h, distinct)
	}
	b.Run("distinct-100k", func(b *testing.B) { distinctCase(b); dropped(b) })
	// The same without tracking top clients: what noting each decision
	// for them costs is the difference.
	untracked := middleware.WithTopClients(middleware.TopConfig{Off: true})
	b.Run("hot-key-untracked", func(b *testing.B) { run(b, newHandler(b, untracked), 1) })
	b.Run("distinct-100k-untracked", func(b *testing.B) { distinctCase(b, untracked) })
}
