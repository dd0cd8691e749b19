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
// direct call is not made then (see tryDirect): its caller would read
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
