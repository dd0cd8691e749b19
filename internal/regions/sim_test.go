package regions

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/regiontest"
	"github.com/sluicehq/sluice/internal/schedlag"
)

// mode is how a scenario's limit is shared by the regions.
type mode int

const (
	global    mode = iota // scope: global
	perRegion             // a counter per region only
	strict                // one home region's Redis decides (global_strict)
)

func (m mode) String() string { return [...]string{"global", "per-region", "global_strict"}[m] }

// scenario is load on the regions of the simulation.
type scenario struct {
	name string
	// rate is region r's request rate (per second) in window i.
	rate func(r string, i int) float64
	// bursts: at these offsets (fractions of the window) each region
	// sends burst requests at once.
	burst int
	at    []float64
	// cut partitions the region from the start of window cutFrom to the
	// start of window cutTo: its links are closed, or, with slow, delay
	// every byte by slow each way (stopped is slow forever: the links
	// carry nothing, as when packets are dropped).
	cut            string
	cutFrom, cutTo int
	slow           time.Duration
}

// stopped is scenario.slow for links that carry nothing.
const stopped = -1

// params are the settings of one run.
type params struct {
	limit   int64
	window  time.Duration
	sync    time.Duration
	tick    time.Duration
	hold    time.Duration
	windows int
	// timeout bounds each push (Config.Timeout); 0 means its default.
	timeout time.Duration
}

// result is what a run measured.
type result struct {
	perWindow []int64 // admitted across regions, by window
	// secondHalf is what perWindow admitted in each window's second half.
	secondHalf []int64
	max        int64 // the most admitted in one window
	maxAfter   int64 // the most in windows starting a hold time into a partition, or later
	p99        map[string]time.Duration
	rate       float64 // the most requests offered per second across regions, in one window
	offered    []int64 // the instants of every request offered (Unix ms), sorted
	// converge is how long after the heal every region had the marker
	// of the cut region and the cut region theirs (-1: not within
	// healWait).
	converge time.Duration
	// slow is how late a step could run in the run: the worst of this
	// process's scheduling lag and a round trip to a region's Redis
	// (whose server shares the machine's cores); healSlow is the same
	// from the heal until convergence.
	slow, healSlow time.Duration
	// late is the longest a decision ended after its instant; firstLate
	// the same for the decisions of each window's first half.
	late      time.Duration
	firstLate []time.Duration
	errs      int64
	// down: a peer was counted as its share at some point (a push failed
	// a hold time after the last success).
	down bool
}

// healWait bounds the wait for convergence after a heal.
const healWait = 30 * time.Second

// rttLog records the round trips of a PING to each region's Redis, one
// every few ms on a connection of its own: how late the simulation's
// redis-servers answer on a machine whose cores they share (the
// scheduling lag of this process does not show it).
type rttLog struct {
	mu      sync.Mutex
	samples []rttSample
}

type rttSample struct {
	at  time.Time // when the PING was sent
	rtt time.Duration
}

