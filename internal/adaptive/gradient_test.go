package adaptive

import (
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// service is a model of a handler with slots that each serve one request
// in base: with c requests in flight, each takes base·max(1, c/slots).
type service struct {
	slots int
	base  time.Duration
}

func (s service) latency(c int) time.Duration {
	if c <= s.slots {
		return s.base
	}
	return s.base * time.Duration(c) / time.Duration(s.slots)
}

// drive runs a closed loop for d from *now: batches of as many requests as
// the limit admits start together and end together after the service's
// latency. It returns the limit at the end.
func drive(g *Gradient, now *time.Time, d time.Duration, svc service) int {
	end := now.Add(d)
	for now.Before(end) {
		c := g.Limit()
		lat := svc.latency(c)
		for range c {
			g.Start(*now)
		}
		*now = now.Add(lat)
		for range c {
			g.End(*now, lat, true)
		}
	}
	return g.Limit()
}

func TestGradientFollowsLatency(t *testing.T) {
	t.Parallel()
	cfg := Config{Min: 2, Max: 200, ProbeEvery: time.Hour}
	g := New(cfg, t0)
	now := t0
	fast := service{slots: 8, base: 20 * time.Millisecond}
	slow := service{slots: 4, base: 20 * time.Millisecond} // half the capacity: latency doubles at the old limit

	steps := []struct {
		name     string
		svc      service
		d        time.Duration
		min, max int
	}{
		// 8 slots: the limit settles where requests queue a little, well
		// above 8 (all slots used) and well below Max.
		{"settles on 8 slots", fast, 10 * time.Second, 9, 24},
		{"falls when latency doubles", slow, 5 * time.Second, 4, 12},
		{"recovers", fast, 5 * time.Second, 9, 24},
	}
	prev := 0
	for i, st := range steps {
		got := drive(g, &now, st.d, st.svc)
		if got < st.min || got > st.max {
			t.Fatalf("%s: limit %d, want %d..%d", st.name, got, st.min, st.max)
		}
		if i == 1 && got >= prev {
			t.Fatalf("%s: limit %d, did not fall from %d", st.name, got, prev)
		}
		if i == 2 && got <= prev {
			t.Fatalf("%s: limit %d, did not rise from %d", st.name, got, prev)
		}
		if lat := g.Latency(); lat > 3*st.svc.base {
			t.Errorf("%s: latency %v at limit %d, want at most %v", st.name, lat, got, 3*st.svc.base)
		}
		t.Logf("%s: limit %d, latency %v", st.name, got, g.Latency())
		prev = got
	}
	if m := g.MinLatency(); m != 20*time.Millisecond {
		t.Errorf("min latency %v, want 20ms", m)
	}
}

func TestGradientLimitFallsAtOnceWhenLatencyDoubles(t *testing.T) {
	t.Parallel()
	// Injected samples at a fixed concurrency: the limit's own path, one
	// window at a time.
	g := New(Config{Min: 1, Max: 100, Initial: 40, ProbeSamples: 30, ProbeEvery: time.Hour}, t0)
	now := t0
	feed := func(lat time.Duration, inflight int) {
		for range inflight {
			g.Start(now)
		}
		for range inflight {
			g.End(now.Add(lat), lat, true)
		}
		now = now.Add(100 * time.Millisecond)
		g.Advance(now)
	}
	feed(10*time.Millisecond, 30) // the first samples measure the minimum
	if got := g.MinLatency(); got != 10*time.Millisecond {
		t.Fatalf("min latency %v, want 10ms", got)
	}
	before := g.Limit()
	feed(20*time.Millisecond, 30)
	after := g.Limit()
	// gradient = 12.5/20: 40·0.625 + √40 = 31.3
	if after != 31 {
		t.Fatalf("limit %d after latency doubled from %d, want 31", after, before)
	}
	if s := g.Spare(); s != 0 {
		t.Errorf("spare %v while latency is above the buffer, want 0", s)
	}
	feed(10*time.Millisecond, 30)
	if got := g.Limit(); got <= after {
		t.Errorf("limit %d after latency came back, want above %d", got, after)
	}
}

func TestGradientSpare(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		inflight int
		lat      time.Duration
		want     float64
	}{
		{"idle", 0, 0, 1},
		{"a quarter used", 5, 10 * time.Millisecond, 0.75},
		{"all used", 20, 10 * time.Millisecond, 0},
		{"queueing", 5, 30 * time.Millisecond, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := New(Config{Min: 20, Max: 20, ProbeSamples: 1, MinSamples: 1, ProbeEvery: time.Hour}, t0)
			g.Start(t0)
			g.End(t0.Add(10*time.Millisecond), 10*time.Millisecond, true) // the minimum: 10ms
			now := t0.Add(10 * time.Millisecond)
			// tc.inflight requests held over a whole window.
			for range tc.inflight {
				g.Start(now)
			}
			if tc.lat > 0 {
				g.Start(now)
				g.End(now.Add(tc.lat), tc.lat, true)
			}
			g.Advance(now.Add(100 * time.Millisecond))
			if got := g.Spare(); got < tc.want-0.06 || got > tc.want+0.06 {
				t.Errorf("spare %.3f, want %.2f", got, tc.want)
			}
		})
	}
}

