package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/middleware"
)

// llmRules limit requests and tokens per host: 100 requests and 1,000
// tokens a second; a request's token estimate is what WithCost put in its
// context, and its real usage is settled from the X-Usage-Tokens header.
func llmRules(header string) []middleware.Rule {
	return []middleware.Rule{{Name: "llm", Key: outbound.Host(),
		Limits: []middleware.Limit{middleware.PerSecond(100)},
		Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerSecond(1000)},
			EstimateFunc: outbound.Cost, Header: header, Max: 500}}}
}

// settled records the Settled events of a Limiter.
type settled struct {
	mu sync.Mutex
	ev []middleware.SettleEvent
}

func (s *settled) add(e middleware.SettleEvent) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ev = append(s.ev, e)
}

// last returns the units and charge of the last event.
func (s *settled) last() (units, charged int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ev) == 0 {
		return -1, -1
	}
	e := s.ev[len(s.ev)-1]
	return e.Units, e.Charged
}

// TestUsage: a request reserves its estimate of tokens before it is sent
// and is settled with what it used, read from the upstream's answer: from
// the header the rule's Usage names (left for the caller to read too), a
// trailer of that name, the transport's Usage function, or the caller's
// Settle, which comes first.
func TestUsage(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ int) {
		used := r.Header.Get("X-Used")
		switch r.Header.Get("X-Report") {
		case "header":
			w.Header().Set("X-Usage-Tokens", used)
		case "trailer":
			w.Header().Set("Trailer", "X-Usage-Tokens")
			w.WriteHeader(200)
			_, _ = io.WriteString(w, `{"usage":`+used+`}`)
			w.Header().Set("X-Usage-Tokens", used)
		case "body":
			_, _ = io.WriteString(w, used)
		}
	})
	send := func(c *http.Client, report string, estimate, used int, settle func(*http.Response)) *http.Response {
		t.Helper()
		req, _ := http.NewRequestWithContext(outbound.WithCost(context.Background(), estimate), "POST", up.URL, nil)
		req.Header.Set("X-Report", report)
		req.Header.Set("X-Used", strconv.Itoa(used))
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if settle != nil {
			settle(resp)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	check := func(ev *settled, what string, units, charged int) {
		t.Helper()
		if u, c := ev.last(); u != units || c != charged {
			t.Errorf("%s: settled %d units (charged %d more), want %d (%d)", what, u, c, units, charged)
		}
	}

	t.Run("header and trailer", func(t *testing.T) {
		t.Parallel()
		ev := &settled{}
		lim := newLimiter(t, llmRules("X-Usage-Tokens"), middleware.WithObserver(&middleware.Hooks{OnSettled: ev.add}))
		c := newClient(t, lim, outbound.Options{})
		resp := send(c, "header", 50, 150, nil)
		if resp.Header.Get("X-Usage-Tokens") != "150" {
			t.Error("the usage header was removed from the caller's response")
		}
		check(ev, "150 in the header, 50 estimated", 150, 100)
		send(c, "trailer", 50, 20, nil)
		check(ev, "20 in a trailer, 50 estimated", 20, -30)
	})
	t.Run("function and Settle", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int64
		ev := &settled{}
		lim := newLimiter(t, llmRules(""), middleware.WithObserver(&middleware.Hooks{OnSettled: ev.add}))
		c := newClient(t, lim, outbound.Options{Usage: func(resp *http.Response) (int, bool) {
			calls.Add(1)
			n, err := strconv.Atoi(resp.Request.Header.Get("X-Used")) // what the upstream used
			return n, err == nil
		}})
		send(c, "body", 50, 300, nil)
		check(ev, "300 from Options.Usage", 300, 250)
		send(c, "body", 50, 300, func(resp *http.Response) {
			if err := outbound.Settle(resp, 10); err != nil {
				t.Fatal(err)
			}
			if err := outbound.Settle(resp, 10); !errors.Is(err, middleware.ErrSettledTwice) {
				t.Errorf("a second Settle: %v, want ErrSettledTwice", err)
			}
		})
		check(ev, "Settle(10), which comes before Options.Usage", 10, -40)
		if calls.Load() != 1 {
			t.Errorf("Options.Usage called %d times, want 1 (not for the response settled by the caller)", calls.Load())
		}
		if err := outbound.Settle(&http.Response{}, 1); !errors.Is(err, middleware.ErrNoUsage) {
			t.Errorf("Settle of a response of no Transport: %v, want ErrNoUsage", err)
		}
	})
}

