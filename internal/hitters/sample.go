package hitters

import (
	"math"
	"math/bits"
	"sync/atomic"
)

// Sampling.
//
// A request does not put every event in the ring: each rule and kind has
// a Gate that lets an event of u units through with probability
// min(1, u/z), z being the gate's threshold, and a sampled event then
// counts max(u, z) units (threshold sampling: Duffield, Lund and Thorup,
// "Learn more, sample less", 2001). Every client's count is then an
// unbiased estimate of its true units, each event adds at most z to it
// at random, and the number of events sampled is about the rule's units
// over z. The drainer sets z, for each rule and kind, so that about
// Config.Samples events a second are sampled: z is 1 (every event counted,
// exactly) while a rule sees fewer, and grows with its traffic. What
// tracking costs is then bounded, whatever the load: about Samples × the
// cost of one event (its trip through the ring and the summary) a second
// per rule and kind, and a few nanoseconds per decision to draw the
// sample.
//
// The bounds this gives are in Bounds (per client) and in the package
// middleware's TopConfig (who is listed).

// DefaultSamples is how many events a second, per rule and kind, the
// gates aim to sample unless Config.Samples says.
const DefaultSamples = 1000

// maxThreshold bounds a gate's threshold.
const maxThreshold = 1 << 40

// Gates are a rule's sampling gates, one per kind. A request reads them
// and draws; only the drainer writes them.
type Gates struct {
	g [numKinds]atomic.Pointer[threshold]
}

// threshold is a gate's threshold z and ⌊(2^64−1)/z⌋, so that a draw
// needs no division.
type threshold struct {
	z, inv uint64
}

// every is the threshold that lets every event through.
var every = &threshold{z: 1, inv: math.MaxUint64}

func newThreshold(z uint64) *threshold {
	if z <= 1 {
		return every
	}
	return &threshold{z: z, inv: math.MaxUint64 / z}
}

func newGates() *Gates {
	g := &Gates{}
	for k := range g.g {
		g.g[k].Store(every)
	}
	return g
}

// Threshold returns the threshold of kind's gate: 1 while every event is
// counted.
func (g *Gates) Threshold(kind Kind) uint64 { return g.g[kind].Load().z }

// Sample is a sampled event: the units and requests it stands for.
type Sample struct {
	// Units is what the event counts: max(u, z) for an event of u units.
	Units uint64
	// Requests is how many requests it stands for: max(1, z/u), rounded.
	Requests uint64
}

// Draw decides whether an event of units goes through kind's gate, and
// what it then counts. It allocates nothing and takes no lock: a pointer
// load, a multiplication and a draw from r. Events of no units are never
// sampled (they count nothing).
func (g *Gates) Draw(r *Rand, kind Kind, units int64) (Sample, bool) {
	if units <= 0 {
		return Sample{}, false
	}
	th := g.g[kind].Load()
	u := uint64(units)
	if u >= th.z {
		return Sample{Units: u, Requests: 1}, true
	}
	// p = u/z, as u·⌊(2^64−1)/z⌋ / 2^64: below it by less than u/2^64.
	if r.Uint64() >= u*th.inv {
		return Sample{}, false
	}
	return Sample{Units: th.z, Requests: (th.z + u/2) / u}, true
}

// Rand is a producer's source of draws (wyrand): one per request scratch,
// so that producers share no state. The zero value is a valid source; Seed
// spreads producers apart.
type Rand struct{ s uint64 }

var seeds atomic.Uint64

// Seed gives r a state of its own.
func (r *Rand) Seed() {
	r.s = mix(seeds.Add(0x9e3779b97f4a7c15))
}

// Uint64 returns the next draw.
func (r *Rand) Uint64() uint64 {
	r.s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(r.s, r.s^0xe7037ed1a0b428db)
	return hi ^ lo
}

func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	return x ^ x>>33
}

