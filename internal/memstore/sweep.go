package memstore

import (
	"runtime"
	"sync"
	"time"
)

// sweep drops the expired counters of sh, then gives back the memory they
// used (see compact), and returns how many it dropped. It walks from the
// last record down and releases sh.mu every sweepBatch records, so that
// Take waits for tens of microseconds rather than the milliseconds a full
// shard takes. Removing a record moves the last one, already examined,
// into its place, so the walk sees every record once; a record moved by
// an eviction while the lock is released may be missed until the next
// sweep.
//
// It also clamps the age of every counter it keeps to maxAge, so that the
// access clock may wrap between two sweeps without making old counters
// look new.
func (sh *shard) sweep(now int64) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	dropped, wideBefore := 0, len(sh.wide)
	for i, steps := sh.n-1, 0; i >= 0; i-- {
		if steps++; steps == sweepBatch {
			steps = 0
			sh.mu.Unlock()
			runtime.Gosched()
			sh.mu.Lock()
			if i >= sh.n {
				if i = sh.n - 1; i < 0 {
					break
				}
			}
		}
		if sh.expired(i, now) {
			sh.remove(i)
			dropped++
			continue
		}
		if r := sh.rec(i); sh.clock-r.access() > maxAge {
			r.setAccess(sh.clock - maxAge)
		}
	}
	sh.compact(wideBefore)
	return dropped
}

// sweep drops every counter that is expired at now and returns how many it
// dropped. The sweeper calls it; tests call it directly.
func (s *Store) sweep(now time.Time) int {
	return sweepShards(s.shards, now.UnixMilli())
}

func sweepShards(shards []shard, now int64) int {
	n := 0
	for i := range shards {
		n += shards[i].sweep(now)
	}
	return n
}

// stopper stops the sweeper once.
type stopper struct {
	once sync.Once
	stop chan struct{}
	done chan struct{}
}

func (st *stopper) signal() { st.once.Do(func() { close(st.stop) }) }

// sweepEvery sweeps shards every interval until st is signalled.
func sweepEvery(shards []shard, now func() time.Time, every time.Duration, st *stopper) {
	t := time.NewTicker(every)
	defer t.Stop()
	sweepLoop(shards, now, t.C, st)
}

// sweepLoop sweeps shards at every tick until st is signalled, then closes
// st.done.
func sweepLoop(shards []shard, now func() time.Time, tick <-chan time.Time, st *stopper) {
	defer close(st.done)
	for {
		select {
		case <-st.stop:
			return
		case <-tick:
			sweepShards(shards, now().UnixMilli())
		}
	}
}
