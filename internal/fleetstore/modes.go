package fleetstore

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/window"
)

// takeWriteBack decides charge c from the local view of its counter.
func (s *Store) takeWriteBack(ctx context.Context, ms, call int64, c *window.Charge, b *binding, out *window.Decision) (bool, error) {
	sh, id := s.locate(c)
	cost := int64(c.Cost)
	sh.mu.Lock()
	e := s.entryFor(sh, id, c, b)
	if e.synced == 0 || ms-e.synced > 2*b.interval {
		// Never synced, or not for two intervals: read the fleet's count
		// (pushing what is unsynced) before deciding.
		if s.failUntil.Load() <= ms {
			sh.mu.Unlock()
			s.push(ctx, sh, id, call, ms)
			sh.mu.Lock()
			e = s.entryFor(sh, id, c, b)
		}
	}
	v := e.view()
	at, ok := v.Take(&b.lim, ms, cost)
	e.setView(&v)
	e.used = ms
	if ok && cost > 0 {
		sh.enlist(id, e)
	}
	need := ok && v.Unsynced()+e.inflight >= b.maxUnsynced && s.failUntil.Load() <= ms
	sh.mu.Unlock()
	// Described from the copy, without the lock, which every decision on
	// the counter needs.
	*out = window.Describe(v.C, at, b.lim, cost, ok)
	if ok && cost > 0 {
		if fn := s.cfg.Events.Unsynced; fn != nil {
			fn(b.name, cost)
		}
	}
	if need {
		s.pushWaiting(ctx, sh, id, call, ms, b)
	}
	return ok, nil
}

// pushWaiting makes the unsynced counts of entry id durable before the
// request that brought them to max_unsynced is answered: one push at a
// time per counter, which carries whatever was counted while the last one
// was on its way; requests that reach the bound meanwhile wait for it.
func (s *Store) pushWaiting(ctx context.Context, sh *shard, id ident, call, ms int64, b *binding) {
	for {
		sh.mu.Lock()
		e, _ := sh.lookup(id)
		if e == nil || e.up+e.uc < b.maxUnsynced || s.failUntil.Load() > ms {
			// Pushed meanwhile (only what is in flight is unsynced), or
			// Redis fails: the syncer retries.
			sh.mu.Unlock()
			return
		}
		if e.flags&granting != 0 {
			ch := s.waitCh(sh, id)
			sh.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return
			}
		}
		e.flags |= granting
		sh.mu.Unlock()
		s.push(ctx, sh, id, call, ms)
		sh.mu.Lock()
		if e, _ := sh.lookup(id); e != nil {
			e.flags &^= granting
		}
		s.wake(sh, id)
		sh.mu.Unlock()
		return
	}
}

// waitCh returns the channel that wake closes for id. sh must be locked.
func (s *Store) waitCh(sh *shard, id ident) chan struct{} {
	if sh.waits == nil {
		sh.waits = map[ident]chan struct{}{}
	}
	ch, ok := sh.waits[id]
	if !ok {
		ch = make(chan struct{})
		sh.waits[id] = ch
	}
	return ch
}

// push sends the unsynced counts of entry id (possibly none: a read) and
// merges the fleet's count that comes back. A failure puts the counts
// back and spares requests from waiting for pushes for one interval.
func (s *Store) push(ctx context.Context, sh *shard, id ident, call, ms int64) error {
	sh.mu.Lock()
	e, _ := sh.lookup(id)
	if e == nil {
		sh.mu.Unlock()
		return nil
	}
	v := e.view()
	d := v.Detach()
	n := d.Prev + d.Curr
	e.setView(&v)
	e.inflight += n
	j := job{b: e.b, fid: e.fid, delta: d}
	sh.mu.Unlock()
	return s.run(ctx, sh, id, &j, call, ms)
}

