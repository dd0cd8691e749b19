package sluiceprom_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestCapacityMetrics: a limiter with an adaptive concurrency limit of 1
// sheds the second of two requests in flight; the metrics count it by
// priority and show the limit in force.
func TestCapacityMetrics(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t)
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "api", AdaptiveConcurrency: &middleware.AdaptiveConcurrency{Min: 1, Max: 1}},
		{Name: "batch", Path: "/batch", Priority: middleware.PrioritySheddable},
	}, middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	req := func(path string) keyfunc.Request { return keyfunc.FromHTTP(httptestRequest(path)) }
	first, err := lim.Decide(req("/a"))
	if err != nil || !first.Allowed {
		t.Fatal(first, err)
	}
	for _, p := range []string{"/a", "/batch"} {
		if res, err := lim.Decide(req(p)); err != nil || res.Allowed {
			t.Fatalf("%s admitted over the limit: %+v %v", p, res, err)
		}
	}
	first.Done()
	checkSeries(t, series(t, reg), map[string]float64{
		`sluice_shed_total{priority="normal",rule="api"}`:    1,
		`sluice_shed_total{priority="sheddable",rule="api"}`: 1,
		`sluice_adaptive_limit{rule="api"}`:                  1,
	})
}

func httptestRequest(path string) *http.Request {
	return httptest.NewRequest(http.MethodGet, path, nil)
}
