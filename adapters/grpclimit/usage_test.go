package grpclimit_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adapters/grpclimit"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// settled collects the Settled events of a limiter.
type settled struct {
	mu     sync.Mutex
	events []middleware.SettleEvent
}

func (s *settled) add(e middleware.SettleEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, e)
}

// wait returns the events once there are n, the stream's end being
// settled after the client saw it.
func (s *settled) wait(t *testing.T, n int) []middleware.SettleEvent {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		ev := append([]middleware.SettleEvent(nil), s.events...)
		s.mu.Unlock()
		if len(ev) >= n || time.Now().After(deadline) {
			return ev
		}
	}
}

// usageLimiter limits the calls of one peer to 20 a minute and 100 tokens
// a minute, with an estimate of 10 and at most 80 per call, the usage
// reported through the context or the usage trailer.
func usageLimiter(t *testing.T, store middleware.Store, clk *testclock.Clock, ev *settled) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "llm", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(20).FixedWindow()},
		Usage: &middleware.Usage{
			Unit: "tokens", Limits: []middleware.Limit{middleware.PerMinute(100).FixedWindow()},
			Estimate: 10, Max: 80, Header: "X-Usage-Tokens",
		},
	}}, middleware.WithStore(store), middleware.WithClock(clk.Now), middleware.WithObserver(&middleware.Hooks{OnSettled: ev.add}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

// TestUsageUnary settles unary calls through a real gRPC server: the
// handler's context, the usage trailer (which the client never sees), and
// the debt they leave, which refuses the next call until the window
// renews.
func TestUsageUnary(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(t0)
			ev := &settled{}
			c, _ := start(t, usageLimiter(t, st.make(t), clk, ev), grpclimit.Options{})
			call := func(kv ...string) (metadata.MD, metadata.MD, error) {
				var hdr, trl metadata.MD
				_, err := c.UnaryCall(withMD(kv...), &testpb.SimpleRequest{}, grpc.Header(&hdr), grpc.Trailer(&trl))
				return hdr, trl, err
			}
			hdr, _, err := call("settle", "50")
			if err != nil {
				t.Fatal(err)
			}
			if got := hdr.Get("ratelimit"); len(got) != 1 || got[0] != `"llm";r=19;t=20, "llm-tokens";r=90;t=20` {
				t.Errorf("ratelimit %v: want both policies", got)
			}
			_, trl, err := call("trailer", "60")
			if err != nil {
				t.Fatal(err)
			}
			if len(trl.Get(usageTrailer)) != 0 || len(trl.Get("other")) != 1 {
				t.Errorf("trailer %v: want the usage taken off, the rest kept", trl)
			}
			// 110 tokens: in debt until the fixed window renews, 20 s on.
			_, _, err = call()
			if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "llm-tokens") {
				t.Fatalf("in debt: %v, want ResourceExhausted by llm-tokens", err)
			}
			clk.Add(20 * time.Second)
			if _, _, err = call("settle", "-3"); err != nil {
				t.Fatalf("a new window: %v", err)
			}
			// A bad settle changes nothing: the estimate of 10 stands.
			events := ev.wait(t, 2)
			if len(events) != 2 || events[0].Charged != 40 || events[1].Charged != 50 || events[1].Debt != 10 {
				t.Errorf("events %+v", events)
			}
		})
	}
}

// TestUsageStream settles streams when they end: closed by the client, or
// cancelled mid-stream, in which case what the handler received so far is
// charged; through the stream's context or its SetTrailer.
func TestUsageStream(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		for _, how := range []string{"context", "trailer"} {
			t.Run(st.name+"/"+how, func(t *testing.T) {
				t.Parallel()
				clk := testclock.New(t0)
				ev := &settled{}
				c, _ := start(t, usageLimiter(t, st.make(t), clk, ev), grpclimit.Options{})
				open := func(ctx context.Context) testpb.TestService_FullDuplexCallClient {
					kv := []string{"per-message", "7"}
					if how == "trailer" {
						kv = append(kv, "trailer", "1")
					}
					s, err := c.FullDuplexCall(metadata.AppendToOutgoingContext(ctx, kv...))
					if err != nil {
						t.Fatal(err)
					}
					return s
				}
				exchange := func(s testpb.TestService_FullDuplexCallClient, n int) {
					for range n {
						if err := s.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
							t.Fatal(err)
						}
						if _, err := s.Recv(); err != nil {
							t.Fatal(err)
						}
					}
				}
				// Closed after 3 messages: 21 tokens, 11 more than the
				// estimate.
				s := open(context.Background())
				exchange(s, 3)
				_ = s.CloseSend()
				if _, err := s.Recv(); err == nil {
					t.Fatal("stream did not end")
				}
				if how == "trailer" && len(s.Trailer().Get(usageTrailer)) != 0 {
					t.Errorf("usage trailer sent to the client: %v", s.Trailer())
				}
				// Cancelled after 5: the 35 produced are charged.
				ctx, cancel := context.WithCancel(context.Background())
				s = open(ctx)
				exchange(s, 5)
				cancel()
				events := ev.wait(t, 2)
				if len(events) != 2 || events[0].Units != 21 || events[0].Charged != 11 || events[1].Units != 35 || events[1].Charged != 25 {
					t.Fatalf("events %+v: want 21 and 35 settled", events)
				}
			})
		}
	}
}