// takeLease decides charge c from the slice its counter holds, asking
// for a slice if none is left.
func (s *Store) takeLease(ctx context.Context, ms, call int64, c *window.Charge, b *binding, out *window.Decision) (bool, error) {
	sh, id := s.locate(c)
	cost := int64(c.Cost)
	for {
		sh.mu.Lock()
		e := s.entryFor(sh, id, c, b)
		e.used = ms
		if e.up > ms && e.uc >= cost {
			e.uc -= cost
			left := e.uc
			st, at := b.lim.Roll(e.state(), ms)
			e.setState(st)
			// Busy counters (more than one slice lately) ask for the next
			// slice ahead, when a quarter of this one is left.
			refill := e.inflight >= 4 && e.uc < (e.inflight+3)/4 && e.flags&granting == 0
			if refill {
				e.flags |= granting
				sh.enlist(id, e)
			}
			sh.mu.Unlock()
			// Described without the lock, which every decision on the
			// counter needs.
			*out = window.Describe(st, at, b.lim, cost, true)
			out.Remaining = min(out.Remaining+int(left), b.lim.Capacity())
			if refill {
				// Ask for the next slice before this one runs out, so that
				// busy counters keep deciding locally.
				go s.grant(context.WithoutCancel(ctx), sh, id, call, ms, 0)
			}
			return true, nil
		}
		if e.flags&full != 0 && e.up > ms {
			// The fleet's budget was spent: deny, as the store did, until
			// its Retry-After (at most one interval).
			st, at := b.lim.Roll(e.state(), ms)
			e.setState(st)
			*out = window.Describe(st, at, b.lim, cost, false)
			sh.mu.Unlock()
			return false, nil
		}
		if e.flags&granting != 0 {
			ch := s.waitCh(sh, id)
			sh.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
		e.flags |= granting
		sh.enlist(id, e)
		sh.mu.Unlock()
		rep, err := s.grant(ctx, sh, id, call, ms, cost)
		if err != nil {
			return false, err
		}
		sh.mu.Lock()
		e, _ = sh.lookup(id)
		if e != nil && e.up > ms && e.uc >= cost {
			sh.mu.Unlock()
			continue
		}
		sh.mu.Unlock()
		// The fleet's count denies: describe it as exact mode would.
		st, at := b.lim.Roll(rep.State, ms)
		*out = window.Describe(st, at, b.lim, cost, false)
		return false, nil
	}
}

// grant makes one lease call for entry id (which has granting set): it
// gives back the rest of a slice that ended and asks for the next slice,
// at least need units (see nextWant). It clears granting and wakes the
// requests that wait for it.
func (s *Store) grant(ctx context.Context, sh *shard, id ident, call, ms, need int64) (fleet.Reply, error) {
	sh.mu.Lock()
	e, _ := sh.lookup(id)
	if e == nil {
		s.wake(sh, id)
		sh.mu.Unlock()
		return fleet.Reply{}, nil
	}
	if e.up <= ms && e.uc == 0 && need > 0 {
		// The last slice was spent and has ended: a counter used now and
		// then starts again from 1 unit, which leaves nothing to give
		// back.
		e.inflight = 1
	}
	j := job{b: e.b, fid: e.fid, lease: true, want: max(nextWant(e), need), from: e.us}
	if e.up <= ms && e.uc > 0 {
		j.give, e.uc = e.uc, 0
	}
	sh.mu.Unlock()
	if call >= 0 {
		// A refill may start after later decisions: never ask the store
		// to decide at an instant older than theirs.
		ms = max(ms, s.latest.Load())
		call = ms
	}
	rep, err := s.call(ctx, &j, call, ms)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, _ = sh.lookup(id)
	if e != nil {
		e.flags &^= granting
	}
	s.wake(sh, id)
	if err != nil {
		return rep, err
	}
	s.granted(e, &j, &rep, ms)
	return rep, nil
}

// nextWant is the slice to ask for next for entry e, and doubles the one
// after, up to the rule's lease: a counter's first slice is 1 unit (a
// counter used once costs one call, as in exact mode, and nothing to give
// back), and a busy counter's slices grow to the lease in a few calls.
// The syncer halves it when a slice ends unused. e's shard must be locked.
func nextWant(e *entry) int64 {
	w := max(e.inflight, 1)
	e.inflight = min(2*w, e.b.lease)
	return min(w, e.b.lease)
}

// granted applies a lease reply to entry e (nil if it was evicted, in
// which case the slice goes back at the next tick). sh must be locked.
func (s *Store) granted(e *entry, j *job, rep *fleet.Reply, ms int64) {
	b := j.b
	if fn := s.cfg.Events.Granted; fn != nil && rep.Granted > 0 {
		fn(b.name, rep.Granted)
	}
	if fn := s.cfg.Events.GaveBack; fn != nil && j.give > 0 {
		fn(b.name, j.give)
	}
	if e == nil {
		if rep.Granted > 0 {
			o := entry{b: b, fid: j.fid, uc: rep.Granted, us: rep.State.Start}
			s.orphan(&o)
		}
		return
	}
	e.setState(rep.State)
	e.synced = ms
	if rep.Granted == 0 {
		if j.want > 0 && (e.up <= ms || e.uc == 0) {
			// Nothing left in the fleet: deny locally until a request of
			// cost 1 would fit again, at most one interval.
			st, at := b.lim.Roll(rep.State, ms)
			d := window.Describe(st, at, b.lim, 1, false)
			wait := b.interval
			if d.RetryAfter >= 0 {
				wait = min(wait, max(d.RetryAfter.Milliseconds(), 1))
			}
			e.flags |= full
			e.uc, e.up = 0, ms+wait
		}
		return
	}
	e.flags &^= full
	// The slice lives one interval, and never past the end of the window
	// it was counted in.
	until := ms + b.interval
	switch b.lim.Algorithm {
	case window.SlidingWindow:
		until = min(until, rep.State.Start+b.lim.Window.Milliseconds())
	case window.FixedWindow:
		_, end := b.lim.Bounds(max(rep.State.Start, 0))
		until = min(until, end)
	}
	if e.up <= ms || e.us != rep.State.Start {
		// The old slice ended (its rest went back) or was counted in
		// another window.
		e.uc = 0
	}
	e.uc += rep.Granted
	e.us = rep.State.Start
	e.up = until
}

// wake wakes the requests waiting for a lease call of id. sh must be
// locked.
func (s *Store) wake(sh *shard, id ident) {
	if ch, ok := sh.waits[id]; ok {
		close(ch)
		delete(sh.waits, id)
	}
}

// job is one call of the syncer.
type job struct {
	b      *binding
	fid    fleet.ID
	delta  fleet.Delta
	lease  bool
	want   int64
	give   int64
	from   int64
	orphan bool
	// id and sh locate the entry the reply goes to (not for orphans).
	id ident
	sh *shard
}

// call makes j's call to the backend.
func (s *Store) call(ctx context.Context, j *job, call, ms int64) (fleet.Reply, error) {
	c := fleet.Call{ID: j.fid, Limit: &j.b.lim, Now: call, Delta: j.delta, Lease: j.lease,
		Want: j.want, Give: j.give, From: j.from, Holder: s.holder, Until: ms + j.b.interval}
	rep, err := s.cfg.Backend.Fleet(ctx, time.Now().Add(s.cfg.Timeout), &c)
	if err == nil && call < 0 {
		// The shared store keeps time: follow its clock.
		s.offset.Store(rep.Now - time.Now().UnixMilli())
	}
	return rep, err
}

// run makes write-back job j's call and merges the reply into entry id
// of sh, or restores the delta if the call failed.
func (s *Store) run(ctx context.Context, sh *shard, id ident, j *job, call, ms int64) error {
	rep, err := s.call(ctx, j, call, ms)
	n := j.delta.Prev + j.delta.Curr
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, _ := sh.lookup(id)
	if e == nil {
		if err != nil {
			o := entry{b: j.b, fid: j.fid, us: j.delta.Start, up: j.delta.Prev, uc: j.delta.Curr}
			s.orphan(&o)
		}
		return err
	}
	e.inflight = max(0, e.inflight-n)
	l := &j.b.lim
	v := e.view()
	if err != nil {
		v.Roll(l, ms)
		v.Restore(l, j.delta)
		e.setView(&v)
		s.failUntil.Store(ms + j.b.interval)
		return err
	}
	s.cfg.Merge(l, &v, rep, ms, e.inflight)
	e.setView(&v)
	e.synced = ms
	return nil
}

// loop is the syncer: one tick every interval (the shortest of the
// rules').
func (s *Store) loop() {
	defer close(s.done)
	iv := time.Duration(s.tickMs.Load()) * time.Millisecond
	t := time.NewTicker(iv)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.Sync(context.Background(), s.clock(), false)
			if d := time.Duration(s.tickMs.Load()) * time.Millisecond; d != iv {
				iv = d
				t.Reset(iv)
			}
		}
	}
}

