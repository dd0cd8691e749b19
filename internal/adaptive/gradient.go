// Package adaptive holds the capacity signal of one app server as pure
// math with an explicit now: a gradient controller that computes a
// concurrency limit from the latencies it is fed (Gradient), the spare
// capacity that follows from it, the factor by which elastic limits open
// towards their ceilings (Elastic), and the order in which requests of
// different priorities are shed (Shedder). Nothing here reads a clock,
// starts a goroutine or locks: callers serialize calls and pass the time.
package adaptive

import (
	"math"
	"slices"
	"time"
)

// Config configures a Gradient. Zero fields take the defaults given.
type Config struct {
	// Min and Max bound the concurrency limit. Min must be at least 1 and
	// Max at least Min.
	Min, Max int
	// Initial is the limit before any sample; 0 means Min.
	Initial int
	// Window is how long samples are gathered before the limit is
	// recomputed; 0 means 100ms.
	Window time.Duration
	// MinSamples is how many samples a window needs for the limit to move;
	// 0 means 10. A window with fewer is extended, up to ten Windows, and
	// then dropped without moving the limit.
	MinSamples int
	// Percentile of a window's latencies taken as its latency; 0 means
	// 0.5 (the median), as Envoy's adaptive concurrency filter does.
	Percentile float64
	// Buffer is how far above the minimum latency the latency may be
	// before the limit is cut, as a fraction of the minimum; 0 means 0.25.
	Buffer float64
	// ProbeEvery is how often the minimum latency is measured afresh: the
	// limit is held at Min while ProbeSamples latencies are taken, and
	// their median becomes the minimum; 0 means 30s.
	ProbeEvery time.Duration
	// ProbeSamples is how many samples a probe takes; 0 means 25.
	ProbeSamples int
	// CPULimit is the CPU use (see ObserveCPU) at and above which the
	// limit does not grow and nothing is spare; 0 means 0.9. Below it,
	// the spare capacity is at most the share of it still unused,
	// (CPULimit - cpu) / CPULimit.
	CPULimit float64
}

func (c *Config) defaults() {
	if c.Initial == 0 {
		c.Initial = c.Min
	}
	if c.Window == 0 {
		c.Window = 100 * time.Millisecond
	}
	if c.MinSamples == 0 {
		c.MinSamples = 10
	}
	if c.Percentile == 0 {
		c.Percentile = 0.5
	}
	if c.Buffer == 0 {
		c.Buffer = 0.25
	}
	if c.ProbeEvery == 0 {
		c.ProbeEvery = 30 * time.Second
	}
	if c.ProbeSamples == 0 {
		c.ProbeSamples = 25
	}
	if c.CPULimit == 0 {
		c.CPULimit = 0.9
	}
}

// maxSamples bounds the samples one window keeps; later ones replace
// earlier ones in turn, which keeps the percentile representative.
const maxSamples = 512

// Gradient is a concurrency limit computed from latency, after Envoy's
// adaptive concurrency filter and Netflix's Gradient2: every Window the
// latency of the window (its Percentile) is compared with the minimum
// latency,
//
//	gradient = clamp((minRTT · (1 + Buffer)) / latency, 0.5, 2)
//	limit    = clamp(limit · gradient + √limit, Min, Max)
//
// so the limit grows while latency stays near the minimum and is cut as
// soon as requests queue. It grows only when the window used at least
// half of it (a limit nobody reaches says nothing about capacity). The
// minimum latency is taken on the first samples and again every
// ProbeEvery, with the limit held at Min meanwhile so that the probe sees
// the service unloaded; a window faster than the minimum lowers it at
// once.
//
// A Gradient is not safe for concurrent use.
type Gradient struct {
	cfg   Config
	limit float64
	// minRTT is the minimum latency, 0 until the first probe ends.
	minRTT time.Duration
	// latency is the last window's latency.
	latency time.Duration

	inflight int
	peak     int     // most in flight during the window
	area     float64 // in-flight count integrated over the window, in ns
	last     time.Time

	winStart time.Time
	samples  []time.Duration
	seen     int // samples fed this window

	probing   bool
	probeAt   time.Time // when the next probe begins
	saved     float64   // the limit before the probe
	probeRTTs []time.Duration

	spare float64
	cpu   float64 // the last CPU reading, -1 for none
}

// New returns a Gradient that starts at now. It panics if Min < 1 or
// Max < Min: callers validate configuration first.
func New(cfg Config, now time.Time) *Gradient {
	cfg.defaults()
	if cfg.Min < 1 || cfg.Max < cfg.Min {
		panic("adaptive: need 1 <= Min <= Max")
	}
	g := &Gradient{cfg: cfg, winStart: now, last: now, spare: 1, cpu: -1}
	g.limit = float64(min(max(cfg.Initial, cfg.Min), cfg.Max))
	g.saved = g.limit
	g.probing = true // the first samples measure the minimum
	return g
}

// Limit returns the concurrency limit in force.
func (g *Gradient) Limit() int {
	if g.probing && g.minRTT > 0 {
		return g.cfg.Min
	}
	return int(g.limit)
}

