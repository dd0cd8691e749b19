package sluiceprom_test

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
	sluiceprom "github.com/sluicehq/sluice/middleware/metrics/prometheus"
)

// A server that limits /api/ and serves its metrics on /metrics.
func Example() {
	// A server registers with prometheus.DefaultRegisterer and serves
	// promhttp.Handler(); the example keeps a registry of its own.
	reg := prometheus.NewRegistry()
	m, err := sluiceprom.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	// The Metrics exists before the limiter, which takes it as an option.
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP(), middleware.WithObserver(m))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	m.Watch(lim) // memory keys, queue and slots, read at each scrape

	mux := http.NewServeMux()
	mux.Handle("/api/", lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintln(w, "hello")
	})))
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	for range 3 {
		resp, err := http.Get(srv.URL + "/api/hello")
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}

	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "sluice_decisions_total") || strings.HasPrefix(line, "sluice_memory_keys") {
			fmt.Println(line)
		}
	}
	// Output:
	// 200 OK
	// 200 OK
	// 429 Too Many Requests
	// sluice_decisions_total{outcome="allowed",rule="default"} 2
	// sluice_decisions_total{outcome="denied",rule="default"} 1
	// sluice_memory_keys 1
}

// Rules from a file, with their reloads counted.
func ExampleMetrics_ObserveReload() {
	m, err := sluiceprom.New(prometheus.DefaultRegisterer)
	if err != nil {
		log.Fatal(err)
	}
	rl, err := config.Open("rules.yaml", config.Env{}, middleware.WithObserver(m))
	if err != nil {
		log.Fatal(err)
	}
	defer rl.Limiter().Close()
	m.Watch(rl.Limiter())

	// Checks the file every 10s; each reload tried counts under
	// sluice_rules_reloads_total{result="ok"} or {result="error"}.
	go rl.Watch(context.Background(), 10*time.Second, m.ObserveReload)

	http.Handle("/metrics", promhttp.Handler())
	http.Handle("/", rl.Limiter().Handler(http.NotFoundHandler()))
	log.Fatal(http.ListenAndServe(":8080", nil))
}
