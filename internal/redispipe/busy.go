package redispipe

import (
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// busyEvery is how often processBusy reads the scheduler's figures.
const busyEvery = time.Millisecond

// busy is what processBusy last read.
var busy struct {
	at   atomic.Int64 // when, in Unix nanoseconds
	busy atomic.Bool

	mu     sync.Mutex
	sample [1]metrics.Sample
}

// processBusy reports whether more goroutines of this process wait for a
// processor than there are processors, as read at most busyEvery ago. A
// direct call is not made then (see directLocked): its caller would read
// the reply only after its turn, which may come after the call's short
// deadline although the reply came at once. It is false where the
// runtime does not count runnable goroutines (before Go 1.26).
func processBusy(now time.Time) bool {
	t := now.UnixNano()
	last := busy.at.Load()
	if t-last < int64(busyEvery) || !busy.at.CompareAndSwap(last, t) {
		return busy.busy.Load()
	}
	busy.mu.Lock()
	defer busy.mu.Unlock()
	s := &busy.sample[0]
	s.Name = "/sched/goroutines/runnable:goroutines"
	metrics.Read(busy.sample[:])
	b := s.Value.Kind() == metrics.KindUint64 && s.Value.Uint64() > uint64(runtime.GOMAXPROCS(0))
	busy.busy.Store(b)
	return b
}

// lagWindow is how long processLag remembers a scheduling latency.
const lagWindow = 100 * time.Millisecond

// lagged is what processLag reads and remembers.
var lagged struct {
	at   atomic.Int64 // of the latest read, in Unix nanoseconds
	last atomic.Int64 // the lag it found, in nanoseconds

	mu     sync.Mutex
	sample [1]metrics.Sample
	counts []uint64 // of the histogram at the latest read
	// worst is the longest latency seen since windowAt, and before the
	// longest in the window before it.
	worst, before time.Duration
	windowAt      time.Time
}

// processLag returns how long goroutines of this process have lately
// waited to run once runnable: the longest scheduling latency the runtime
// recorded in the last lagWindow or two, as read at most busyEvery ago,
// or zero where the runtime does not record them. It is this process's
// own scheduling lag, which a call may wait past its deadline when its
// server's answer is not known yet (see dest.overrun). The lanes have it
// read as their batches end, every lagRefresh at most (refreshLag), so
// that it is current when a deadline asks.
func processLag(now time.Time) time.Duration {
	t := now.UnixNano()
	last := lagged.at.Load()
	if t-last < int64(busyEvery) || !lagged.at.CompareAndSwap(last, t) {
		return time.Duration(lagged.last.Load())
	}
	lagged.mu.Lock()
	defer lagged.mu.Unlock()
	if gap := now.Sub(lagged.windowAt); gap >= lagWindow {
		lagged.before = lagged.worst
		if gap >= 2*lagWindow {
			lagged.before = 0
		}
		lagged.worst, lagged.windowAt = 0, now
	}
	s := &lagged.sample[0]
	s.Name = "/sched/latencies:seconds"
	metrics.Read(lagged.sample[:])
	if s.Value.Kind() != metrics.KindFloat64Histogram {
		return 0
	}
	h := s.Value.Float64Histogram()
	if len(lagged.counts) == len(h.Counts) && time.Duration(t-last) < lagWindow {
		// The longest latency recorded since the last read, fresh enough
		// to count as lately: the lower bound of the highest bucket that
		// grew.
		for i := len(h.Counts) - 1; i > 0; i-- {
			if h.Counts[i] > lagged.counts[i] {
				lagged.worst = max(lagged.worst, time.Duration(h.Buckets[i]*float64(time.Second)))
				break
			}
		}
	}
	lagged.counts = append(lagged.counts[:0], h.Counts...)
	lag := max(lagged.worst, lagged.before)
	lagged.last.Store(int64(lag))
	return lag
}

// lagRefresh is how often the lanes have processLag read the runtime's
// figures (see refreshLag): often enough to keep its window current,
// seldom enough that a busy destination's batches do not pay for a read
// each millisecond.
const lagRefresh = 10 * time.Millisecond

// refreshLag has processLag read the runtime's figures unless it did less
// than lagRefresh before now, so that the lag a deadline asks for (see
// dest.overrun) counts the latencies of its last lagWindow or two.
func refreshLag(now time.Time) {
	if now.UnixNano()-lagged.at.Load() >= int64(lagRefresh) {
		processLag(now)
	}
}

// OverrunAllowance is how long past its deadline, beyond overrunSlack, a
// call that waits for a verification's verdict may be held at now (see
// dest.overrun): this process's scheduling lag (processLag), twice over
// when it is past starvedLag. Tests that bound how long a call may take
// read the same figure the calls go by.
func OverrunAllowance(now time.Time) time.Duration {
	lag := processLag(now)
	if lag > starvedLag {
		return 2 * lag
	}
	return lag
}
