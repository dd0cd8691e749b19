package middleware_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// BenchmarkCount measures what counting by the response costs on the
// memory store: the same limit without Count (plain), and with Count for a
// response that counts (kept) and one that does not (given back after the
// handler). Each iteration is one request of one of 1,000 clients through
// Handler, with a limit none of them reaches.
func BenchmarkCount(b *testing.B) {
	for _, bc := range []struct {
		name   string
		count  middleware.Count
		status int
	}{
		{"plain", middleware.Count{}, 200},
		{"counted", middleware.Count{Status: []middleware.Status{401}}, 401},
		{"given-back", middleware.Count{Status: []middleware.Status{401}}, 200},
	} {
		b.Run(bc.name, func(b *testing.B) {
			lim, err := middleware.NewRules([]middleware.Rule{{
				Name: "login", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{{Requests: 1 << 40, Window: time.Minute}}, Count: bc.count,
			}})
			if err != nil {
				b.Fatal(err)
			}
			defer lim.Close()
			h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(bc.status) }))
			reqs := make([]*http.Request, 1000)
			for i := range reqs {
				reqs[i] = httptest.NewRequest("POST", "/login", nil)
				reqs[i].RemoteAddr = "10.0." + strconv.Itoa(i/250) + "." + strconv.Itoa(i%250) + ":1"
			}
			w := httptest.NewRecorder()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				h.ServeHTTP(w, reqs[i%len(reqs)])
			}
		})
	}
}