// InFlight returns how many requests are in flight.
func (g *Gradient) InFlight() int { return g.inflight }

// MinLatency returns the minimum latency measured, 0 before the first
// probe ends.
func (g *Gradient) MinLatency() time.Duration { return g.minRTT }

// Latency returns the latency of the last window that moved the limit.
func (g *Gradient) Latency() time.Duration { return g.latency }

// Spare returns the share of the limit left unused over the last window,
// in [0, 1]: 1 - (mean in flight / limit), and 0 when the window's latency
// was above the minimum plus Buffer (requests queue: nothing is spare);
// with a CPU reading, at most (CPULimit - cpu) / CPULimit. It is never
// more than the share of the limit unused at the moment, so that a burst
// of requests that have not ended yet counts at once.
func (g *Gradient) Spare() float64 {
	now := 1 - float64(g.inflight)/float64(g.Limit())
	return min(g.spare, max(now, 0))
}

// ObserveCPU records the CPU use, in [0, 1] of the machine's capacity,
// for the windows that close from now on.
func (g *Gradient) ObserveCPU(cpu float64) { g.cpu = cpu }

// Start records that a request began at now.
func (g *Gradient) Start(now time.Time) {
	g.Advance(now)
	g.inflight++
	g.peak = max(g.peak, g.inflight)
}

// End records that a request that began before now ended at now, after
// latency. A request that failed without being served (dropped, timed
// out before it started) should pass sample false: it leaves the
// in-flight count but is no latency sample.
func (g *Gradient) End(now time.Time, latency time.Duration, sample bool) {
	g.Advance(now)
	if g.inflight > 0 {
		g.inflight--
	}
	if !sample || latency <= 0 {
		return
	}
	if g.probing {
		g.probeRTTs = append(g.probeRTTs, latency)
		if len(g.probeRTTs) >= g.cfg.ProbeSamples {
			g.endProbe(now)
		}
		return
	}
	g.seen++
	if len(g.samples) < maxSamples {
		g.samples = append(g.samples, latency)
	} else {
		g.samples[g.seen%maxSamples] = latency
	}
}

// Advance moves the controller to now: it integrates the in-flight count
// and closes the window if it is due. Start and End call it; call it
// before reading Limit or Spare at an instant without requests.
func (g *Gradient) Advance(now time.Time) {
	if now.Before(g.last) {
		now = g.last // the clock went back: time stands still
	}
	g.area += float64(g.inflight) * float64(now.Sub(g.last))
	g.last = now
	if g.probing {
		return
	}
	if !g.probeAt.IsZero() && !now.Before(g.probeAt) {
		g.probing, g.saved, g.probeRTTs = true, g.limit, g.probeRTTs[:0]
		g.resetWindow(now)
		return
	}
	span := now.Sub(g.winStart)
	if span < g.cfg.Window {
		return
	}
	if g.seen < g.cfg.MinSamples && span < 10*g.cfg.Window {
		return
	}
	g.closeWindow(span)
	g.resetWindow(now)
}

func (g *Gradient) resetWindow(now time.Time) {
	g.winStart, g.area, g.peak = now, 0, g.inflight
	g.samples, g.seen = g.samples[:0], 0
}

func (g *Gradient) endProbe(now time.Time) {
	slices.Sort(g.probeRTTs)
	m := g.probeRTTs[len(g.probeRTTs)/2]
	if g.minRTT == 0 {
		g.minRTT = m
	} else {
		// A fresh measure replaces the old one: the service may have
		// become slower for good.
		g.minRTT = m
		g.limit = g.saved
	}
	g.probing = false
	g.probeAt = now.Add(g.cfg.ProbeEvery)
	g.resetWindow(now)
}

// closeWindow recomputes the limit and the spare from a window of span.
func (g *Gradient) closeWindow(span time.Duration) {
	mean := g.area / float64(span)
	limit := g.limit
	if g.seen >= g.cfg.MinSamples {
		slices.Sort(g.samples)
		i := int(math.Ceil(g.cfg.Percentile*float64(len(g.samples)))) - 1
		rtt := g.samples[min(max(i, 0), len(g.samples)-1)]
		g.latency = rtt
		if rtt < g.minRTT {
			g.minRTT = rtt
		}
		target := float64(g.minRTT) * (1 + g.cfg.Buffer)
		grad := min(max(target/float64(rtt), 0.5), 2)
		next := limit*grad + math.Sqrt(limit)
		if next > limit && (float64(g.peak) < limit/2 || g.cpu >= g.cfg.CPULimit) {
			// App-limited, no evidence that more would do; or the CPU
			// is the bottleneck.
			next = limit
		}
		g.limit = min(max(next, float64(g.cfg.Min)), float64(g.cfg.Max))
		if float64(rtt) > target {
			g.spare = 0
			return
		}
	}
	g.spare = min(max(1-mean/g.limit, 0), 1)
	if g.cpu >= 0 {
		g.spare = min(g.spare, max(g.cfg.CPULimit-g.cpu, 0)/g.cfg.CPULimit)
	}
}
