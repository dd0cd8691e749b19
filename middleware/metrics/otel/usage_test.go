package sluiceotel_test

import (
	"context"
	"errors"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	sluiceotel "github.com/sluicehq/sluice/middleware/metrics/otel"
)

// usageEvents reports one settle of each kind: more than the estimate,
// into debt; less, given back; a failed one.
func usageEvents(m *sluiceotel.Metrics) {
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 900, Charged: 800, Debt: 300})
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 40, Charged: -60})
	m.Settled(middleware.SettleEvent{Rule: "chat", Policy: "chat-tokens", Units: 5, Charged: 4, Err: errors.New("down")})
}

func TestUsageInstruments(t *testing.T) {
	t.Parallel()
	m, reader := newMetrics(t)
	usageEvents(m)
	got := collect(t, reader)
	const attrs = `{policy="chat-tokens",rule="chat"}`
	want := map[string]float64{
		sluiceotel.UsageSettled + attrs:          800,
		sluiceotel.UsageRefunded + attrs:         60,
		sluiceotel.UsageDebt + "_count" + attrs:  1,
		sluiceotel.UsageDebt + "_sum" + attrs:    300,
		sluiceotel.UsageErrors + `{rule="chat"}`: 1,
	}
	for name, v := range want {
		if got[name] != v {
			t.Errorf("%s = %v, want %v", name, got[name], v)
		}
	}
}

// TestSettleSpanEvent: a request that settles its usage has, on its span,
// the decision's event and then the settle's, with what it used in all.
func TestSettleSpanEvent(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	m, _ := newMetrics(t)
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "chat", Key: keyfunc.Header("X-Key"), Limits: []middleware.Limit{middleware.PerMinute(100)},
		Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerMinute(1000)}, Estimate: 100, Max: 800},
	}}, middleware.WithObserver(m))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		if err := middleware.Settle(r.Context(), 340); err != nil {
			t.Error(err)
		}
	}))
	ctx, span := tp.Tracer("test").Start(context.Background(), "POST /chat")
	serve(ctx, h, "/chat", "alice")
	span.End()
	spans := exp.GetSpans()
	if len(spans) != 1 || len(spans[0].Events) != 2 || spans[0].Events[1].Name != sluiceotel.SettleEvent {
		t.Fatalf("spans %+v", spans)
	}
	got := map[string]string{}
	for _, kv := range spans[0].Events[1].Attributes {
		got[string(kv.Key)] = kv.Value.Emit()
	}
	if got["sluice.rule"] != "chat" || got["sluice.policy"] != "chat-tokens" || got["sluice.settled_cost"] != "340" || got["sluice.charged"] != "240" {
		t.Errorf("settle event %v", got)
	}
}