// measureRTT starts a prober for each of clients; they stop at stop.
func measureRTT(clients []*redis.Client, stop <-chan struct{}) *rttLog {
	l := &rttLog{}
	for _, c := range clients {
		go func() {
			for {
				select {
				case <-stop:
					return
				case <-time.After(5 * time.Millisecond):
				}
				at := time.Now()
				if err := c.Ping(context.Background()).Err(); err != nil {
					continue
				}
				l.mu.Lock()
				l.samples = append(l.samples, rttSample{at, time.Since(at)})
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// worst returns the longest round trip that overlapped [from, to].
func (l *rttLog) worst(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var w time.Duration
	for _, s := range l.samples {
		if !s.at.After(to) && !s.at.Add(s.rtt).Before(from) {
			w = max(w, s.rtt)
		}
	}
	return w
}

// storesFor returns the deciding store of each region for m.
func storesFor(t testing.TB, sim *regiontest.Sim, m mode, p params, down *atomic.Bool) map[string]*Store {
	t.Helper()
	out := map[string]*Store{}
	now := time.Now().UnixMilli()
	for _, r := range sim.Names {
		cfg := Config{Region: r, Local: sim.Local(t, r), Hold: p.hold, Timeout: p.timeout}
		if testEvents != nil {
			cfg.Events = testEvents(r)
		}
		unreachable := cfg.Events.Unreachable
		cfg.Events.Unreachable = func(peer string, d bool) {
			if d {
				down.Store(true)
			}
			if unreachable != nil {
				unreachable(peer, d)
			}
		}
		switch m {
		case global:
			cfg.Peers = sim.Peers(t, r)
			for _, c := range cfg.Peers {
				warm(c, 16)
			}
		case strict:
			cfg.Region = "home"
			if r != regiontest.USEast1 {
				cfg.Local = sim.Peers(t, r)[regiontest.USEast1]
				warm(cfg.Local, 128)
			}
		}
		s, err := New(cfg, now)
		if err != nil {
			t.Fatal(err)
		}
		if m == global {
			s.Run(p.tick, func() int64 { return time.Now().UnixMilli() })
			t.Cleanup(s.Close)
		}
		out[r] = s
	}
	return out
}

// warm opens n connections of c at once, as a server that has run for a
// while has them, so that requests and pushes measure the round trip and
// not a new connection's handshake.
func warm(c redis.UniversalClient, n int) {
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.Ping(context.Background()).Err()
		}()
	}
	wg.Wait()
}

var runs atomic.Int64

// pollEvery is how often convergence after a heal is polled.
const pollEvery = 2 * time.Millisecond

// testEvents, if set, gives the stores of a run their events.
var testEvents func(region string) Events

// runScenario runs sc in mode m on the simulation, in real time.
func runScenario(t testing.TB, sim *regiontest.Sim, sc scenario, m mode, p params) result {
	t.Helper()
	lags := schedlag.Start(t)
	var probes []*redis.Client
	for _, r := range sim.Names {
		probes = append(probes, sim.Local(t, r))
	}
	stopRTT := make(chan struct{})
	rtts := measureRTT(probes, stopRTT)
	var down atomic.Bool
	stores := storesFor(t, sim, m, p, &down)
	counter := fmt.Sprintf("sim-%d-%d", time.Now().UnixNano(), runs.Add(1))
	w := p.window.Milliseconds()
	// Start on a window boundary, so every window is whole.
	start := Start(time.Now().UnixMilli(), w) + w
	time.Sleep(time.Until(time.UnixMilli(start)))

	var mu sync.Mutex
	admitted, second := make([]int64, p.windows), make([]int64, p.windows)
	var late time.Duration
	firstLate := make([]time.Duration, p.windows)
	lat := map[string][]time.Duration{}
	var errs atomic.Int64
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	// decide decides one request at the instant now (Unix ms), which is
	// when the schedule says it arrives: the window it counts in does not
	// depend on how late this goroutine runs.
	decide := func(r string, now int64) {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			began := time.Now()
			d, err := stores[r].Decide(context.Background(), now, Charge{Counter: counter, Limit: p.limit, Window: w, Cost: 1, Interval: p.sync})
			took := time.Since(began)
			if err != nil {
				errs.Add(1)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			lat[r] = append(lat[r], took)
			ended := time.Since(time.UnixMilli(now))
			late = max(late, ended)
			if (now-start)%w < w/2 {
				firstLate[(now-start)/w] = max(firstLate[(now-start)/w], ended)
			}
			if d.Allowed {
				admitted[(now-start)/w]++
				if (now-start)%w >= w/2 {
					second[(now-start)/w]++
				}
			}
		}()
	}

	// The partition and the measure of convergence after it heals.
	var converge time.Duration
	var healAt, convergedAt time.Time
	locals := map[string]*redis.Client{}
	for _, r := range sim.Names {
		locals[r] = sim.Local(t, r)
	}
	if sc.cut != "" {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Until(time.UnixMilli(start + int64(sc.cutFrom)*w)))
			switch {
			case sc.slow == stopped:
				sim.Drop(sc.cut)
			case sc.slow > 0:
				sim.SlowDown(sc.cut, sc.slow)
			default:
				sim.Partition(sc.cut)
			}
			time.Sleep(time.Until(time.UnixMilli(start + int64(sc.cutTo)*w)))
			converge = -1
			// Just before the heal, each region admits one request of a
			// marker counter of its own: after the heal, the cut region's
			// marker must reach every other region and theirs the cut
			// region. The marker's window outlives the run, so that what
			// is measured does not depend on where the heal falls in the
			// load's windows (the syncer stops pushing a window once it
			// has ended), and its counts do not move after the heal.
			mark := Charge{Counter: counter + "-mark", Limit: 1 << 30, Window: 60_000, Cost: 1, Interval: p.sync}
			at := time.Now().UnixMilli()
			for _, r := range sim.Names {
				if _, err := stores[r].Decide(context.Background(), at, mark); err != nil {
					t.Errorf("marker in %s: %v", r, err)
					return
				}
			}
			k := key(mark.Counter, Start(at, mark.Window))
			healAt = sim.Heal(sc.cut)
			for time.Since(healAt) < healWait {
				done := true
				for _, r := range sim.Names {
					got, _ := locals[r].HGetAll(context.Background(), k).Result()
					for _, q := range sim.Names {
						if q != r && (q == sc.cut || r == sc.cut) && got[q] != "1" {
							done = false
						}
					}
				}
				if done {
					convergedAt = time.Now()
					converge = convergedAt.Sub(healAt)
					return
				}
				time.Sleep(pollEvery)
			}
		}()
	}

	var maxRate float64
	for i := 0; i < p.windows; i++ {
		var sum float64
		for _, r := range sim.Names {
			sum += sc.rate(r, i)
		}
		maxRate = max(maxRate, sum+float64(sc.burst*len(sim.Names)*len(sc.at))/p.window.Seconds())
	}
	var offered []int64
	var lw sync.WaitGroup
	for _, r := range sim.Names {
		lw.Add(1)
		go func() {
			defer lw.Done()
			// The window's requests, evenly spaced, and its bursts.
			for i := 0; i < p.windows; i++ {
				ws := start + int64(i)*w
				var at []int64
				n := int(sc.rate(r, i)*p.window.Seconds() + 0.5)
				for j := 0; j < n; j++ {
					at = append(at, ws+int64(j)*w/int64(n))
				}
				for _, f := range sc.at {
					for j := 0; j < sc.burst; j++ {
						at = append(at, ws+int64(f*float64(w)))
					}
				}
				slices.Sort(at)
				mu.Lock()
				offered = append(offered, at...)
				mu.Unlock()
				for _, t := range at {
					time.Sleep(time.Until(time.UnixMilli(t)))
					decide(r, t)
				}
			}
		}()
	}
	lw.Wait()
	wg.Wait()
	close(stopRTT)

	slices.Sort(offered)
	res := result{perWindow: admitted, secondHalf: second, late: late, firstLate: firstLate, p99: map[string]time.Duration{}, rate: maxRate, offered: offered, converge: converge, errs: errs.Load(), down: down.Load()}
	res.slow = max(lags.Max(), rtts.worst(time.Time{}, time.Now()))
	if converge >= 0 && sc.cut != "" {
		res.healSlow = max(lags.Worst(healAt, convergedAt), rtts.worst(healAt, convergedAt))
	}
	after := 0
	if sc.cut != "" {
		// A peer is unreachable once a push or a ping (every
		// DefaultSyncInterval when idle) fails a hold time after the
		// last success; over a link that still carries, slowly or not at
		// all, a push fails only at its timeout. The tick that starts
		// that push and the wake-up at its timeout may each run late.
		lag := p.hold + max(p.sync, DefaultSyncInterval) + p.tick + 2*res.slow
		if sc.slow != 0 {
			timeout := p.timeout
			if timeout == 0 {
				timeout = time.Second
			}
			lag += timeout
		}
		after = sc.cutFrom + int((lag+p.window-1)/p.window)
	}
	for i, n := range admitted {
		res.max = max(res.max, n)
		if i >= after {
			res.maxAfter = max(res.maxAfter, n)
		}
	}
	for r, ls := range lat {
		slices.Sort(ls)
		res.p99[r] = ls[len(ls)*99/100]
	}
	return res
}

