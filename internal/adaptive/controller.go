package adaptive

import (
	"sync"
	"time"
)

// cpuEvery is how often a Controller reads the CPU: at most once per
// this interval of its own time.
const cpuEvery = 100 * time.Millisecond

// Figures are a Controller's readings at one instant: its limit, the
// requests in flight, the share of capacity unused, and the minimum and
// latest latencies.
type Figures struct {
	Limit, InFlight     int
	Spare               float64
	MinLatency, Latency time.Duration
}

// Controller is a Gradient and a Shedder behind one lock: the capacity
// signal of one adaptive concurrency rule, or of a whole process for
// elastic limits. It reads the CPU through the function it was given (nil:
// it does not) at most every 100 ms, and tells whether its figures moved
// since they were last reported, so that observers hear of each change
// once. It is safe for concurrent use.
type Controller struct {
	mu    sync.Mutex
	g     *Gradient
	shed  Shedder
	cfg   Config
	cpu   func() float64
	cpuAt time.Time
	// repLimit and repSpare are the limit and spare last reported.
	repLimit int
	repSpare float64
}

// NewController returns a Controller for cfg at now; cpu, when not nil,
// reads the process's CPU use in [0, 1] (see Gradient.ObserveCPU).
func NewController(cfg Config, cpu func() float64, now time.Time) *Controller {
	return &Controller{g: New(cfg, now), cfg: cfg, cpu: cpu, repSpare: -1}
}

// Config returns the configuration the Controller was made with.
func (c *Controller) Config() Config { return c.cfg }

// advance moves the controller to now; c.mu is held.
func (c *Controller) advance(now time.Time) {
	if c.cpu != nil && now.Sub(c.cpuAt) >= cpuEvery {
		c.cpuAt = now
		c.g.ObserveCPU(c.cpu())
	}
	c.g.Advance(now)
}

// figures returns the figures at the controller's instant; c.mu is held.
func (c *Controller) figures() Figures {
	return Figures{Limit: c.g.Limit(), InFlight: c.g.InFlight(), Spare: c.g.Spare(), MinLatency: c.g.MinLatency(), Latency: c.g.Latency()}
}

// changedLocked returns the figures and whether the limit or the spare
// moved since the last time it said so; c.mu is held.
func (c *Controller) changedLocked() (Figures, bool) {
	f := c.figures()
	if f.Limit == c.repLimit && f.Spare == c.repSpare {
		return f, false
	}
	c.repLimit, c.repSpare = f.Limit, f.Spare
	return f, true
}

// Admission is what Admit decided for one request.
type Admission struct {
	// Admitted reports whether the request took a place; Refused whether
	// the shedder refused it (a forced admission is both).
	Admitted, Refused bool
	// Threshold is the in-flight count below which requests of the
	// request's priority are admitted, and InFlight the count it found.
	Threshold, InFlight int
	// Figures are the controller's, and Changed reports that they moved
	// since last reported.
	Figures Figures
	Changed bool
}

// Admit moves the controller to now and asks its shedder whether a
// request of priority p may start: it may while fewer requests than p's
// threshold are in flight (see Shedder). A refused request is admitted all
// the same when force is set (a rule that only reports). An admitted
// request holds its place until End.
func (c *Controller) Admit(now time.Time, p Priority, force bool) Admission {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	limit, inflight := c.g.Limit(), c.g.InFlight()
	hard := c.cfg.Max
	ok := c.shed.Admit(now, p, inflight, limit, hard)
	a := Admission{Refused: !ok, Admitted: ok || force, InFlight: inflight, Threshold: Threshold(p, limit, hard)}
	if a.Admitted {
		c.g.Start(now)
	}
	a.Figures, a.Changed = c.changedLocked()
	return a
}

// Start counts a request that began at began in flight, without asking the
// shedder (the process's own signal measures every admitted request). It
// returns the figures and whether they moved since last reported.
func (c *Controller) Start(began time.Time) (Figures, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(began)
	c.g.Start(began)
	return c.changedLocked()
}

// End gives back the place of a request that ended at now after latency;
// sample says whether its latency is a sample of the service's (a request
// that was refused or gave up is not). It returns the figures and whether
// they moved since last reported.
func (c *Controller) End(now time.Time, latency time.Duration, sample bool) (Figures, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	c.g.End(now, latency, sample)
	return c.changedLocked()
}

// Figures moves the controller to now and returns its figures.
func (c *Controller) Figures(now time.Time) Figures {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advance(now)
	return c.figures()
}
