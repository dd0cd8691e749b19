package sluiceotel_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// A limiter whose decisions are counted through OpenTelemetry. A server
// passes its own MeterProvider (otel.GetMeterProvider(), one with an OTLP
// or Prometheus exporter); the example reads the counts with a
// ManualReader.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())

	m, err := sluiceotel.New(mp)
	if err != nil {
		log.Fatal(err)
	}
	defer m.Close()
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP(), middleware.WithObserver(m))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	m.Watch(lim)

	// Requests with a span in their context (from otelhttp.NewHandler,
	// say) also get a "sluice.decision" event on it.
	h := lim.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 3 {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, md := range sm.Metrics {
			if md.Name != sluiceotel.Decisions {
				continue
			}
			for _, p := range md.Data.(metricdata.Sum[int64]).DataPoints {
				outcome, _ := p.Attributes.Value("outcome")
				lines = append(lines, fmt.Sprint(md.Name, " ", outcome.AsString(), " ", p.Value))
			}
		}
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// 200
	// 200
	// 429
	// sluice.decisions allowed 2
	// sluice.decisions denied 1
}
