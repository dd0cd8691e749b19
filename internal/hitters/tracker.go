// Package hitters tracks who is being limited: for each rule, the clients
// charged and denied the most units over the last minute and the last
// hour (Space-Saving summaries of package topk), and the rule's allowed
// and denied requests over the last 15 minutes; with a Backend (the Redis
// store, whose top.lua keeps each server's summaries for a while), it
// publishes them for the fleet and merges the fleet's (Fleet), within the
// error bound that topk states for the merged summaries.
//
// Requests offer their events to their rule's sampling Gates (see
// sample.go), which let about Config.Samples a second through, each
// standing for the events it was drawn among; the sampled events go into a
// lock-free Ring (NoteSample): a few nanoseconds a decision, no lock, no
// allocation. One goroutine drains the ring into the summaries, every
// second and whenever a shard of the ring fills a quarter, and sets the
// gates' thresholds from what came through; readers drain it first, so
// that they see every event noted before they asked.
//
// Package middleware keeps the public face (WithTopClients,
// Limiter.TopClients, the admin handler's top and rates endpoints);
// docs/operations.md describes what an operator sees and the bound on a
// client's count.
package hitters

import (
	"math"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/topk"
)

// Period is a sliding period of the summaries.
type Period uint8

// The periods.
const (
	// Minute covers the last 60 to 70 seconds (6 buckets of 10 s and
	// the current one).
	Minute Period = iota
	// Hour covers the last 60 to 70 minutes (6 buckets of 10 min and the
	// current one).
	Hour
	numPeriods
)

// String returns "1m" or "1h".
func (p Period) String() string {
	if p == Hour {
		return "1h"
	}
	return "1m"
}

// The shape of the periods and of the rate series.
const (
	periodBuckets = 6
	// RateSpan is the interval of the rate series, RatePoints how many it
	// keeps: 15 minutes.
	RateSpan   = 10_000
	RatePoints = 90
)

var periodSpan = [numPeriods]int64{Minute: 10_000, Hour: 600_000}

// hourRatio is how many buckets of the minute make one of the hour.
const hourRatio = 60

// DefaultK is the number of counters of each summary unless a rule says.
const DefaultK = 100

// Config configures a Tracker.
type Config struct {
	// K is the number of counters of each summary of a rule that does not
	// set its own (DefaultK if 0).
	K int
	// Now returns the current time in Unix ms (time.Now if nil).
	Now func() int64
	// Every is how often the drainer runs without being woken (1 s if 0):
	// an event is counted at the instant it is drained, so this bounds
	// how late it may be counted (readers drain first, and requests wake
	// the drainer as the ring fills).
	Every time.Duration
	// Fleet, if set, publishes the summaries and reads the fleet's.
	Fleet *FleetConfig
	// Samples is how many events a second each rule's gates aim to let
	// through, per kind (DefaultSamples if 0): below that every event is
	// counted; above, events are sampled (see Gates). Less than 0 turns
	// sampling off: every event Noted or Drawn is counted, whatever the
	// load.
	Samples int
}

// Tracker tracks the heavy hitters and rates of a limiter's rules. Make
// one with New; Close stops it.
type Tracker struct {
	ring *Ring
	cfg  Config
	now  func() int64

	mu    sync.Mutex
	rules map[string]*ruleState
	// drops counts the units dropped on full shards per interval, for the
	// periods' error (Minute and Hour).
	drops       [numPeriods]*Series
	seenDropped uint64
	// published is when each rule was last published, and how it went;
	// pubMu makes publishes one at a time.
	pub   pubState
	pubMu sync.Mutex
	// drain is the state of a drain, and each its function of an event.
	drain drainRun
	each  DrainFunc

	stop chan struct{}
	done sync.WaitGroup
	once sync.Once
}

type ruleState struct {
	k       int
	windows [numKinds]*topk.Window // both periods
	rates   *Series
	// gates sample the rule's events; seen is what came through each
	// since its threshold was last set, and sampled what was sampled in
	// each period, with the largest threshold in force.
	gates   *Gates
	seen    [numKinds]rate
	sampled [numKinds][numPeriods]*peaks
	// counted counts the events drained into the summaries, and
	// published what it was at the last publish.
	counted, published uint64
}