// Sync runs one tick of the syncer at now (the zero time for the shared
// store's clock): it pushes the unsynced counts of the counters due, reads
// again those used lately, renews or gives back the slices that ended, and
// sends what evicted counters owed. final pushes and gives back
// everything, as Close does.
func (s *Store) Sync(ctx context.Context, now time.Time, final bool) {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	ms, call := s.instant(now)
	tick := s.tick.Add(1)
	var jobs []job
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		keep := sh.list[:0]
		for _, id := range sh.list {
			e, _ := sh.lookup(id)
			if e == nil {
				continue
			}
			b := e.b
			recent := ms-e.used <= 2*b.interval
			if b.set.Mode == fleet.WriteBack {
				due := final || tick%b.every == 0
				if due && (e.up != 0 || e.uc != 0 || (recent && !final)) {
					v := e.view()
					d := v.Detach()
					e.setView(&v)
					e.inflight += d.Prev + d.Curr
					jobs = append(jobs, job{b: b, fid: e.fid, delta: d, id: id, sh: sh})
				}
				if recent || e.uc != 0 || e.up != 0 || e.inflight != 0 {
					keep = append(keep, id)
					continue
				}
			} else {
				if e.flags&granting != 0 {
					keep = append(keep, id)
					continue
				}
				ended := e.up <= ms || final
				// Busy: used in the last interval, and asked for more than
				// one slice lately; a counter used once or twice is not
				// worth a slice ahead.
				busy := ms-e.used <= b.interval && !final && e.inflight >= 4
				if ended && (e.uc > 0 || busy) {
					j := job{b: b, fid: e.fid, lease: true, give: e.uc, from: e.us, id: id, sh: sh}
					if busy {
						j.want = nextWant(e)
					} else {
						e.inflight = max(e.inflight/4, 1)
					}
					e.uc = 0
					e.flags |= granting
					jobs = append(jobs, j)
				}
				if !ended || busy || e.flags&granting != 0 {
					keep = append(keep, id)
					continue
				}
			}
			e.flags &^= listed
		}
		clear(sh.list[len(keep):])
		sh.list = keep
		sh.mu.Unlock()
	}
	s.omu.Lock()
	jobs = append(jobs, s.orphans...)
	s.orphans = s.orphans[:0]
	s.omu.Unlock()
	if len(jobs) == 0 {
		return
	}
	began := time.Now()
	var first error
	var mu sync.Mutex
	next := make(chan int, len(jobs))
	for i := range jobs {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for w := 0; w < min(workers, len(jobs)); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := s.runJob(ctx, &jobs[i], call, ms); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if fn := s.cfg.Events.Flushed; fn != nil {
		fn(len(jobs), time.Since(began), first)
	}
}

// runJob makes one call of a tick and applies its reply.
func (s *Store) runJob(ctx context.Context, j *job, call, ms int64) error {
	switch {
	case j.orphan:
		rep, err := s.call(ctx, j, call, ms)
		if err == nil && j.lease {
			s.granted(nil, j, &rep, ms)
		} else if err != nil {
			if fn := s.cfg.Events.Dropped; fn != nil {
				fn(j.b.name, j.delta.Prev+j.delta.Curr+j.give)
			}
		}
		return err
	case j.lease:
		rep, err := s.call(ctx, j, call, ms)
		j.sh.mu.Lock()
		defer j.sh.mu.Unlock()
		e, _ := j.sh.lookup(j.id)
		if e != nil {
			e.flags &^= granting
		}
		s.wake(j.sh, j.id)
		if err != nil {
			return err
		}
		s.granted(e, j, &rep, ms)
		return nil
	}
	return s.run(ctx, j.sh, j.id, j, call, ms)
}