// boundFor is the stated bound of p for the load of res, with the
// largest one-way delay of the simulation: min(R × (T + d), (N − 1) × L),
// where R × (T + d) is the most requests offered across regions in any
// interval of T + d (for a burst, the burst), and the syncer's tick is
// added to T (a counter is pushed at the first tick once it is due).
func boundFor(sim *regiontest.Sim, p params, res result) int64 {
	return boundWith(sim, p, res, 0)
}

// boundWith is boundFor with slack added to the lag: how late a count
// may reach the other regions on a loaded machine.
func boundWith(sim *regiontest.Sim, p params, res result, slack time.Duration) int64 {
	_, d := delays(sim)
	lag := (p.sync + p.tick + d + slack).Milliseconds()
	var most, j int
	for i, t := range res.offered {
		for res.offered[j] <= t-lag {
			j++
		}
		most = max(most, i-j+1)
	}
	return min(int64(most), int64(len(sim.Names)-1)*p.limit)
}

// delays returns the smallest and the largest one-way delay between two
// regions of the simulation.
func delays(sim *regiontest.Sim) (lo, hi time.Duration) {
	lo = time.Hour
	for _, a := range sim.Names {
		for _, b := range sim.Names {
			if a != b {
				lo, hi = min(lo, sim.Links[a][b].Delay()), max(hi, sim.Links[a][b].Delay())
			}
		}
	}
	return lo, hi
}