// New returns a Tracker and starts its drainer (and, with cfg.Fleet, its
// publisher).
func New(cfg Config) *Tracker {
	if cfg.K == 0 {
		cfg.K = DefaultK
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.Samples == 0 {
		cfg.Samples = DefaultSamples
	}
	t := &Tracker{ring: NewRing(), cfg: cfg, now: cfg.Now, rules: map[string]*ruleState{}, stop: make(chan struct{})}
	t.ring.Help = t.help
	t.each = t.event
	if t.now == nil {
		t.now = func() int64 { return time.Now().UnixMilli() }
	}
	for p := range numPeriods {
		t.drops[p] = NewSeries(periodSpan[p], periodBuckets+1)
	}
	t.done.Add(1)
	go t.drainLoop()
	if cfg.Fleet != nil {
		t.startFleet()
	}
	return t
}

// Close stops the drainer and the publisher; it is idempotent.
func (t *Tracker) Close() {
	t.once.Do(func() {
		close(t.stop)
		t.done.Wait()
	})
}

// Shard returns the shard of the ring a producer should keep (see
// Ring.Shard).
func (t *Tracker) Shard() uint32 { return t.ring.Shard() }

// Note records that key was charged (or denied) units under rule, by one
// request, counted as it is (not sampled): no lock, no allocation. rule
// must never change (a rule's name).
func (t *Tracker) Note(shard uint32, rule, key string, units int64, kind Kind) {
	t.ring.Put(shard, rule, key, units, kind)
}

// NoteSample records an event that went through its rule's gate (see
// Gates.Draw): what a request does for each rule it was charged (or
// denied) under, when the draw samples it.
func (t *Tracker) NoteSample(shard uint32, rule, key string, s Sample, kind Kind) {
	t.ring.PutN(shard, rule, key, int64(min(s.Units, math.MaxInt64)), s.Requests, kind)
}

// Gates returns the sampling gates of rule, nil for a rule not tracked.
// A rule's gates stay the same while SetRules keeps it.
func (t *Tracker) Gates(rule string) *Gates {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rs := t.rules[rule]; rs != nil {
		return rs.gates
	}
	return nil
}

// SetRules sets the rules tracked and the k of each: 0 for Config.K, less
// than 0 for rates only. Rules not listed are forgotten.
func (t *Tracker) SetRules(ks map[string]int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for name, rs := range t.rules {
		if k, ok := ks[name]; !ok || t.kOf(k) != rs.k {
			delete(t.rules, name)
		}
	}
	for name, k := range ks {
		if _, ok := t.rules[name]; !ok {
			t.rules[name] = t.newRule(t.kOf(k))
		}
	}
}

func (t *Tracker) kOf(k int) int {
	switch {
	case k == 0:
		return t.cfg.K
	case k < 2:
		return 0 // rates only
	}
	return k
}

func (t *Tracker) newRule(k int) *ruleState {
	rs := &ruleState{k: k, rates: NewSeries(RateSpan, RatePoints), gates: newGates()}
	now := t.now()
	for kind := range numKinds {
		rs.seen[kind].since = now
		for p := range numPeriods {
			rs.sampled[kind][p] = newPeaks(periodSpan[p], periodBuckets+1)
		}
	}
	if k > 0 {
		for kind := range numKinds {
			rs.windows[kind] = topk.NewWindow(k, periodBuckets, periodSpan[Minute], hourRatio)
		}
	}
	return rs
}

// drainLoop runs the drainer: every cfg.Every, and when a request wakes
// it. With sampling on, its first runs come sooner (Every/64, doubling up
// to Every: seven more in the first second), so that the gates leave
// counting every event within milliseconds of a burst at start: the
// events of one client in a row fill no ring, and would otherwise be
// counted one by one until the first tick.
func (t *Tracker) drainLoop() {
	defer t.done.Done()
	every := t.cfg.Every
	if t.cfg.Samples > 0 {
		every = max(t.cfg.Every/64, time.Millisecond)
	}
	tick := time.NewTimer(every)
	defer tick.Stop()
	trimmed := t.now()
	for {
		select {
		case <-t.stop:
			return
		case <-tick.C:
			every = min(2*every, t.cfg.Every)
			tick.Reset(every)
		case <-t.ring.Wake():
		}
		t.mu.Lock()
		now := t.drainLocked()
		if now-trimmed > periodSpan[Minute] {
			t.trimLocked(now)
			trimmed = now
		}
		t.mu.Unlock()
	}
}

// help drains a full shard for a request, unless the summaries are busy
// (the drainer or a reader holds them): the request never waits.
func (t *Tracker) help(shard uint32) bool {
	if !t.mu.TryLock() {
		return false
	}
	t.drainShardLocked(shard)
	t.mu.Unlock()
	return true
}

// drainLocked moves the ring's events into the summaries and returns the
// instant it counted them at.
func (t *Tracker) drainLocked() int64 { return t.drainShardLocked(0) }

// drainShardLocked is drainLocked for one shard of the ring (0: all). A
// run of events of one rule, kind and key (a burst from one client) is
// counted as one.
func (t *Tracker) drainShardLocked(shard uint32) int64 {
	now := t.now()
	d := &t.drain
	d.now, d.pending = now, false
	if shard == 0 {
		t.ring.Drain(t.each)
	} else {
		t.ring.DrainShard(shard, t.each)
	}
	d.flush()
	d.rs, d.rule = nil, ""
	if t.cfg.Samples > 0 {
		t.adaptLocked(now)
	}
	if _, units := t.ring.Dropped(); units != t.seenDropped {
		for p := range numPeriods {
			t.drops[p].Add(Charged, units-t.seenDropped, now)
		}
		t.seenDropped = units
	}
	return now
}

// drainRun is the run of like events a drain is adding up: one rule, kind
// and key. Its buffer is reused, so that draining allocates nothing.
type drainRun struct {
	now     int64
	rs      *ruleState // nil for a rule replaced since
	rule    string
	key     []byte
	kind    Kind
	units   uint64
	reqs    uint64
	events  uint64
	pending bool
}

// event adds one event of the ring to the run, or counts the run and
// starts another; t.each is it, made once.
func (t *Tracker) event(r string, k []byte, u int64, q uint64, n uint32, kd Kind) {
	d := &t.drain
	if d.pending && r == d.rule && kd == d.kind && string(k) == string(d.key) {
		d.units += uint64(max(u, 0))
		d.reqs += q
		d.events += uint64(n)
		return
	}
	d.flush()
	if r != d.rule {
		d.rule, d.rs = r, t.rules[r]
	}
	d.key, d.kind, d.units, d.reqs, d.events, d.pending = append(d.key[:0], k...), kd, uint64(max(u, 0)), q, uint64(n), true
}

// flush counts the run.
func (d *drainRun) flush() {
	if !d.pending || d.rs == nil {
		return
	}
	rs := d.rs
	rs.rates.AddN(d.kind, d.reqs, d.units, d.now)
	rs.counted += d.events
	seen := &rs.seen[d.kind]
	seen.units += d.units
	seen.samples += d.events
	if rs.k > 0 {
		rs.windows[d.kind].Add(d.key, d.units, d.now)
		for p := range numPeriods {
			rs.sampled[d.kind][p].add(d.now, d.events, rs.gates.Threshold(d.kind))
		}
	}
	d.pending = false
}

// adaptLocked sets the threshold of every gate that is due (see rate.due)
// so that it would have sampled about Config.Samples events a second of
// what came through it. The periods where the threshold changes note the
// larger of the two: events still in the ring were sampled under the old.
func (t *Tracker) adaptLocked(now int64) {
	target := t.cfg.Samples
	for _, rs := range t.rules {
		for kind := range numKinds {
			seen := &rs.seen[kind]
			if !seen.due(now, target) {
				continue
			}
			old := rs.gates.Threshold(kind)
			z := nextThreshold(seen.units, now-seen.since, target)
			if z != old {
				rs.gates.g[kind].Store(newThreshold(z))
				if rs.k > 0 {
					for p := range numPeriods {
						rs.sampled[kind][p].add(now, 0, max(z, old))
					}
				}
			}
			*seen = rate{since: now}
		}
	}
}

func (t *Tracker) trimLocked(now int64) {
	for _, rs := range t.rules {
		for _, w := range rs.windows {
			if w != nil {
				w.Trim(now)
			}
		}
	}
}

// Local is what one server knows of a rule's clients over a period.
type Local struct {
	topk.View
	// Dropped is the units of every rule that went uncounted in the
	// period because the ring was full: each count may be short by that
	// much.
	Dropped uint64
	// Samples is how many events the view's counts were made of, and
	// Threshold the largest sampling threshold in force over the period
	// (1 when every event was counted: the counts are then exact but for
	// the summary's error). See Bounds.
	Samples, Threshold uint64
	// At is the instant of the view (Unix ms).
	At int64
}

// Top returns the view of rule's clients by kind over period, after
// draining what requests noted; ok is false for a rule not tracked (or
// tracked for rates only).
func (t *Tracker) Top(rule string, kind Kind, p Period) (Local, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.drainLocked()
	rs := t.rules[rule]
	if rs == nil || rs.k == 0 {
		return Local{}, false
	}
	samples, z := rs.sampled[kind][p].sum(now)
	return Local{View: rs.windows[kind].View(now, p == Hour), Dropped: t.drops[p].Sum(now).AllowedUnits,
		Samples: samples, Threshold: max(z, 1), At: now}, true
}

// K returns the number of counters of rule's summaries, 0 if it has none.
func (t *Tracker) K(rule string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if rs := t.rules[rule]; rs != nil {
		return rs.k
	}
	return 0
}

// Rates returns the allowed and denied requests of each rule in the
// intervals of the last 15 minutes, oldest first.
func (t *Tracker) Rates() map[string][]Point {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.drainLocked()
	out := make(map[string][]Point, len(t.rules))
	for name, rs := range t.rules {
		out[name] = rs.rates.Points(now)
	}
	return out
}

// Keys returns how many keys the summaries of every rule hold in all:
// at most rules × 2 kinds × 7 buckets × (2k − 1).
func (t *Tracker) Keys() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, rs := range t.rules {
		for _, w := range rs.windows {
			if w != nil {
				n += w.Len()
			}
		}
	}
	return n
}