func TestGradientProbesAgain(t *testing.T) {
	t.Parallel()
	g := New(Config{Min: 3, Max: 100, Initial: 20, ProbeSamples: 5, ProbeEvery: time.Second}, t0)
	now := t0
	for range 5 {
		g.Start(now)
		g.End(now.Add(10*time.Millisecond), 10*time.Millisecond, true)
	}
	if g.MinLatency() != 10*time.Millisecond {
		t.Fatalf("min latency %v, want 10ms", g.MinLatency())
	}
	lim := g.Limit()
	g.Advance(now.Add(2 * time.Second))
	if got := g.Limit(); got != 3 {
		t.Fatalf("limit %d during a probe, want Min 3", got)
	}
	now = now.Add(2 * time.Second)
	for range 5 { // the service became slower for good
		g.Start(now)
		g.End(now.Add(15*time.Millisecond), 15*time.Millisecond, true)
	}
	if g.MinLatency() != 15*time.Millisecond {
		t.Errorf("min latency %v after the probe, want 15ms", g.MinLatency())
	}
	if got := g.Limit(); got != lim {
		t.Errorf("limit %d after the probe, want %d as before it", got, lim)
	}
}

func TestGradientClockBackwards(t *testing.T) {
	t.Parallel()
	g := New(Config{Min: 1, Max: 10}, t0)
	g.Start(t0.Add(time.Second))
	g.End(t0, time.Millisecond, true) // earlier than the last call
	if g.InFlight() != 0 {
		t.Fatalf("in flight %d, want 0", g.InFlight())
	}
	g.End(t0, time.Millisecond, false) // more ends than starts
	if g.InFlight() != 0 {
		t.Fatalf("in flight %d, want 0", g.InFlight())
	}
}

func TestGradientCPUGate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		cpu       float64
		wantSpare float64
		grows     bool
	}{
		{-1, 0.75, true}, // no reading
		{0, 0.75, true},
		{0.45, 0.5, true},
		{0.9, 0, false},
		{1, 0, false},
	} {
		g := New(Config{Min: 20, Max: 100, ProbeSamples: 1, MinSamples: 1, ProbeEvery: time.Hour}, t0)
		g.Start(t0)
		g.End(t0, 10*time.Millisecond, true) // the minimum: 10ms
		g.ObserveCPU(tc.cpu)
		for range 5 {
			g.Start(t0)
		}
		for range 5 { // a quarter of the limit used, at the minimum latency
			g.End(t0.Add(100*time.Millisecond), 10*time.Millisecond, true)
			g.Start(t0.Add(100 * time.Millisecond))
		}
		g.Advance(t0.Add(100 * time.Millisecond))
		if got := g.Spare(); got < tc.wantSpare-0.01 || got > tc.wantSpare+0.01 {
			t.Errorf("cpu %.2f: spare %.3f, want %.2f", tc.cpu, got, tc.wantSpare)
		}
		h := New(Config{Min: 20, Max: 100, ProbeSamples: 1, MinSamples: 1, ProbeEvery: time.Hour}, t0)
		h.Start(t0)
		h.End(t0, 10*time.Millisecond, true)
		h.ObserveCPU(tc.cpu)
		for range 15 {
			h.Start(t0)
		}
		h.End(t0.Add(100*time.Millisecond), 10*time.Millisecond, true)
		h.Advance(t0.Add(200 * time.Millisecond))
		if grew := h.Limit() > 20; grew != tc.grows {
			t.Errorf("cpu %.2f: limit %d, grew %v, want %v", tc.cpu, h.Limit(), grew, tc.grows)
		}
	}
}