// rate is what the drainer saw through one gate since it last set the
// threshold: the units the sampled events stand for and how many they
// were.
type rate struct {
	since   int64 // Unix ms
	units   uint64
	samples uint64
}

// adaptEvery is how long the drainer counts before it sets a threshold
// anew, unless a quarter of a second's samples came first (a burst).
const adaptEvery = 1000

// nextThreshold is the threshold that would have sampled about target
// events a second from units (as the sampled events stand for them)
// counted over elapsed ms: z = units / (target × seconds), at least 1.
func nextThreshold(units uint64, elapsed int64, target int) uint64 {
	if elapsed < 1 {
		elapsed = 1
	}
	z := math.Ceil(float64(units) * 1000 / (float64(elapsed) * float64(target)))
	switch {
	case z <= 1:
		return 1
	case z >= maxThreshold:
		return maxThreshold
	}
	return uint64(z)
}

// due reports whether the drainer should set the threshold at now: a
// second has passed, or a quarter second's worth of samples came.
func (r *rate) due(now int64, target int) bool {
	return now-r.since >= adaptEvery || r.samples*4 >= uint64(target)
}

// Bounds returns an interval that holds the true units of a client whose
// sampled count lies in [lo, hi] (as a summary reports it), under
// threshold sampling with a threshold of at most z, with probability at
// least 1 − delta: each side fails with probability at most delta/2. With
// z = 1 (every event counted) it is [lo, hi] itself.
//
// Sampled with threshold z, a client of true units C has a count X that
// is a sum of independent terms in [0, z] with mean C and variance at
// most zC, so (Chernoff–Bernstein) P(X ≤ C − t) ≤ exp(−t²/(2zC)) and
// P(X ≥ C + t) ≤ exp(−t²/(2z(C + t/3))). With a = ln(2/delta), the
// first gives C ≤ (√(2za) + √(2za + 4X))²/4, and the second C ≥ X −
// za/3 − √((za/3)² + 2zaX), evaluated at X = hi and X = lo.
func Bounds(lo, hi, z uint64, delta float64) (uint64, uint64) {
	if z <= 1 || delta <= 0 || delta >= 1 {
		return lo, hi
	}
	a := math.Log(2 / delta)
	za := float64(z) * a
	r := math.Sqrt(2*za) + math.Sqrt(2*za+4*float64(hi))
	up := math.Ceil(r * r / 4)
	down := float64(lo) - za/3 - math.Sqrt(za*za/9+2*za*float64(lo))
	outLo := uint64(0)
	if down > 0 {
		outLo = uint64(math.Floor(down))
	}
	outHi := uint64(math.MaxUint64)
	if up < float64(math.MaxUint64) {
		outHi = uint64(up)
	}
	return outLo, outHi
}

// peaks counts samples and keeps the largest threshold in consecutive
// intervals of span ms, the last n of them: what a period's counts were
// made of.
type peaks struct {
	span  int64
	slots []peak
}

type peak struct {
	start   int64 // -1 when unused
	samples uint64
	z       uint64
}

func newPeaks(span int64, n int) *peaks {
	p := &peaks{span: span, slots: make([]peak, n)}
	for i := range p.slots {
		p.slots[i].start = -1
	}
	return p
}

// add counts samples under threshold z at now.
func (p *peaks) add(now int64, samples, z uint64) {
	start := now - now%p.span
	s := &p.slots[int(start/p.span)%len(p.slots)]
	if s.start != start {
		if start < s.start {
			return // older than the slot's interval
		}
		*s = peak{start: start}
	}
	s.samples += samples
	s.z = max(s.z, z)
}

// sum returns the samples and the largest threshold of the intervals up
// to the one of now.
func (p *peaks) sum(now int64) (samples, z uint64) {
	cur := now - now%p.span
	for _, s := range p.slots {
		if s.start >= 0 && s.start <= cur && s.start > cur-int64(len(p.slots))*p.span {
			samples += s.samples
			z = max(z, s.z)
		}
	}
	return samples, z
}