// TestUsageBudget: requests to an LLM provider use three times their
// estimate of tokens (150 for 50). Settled with what they used, the token
// budget of 1,000 a second follows their usage: in the first second the
// provider receives at most the budget plus one request's Max
// (limit + requests in flight × Max, one in flight); with the estimates
// alone it would receive all 12 at once, 1,800 tokens.
func TestUsageBudget(t *testing.T) {
	t.Parallel()
	for _, settle := range []bool{true, false} {
		t.Run(fmt.Sprint("settle=", settle), func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, nil)
			lim := newLimiter(t, []middleware.Rule{{Name: "llm", Key: outbound.Host(),
				Usage: &middleware.Usage{Unit: "tokens", Limits: []middleware.Limit{middleware.PerSecond(1000)},
					EstimateFunc: outbound.Cost, Max: 500}}})
			o := outbound.Options{MaxWait: 5 * time.Second}
			if settle {
				o.Usage = func(*http.Response) (int, bool) { return 150, true }
			}
			c := newClient(t, lim, o)
			for i := range 12 {
				req, _ := http.NewRequestWithContext(outbound.WithCost(context.Background(), 50), "POST", up.URL, nil)
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
				resp.Body.Close()
			}
			got := up.got()
			first := 0
			for _, a := range got {
				if a.at.Sub(got[0].at) < time.Second {
					first++
				}
			}
			tokens := first * 150
			t.Logf("settle %v: %d tokens in the first second", settle, tokens)
			if settle && tokens > 1000+500 {
				t.Errorf("%d tokens reached the provider in its first second, past the bound of 1,500", tokens)
			}
			if !settle && tokens != 12*150 {
				t.Errorf("with estimates only, %d tokens in the first second, want all 1,800", tokens)
			}
		})
	}
}

// TestFollowRemaining: an upstream whose budget another client of the same
// account has mostly spent (GitHub-like, 30 per 2 s, without its limit)
// tells it in X-RateLimit-Remaining; the budget (configured for 30 per
// 2 s too) follows it until the reset instead of sending into refusals.
// (An upstream that announces its limit is followed by what the Limiter
// learns of it: TestOtherClient.)
func TestFollowRemaining(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, github(30, 2*time.Second, false))
	for range 20 { // the other client
		resp, err := http.Get(up.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var lowered atomic.Int64
	lim := newLimiter(t, []middleware.Rule{{Name: "gh", Key: outbound.Host(), Limits: []middleware.Limit{{Requests: 30, Window: 2 * time.Second}}}},
		middleware.WithObserver(&middleware.Hooks{OnOutbound: func(e middleware.OutboundEvent) {
			if e.Kind == middleware.OutboundLowered {
				lowered.Add(int64(e.Units))
			}
		}}))
	c := newClient(t, lim, outbound.Options{MaxWait: -1})
	sent, unsent := hammer(t, []*http.Client{c}, 1, 20, up.URL)
	t.Logf("sent %d, refused %d, not sent %d, lowered by %d", sent, up.refused(), len(unsent), lowered.Load())
	if lowered.Load() < 15 {
		t.Errorf("the budget was lowered by %d, want about 20 (what the other client spent)", lowered.Load())
	}
	if r := up.refused(); r > 1 {
		t.Errorf("%d refused: the budget did not follow the upstream's count", r)
	}
}

// TestOtherClient: the same, with the upstream's limit announced: the
// budget learns the quota, and when the upstream says none are left
// while the budget still holds some, the key is paused until the reset:
// nothing is refused either.
func TestOtherClient(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, github(30, 2*time.Second, true))
	for range 20 { // the other client
		resp, err := http.Get(up.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	var paused atomic.Int64
	lim := newLimiter(t, []middleware.Rule{{Name: "gh", Key: outbound.Host(), Limits: []middleware.Limit{{Requests: 30, Window: 2 * time.Second}}}},
		middleware.WithObserver(&middleware.Hooks{OnOutbound: func(e middleware.OutboundEvent) {
			if e.Kind == middleware.OutboundPaused {
				paused.Add(1)
			}
		}}))
	c := newClient(t, lim, outbound.Options{MaxWait: -1})
	sent, unsent := hammer(t, []*http.Client{c}, 1, 20, up.URL)
	t.Logf("sent %d, refused %d, not sent %d, paused %d times", sent, up.refused(), len(unsent), paused.Load())
	if r := up.refused(); r > 1 {
		t.Errorf("%d refused: the budget did not follow the upstream", r)
	}
	if paused.Load() == 0 {
		t.Error("no pause at none left")
	}
}