func balanced(per float64) func(string, int) float64 {
	return func(string, int) float64 { return per }
}

// scenarios are the design notes' load shapes, for a limit of 100 per
// window of w.
func scenarios(w time.Duration) []scenario {
	perWindow := func(n float64) float64 { return n / w.Seconds() }
	return []scenario{
		{name: "balanced", rate: balanced(perWindow(40))},
		{name: "one hot region", rate: func(r string, _ int) float64 {
			if r == regiontest.USEast1 {
				return perWindow(150)
			}
			return perWindow(5)
		}},
		{name: "load moving", rate: func(r string, i int) float64 {
			if r == regiontest.Names[i%3] {
				return perWindow(120)
			}
			return perWindow(10)
		}},
		{name: "burst at window start", rate: balanced(0), burst: 60, at: []float64{0, 0.5}},
		{name: "partition and healing", rate: balanced(perWindow(40)), cut: regiontest.APSoutheast1, cutFrom: 1, cutTo: 4},
		// A peer that answers, but later than a push may take, and one
		// whose packets are dropped: the same as a partition, once its
		// pushes time out.
		{name: "slow peer", rate: balanced(perWindow(40)), cut: regiontest.APSoutheast1, cutFrom: 1, cutTo: 4, slow: 300 * time.Millisecond},
		{name: "peer dropping packets", rate: balanced(perWindow(40)), cut: regiontest.APSoutheast1, cutFrom: 1, cutTo: 4, slow: stopped},
	}
}

func TestScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the simulation in real time")
	}
	sim := regiontest.New(t, regiontest.Names, regiontest.ScaledDelays(4))
	p := params{limit: 100, window: 400 * time.Millisecond, sync: 50 * time.Millisecond, tick: 10 * time.Millisecond, hold: 150 * time.Millisecond, windows: 3,
		timeout: 100 * time.Millisecond}
	for _, sc := range scenarios(p.window) {
		t.Run(sc.name, func(t *testing.T) {
			q := p
			if sc.cut != "" {
				q.windows = 6
			}
			res := runScenario(t, sim, sc, global, q)
			// A count reaches the other regions T + tick + d after its
			// decision's instant; on a loaded machine, later by as long
			// as the decision ended after its instant, and by three
			// steps that wait for a core: the syncer's tick, its read of
			// the region's counts (a round trip to the region's Redis)
			// and the push's crossing.
			bound := boundWith(sim, q, res, res.late+3*res.slow)
			t.Logf("global: admitted per window %v (second halves %v), limit %d, bound %d, convergence %v, slowest step %v (%v meanwhile), a peer counted as its share: %v, p99 %v",
				res.perWindow, res.secondHalf, q.limit, bound, res.converge, res.slow, res.healSlow, res.down, res.p99)
			if res.errs > 0 {
				t.Fatalf("%d decisions failed: a global decision must not need a peer", res.errs)
			}
			if res.maxAfter > q.limit+bound {
				t.Errorf("%d admitted in one window, over the limit %d plus the bound %d", res.maxAfter, q.limit, bound)
			}
			minD, maxD := delays(sim)
			switch sc.name {
			case "burst at window start":
				for i, n := range res.perWindow {
					first, second := n-res.secondHalf[i], res.secondHalf[i]
					// No region hears of another's burst before its first
					// push, due T after the burst, crosses the fastest
					// link: every first burst is admitted whole if its
					// decisions ended by then.
					if res.firstLate[i] < q.sync+minD && first != 3*int64(sc.burst) {
						t.Errorf("window %d: %d admitted of the first bursts, want all %d (their last decision ended %v after their instant)", i, first, 3*sc.burst, res.firstLate[i])
					}
					// The second bursts come half a window after the first:
					// if by then the first bursts' counts (over the limit)
					// reached every region, by the next push after their
					// last decision, the second bursts are all denied.
					if seen := res.firstLate[i] + q.sync + q.tick + maxD + 3*res.slow; seen <= q.window/2 && second != 0 {
						t.Errorf("window %d: %d admitted of the second bursts, want none (the first bursts reached every region within %v)", i, second, seen)
					}
				}
			case "partition and healing", "slow peer", "peer dropping packets":
				// A failing peer is pushed to at every tick: the first push
				// after the heal leaves within a tick, and reaches the peer
				// after the new connection's handshake (HELLO, a round trip)
				// and the one-way delay (docs/regions.md). On a loaded
				// machine each of seven steps may wait for a core: the
				// syncer's tick, its read of the region's counts (a round
				// trip to the region's Redis, as a decision is), the push's
				// start and its dial through the link, the handshake's two
				// crossings, the push's crossing and the poll that sees its
				// count (another round trip). (A link that was slow or
				// dropping still delivers what it held, late; the pushes
				// after the heal leave on other connections.)
				d := sim.Links[regiontest.USEast1][regiontest.APSoutheast1].Delay()
				lim := q.tick + 3*d + pollEvery + 7*res.healSlow
				if res.converge < 0 || res.converge > lim {
					t.Errorf("converged %v after healing, want within %v (the slowest step meanwhile took %v)", res.converge, lim, res.healSlow)
				}
			default:
				// A region denies a request only once the counts it knows
				// reach the limit, which they never pass while no peer is
				// counted as its share (a hold time of failed pushes).
				if res.down {
					t.Logf("a peer was counted as its share: admitting the limit is not guaranteed")
				} else if res.max < q.limit {
					t.Errorf("at most %d admitted in a window with more than the limit %d offered", res.max, q.limit)
				}
			}
		})
	}
	t.Run("per-region counters admit N x the load", func(t *testing.T) {
		res := runScenario(t, sim, scenarios(p.window)[0], perRegion, p)
		if res.max != 120 {
			t.Errorf("per-region counters admitted %v per window, want 120 of 100 (40 in each region)", res.perWindow)
		}
	})
	t.Run("global_strict admits exactly the limit", func(t *testing.T) {
		res := runScenario(t, sim, scenarios(p.window)[0], strict, p)
		for i, n := range res.perWindow {
			if n != p.limit {
				t.Errorf("window %d: global_strict admitted %d, want exactly %d", i, n, p.limit)
			}
		}
	})
}
