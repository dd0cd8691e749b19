package middleware_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// An elastic limit: 2 a second per client, and up to 5 while the server
// has spare capacity, as it has here. RateLimit-Policy shows the limit in
// force.
func ExampleLimit_elastic() {
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "api", Key: keyfunc.RemoteIP(),
		Limits: []middleware.Limit{{Requests: 2, Window: time.Second, Ceiling: 5}},
	}})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for i := range 6 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(i+1, rec.Code, rec.Header().Get("RateLimit-Policy"))
	}
	// Output:
	// 1 200 "api";q=5;w=1
	// 2 200 "api";q=5;w=1
	// 3 200 "api";q=5;w=1
	// 4 200 "api";q=5;w=1
	// 5 200 "api";q=5;w=1
	// 6 429 "api";q=5;w=1
}

// An adaptive concurrency limit for the whole server, which sheds batch
// requests before the others.
func ExampleAdaptiveConcurrency() {
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "protect", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 2, Max: 50}},
		{Name: "batch", Path: "/batch/*", Priority: middleware.PrioritySheddable},
	})
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	decide := func(path string) middleware.Result {
		res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest(http.MethodGet, path, nil)))
		if err != nil {
			panic(err)
		}
		return res
	}
	first := decide("/api") // in flight until Done
	defer first.Done()
	batch := decide("/batch/report") // sheddable: refused at half the limit of 2
	fmt.Println(batch.Allowed, batch.Shed, batch.Priority, middleware.DenyStatus(&batch))
	api := decide("/api")
	fmt.Println(api.Allowed, api.Priority)
	api.Done()
	// Output:
	// false true sheddable 503
	// true normal
}
