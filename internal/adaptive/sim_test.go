package adaptive

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// The benchmark's scenario (BENCHMARKS.md, "Overload") in simulated time,
// free of the machine's noise: a handler of 8 slots × 20ms (400/s) under
// an open-loop load of 1200/s with Poisson arrivals, admitted by a
// Gradient and a Shedder; half the slots go away at 10 s.

type completion struct {
	at, began time.Time
	p         Priority
}

type completions []completion

func (c completions) Len() int           { return len(c) }
func (c completions) Less(i, j int) bool { return c[i].at.Before(c[j].at) }
func (c completions) Swap(i, j int)      { c[i], c[j] = c[j], c[i] }
func (c *completions) Push(x any)        { *c = append(*c, x.(completion)) }
func (c *completions) Pop() any {
	old := *c
	x := old[len(old)-1]
	*c = old[:len(old)-1]
	return x
}

type simResult struct {
	good    [2][NumPriorities]int // by half of the run, by priority
	sent    [NumPriorities]int
	lat     []time.Duration
	limits  []int // every 100ms
	shrunk  int   // index in limits of the shrink
	refused int
}

// simulate runs the scenario for d; share[p] is the share of arrivals of
// priority p.
func simulate(d time.Duration, rate float64, share [NumPriorities]float64, shrinkAt time.Duration) simResult {
	const service = 20 * time.Millisecond
	g := New(Config{Min: 2, Max: 200}, t0)
	var sh Shedder
	rng := rand.New(rand.NewPCG(3, 4))
	free := make([]time.Time, 8) // when each slot is free
	for i := range free {
		free[i] = t0
	}
	var done completions
	var res simResult
	next := t0
	nextSample := t0
	shrunk := false
	end := t0.Add(d)
	for {
		if !next.Before(end) {
			next = end.Add(time.Hour) // no more arrivals: drain
			if done.Len() == 0 {
				break
			}
		}
		// Completions due before the next arrival.
		for done.Len() > 0 && !done[0].at.After(next) {
			c := heap.Pop(&done).(completion)
			g.End(c.at, c.at.Sub(c.began), true)
			if lat := c.at.Sub(c.began); lat <= time.Second {
				half := 0
				if c.began.Sub(t0) >= shrinkAt {
					half = 1
				}
				res.good[half][c.p]++
				res.lat = append(res.lat, lat)
			}
		}
		if next.After(end) {
			continue
		}
		for !nextSample.After(next) {
			g.Advance(nextSample)
			res.limits = append(res.limits, g.Limit())
			nextSample = nextSample.Add(100 * time.Millisecond)
		}
		if !shrunk && next.Sub(t0) >= shrinkAt {
			shrunk, res.shrunk = true, len(res.limits)
			free = free[:len(free)/2]
		}
		x, p := rng.Float64(), Priority(0)
		for p = 0; p < Critical && x >= share[p]; p++ {
			x -= share[p]
		}
		res.sent[p]++
		g.Advance(next)
		if sh.Admit(next, p, g.InFlight(), g.Limit(), 200) {
			g.Start(next)
			k := 0
			for i := range free {
				if free[i].Before(free[k]) {
					k = i
				}
			}
			start := next
			if free[k].After(start) {
				start = free[k]
			}
			free[k] = start.Add(service)
			heap.Push(&done, completion{at: free[k], began: next, p: p})
		} else {
			res.refused++
		}
		next = next.Add(time.Duration(rng.ExpFloat64() / rate * float64(time.Second)))
	}
	slices.Sort(res.lat)
	return res
}

func TestSimulatedOverload(t *testing.T) {
	t.Parallel()
	const d = 20 * time.Second
	res := simulate(d, 1200, [NumPriorities]float64{Normal: 1}, d/2)
	first := float64(res.good[0][Normal]) / (d / 2).Seconds()
	second := float64(res.good[1][Normal]) / (d / 2).Seconds()
	p50, p99 := res.lat[len(res.lat)/2], res.lat[len(res.lat)*99/100]
	t.Logf("goodput %.0f/s of 400, then %.0f/s of 200; admitted p50 %v, p99 %v", first, second, p50, p99)
	if first < 0.9*400 || second < 0.9*200 {
		t.Errorf("goodput %.0f/s and %.0f/s: want at least 90%% of 400 and of 200", first, second)
	}
	if p99 > 60*time.Millisecond {
		t.Errorf("admitted p99 %v, want at most 60ms", p99)
	}
	// The limit settles within 5 s of the shrink: its 1 s means stay
	// within ±30% of its mean over the last 5 s.
	final := 0.0
	for _, l := range res.limits[len(res.limits)-50:] {
		final += float64(l) / 50
	}
	settled := -1
	for i := len(res.limits) - 10; i >= res.shrunk; i-- {
		m := 0.0
		for _, l := range res.limits[i : i+10] {
			m += float64(l) / 10
		}
		if m < 0.7*final || m > 1.3*final {
			break
		}
		settled = i
	}
	after := time.Duration(settled-res.shrunk) * 100 * time.Millisecond
	t.Logf("limit before the shrink %d, final %.1f, settled %v after it", res.limits[res.shrunk-1], final, after)
	if settled < 0 || after > 5*time.Second {
		t.Errorf("the limit did not settle within 5 s of the shrink (%v)", after)
	}
}

func TestSimulatedPriorities(t *testing.T) {
	t.Parallel()
	const d = 20 * time.Second
	res := simulate(d, 1200, [NumPriorities]float64{Sheddable: 0.8, Critical: 0.2}, time.Hour)
	crit := float64(res.good[0][Critical]) / float64(res.sent[Critical])
	shed := float64(res.good[0][Sheddable]) / float64(res.sent[Sheddable])
	t.Logf("critical %.2f%% of %d succeeded, sheddable %.2f%% of %d", 100*crit, res.sent[Critical], 100*shed, res.sent[Sheddable])
	if crit < 0.99 {
		t.Errorf("critical success %.2f%%, want at least 99%%", 100*crit)
	}
	if shed == 0 {
		t.Error("no sheddable request succeeded")
	}
}
