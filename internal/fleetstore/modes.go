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
	l := &b.lim
	sh.mu.Lock()
	e := s.entryFor(sh, id, c, b, ms)
	blind := false
	if e.synced == 0 || ms-e.synced > 2*b.interval {
		// Never synced, or not for two intervals: decide blind, within
		// this server's share of the bound (fleet.Blind), while the view
		// is far from the limit; else read the fleet's count (pushing
		// what is unsynced) before deciding. While Redis fails, decide
		// from the view.
		if s.failUntil.Load() <= ms {
			if blind = s.admitBlind(sh, e, b, ms, cost); !blind {
				sh.mu.Unlock()
				s.push(ctx, sh, id, call, ms)
				sh.mu.Lock()
				e = s.entryFor(sh, id, c, b, ms)
			}
		}
	}
	var w waits
	if !blind {
		// (What is admitted blind is within fleet.Blind's budget.)
		e = s.awaitRoom(ctx, &w, sh, id, c, b, e, ms, cost)
	}
	v := e.view()
	at, ok := v.Take(l, ms, cost)
	e.setView(&v)
	e.used = ms
	if ok && cost > 0 {
		if !blind {
			sh.enlist(id, e)
			// Blind units are in fleet.Blind's D already.
			bl := e.blind()
			bl.Note(l, ms, v.C.Start, v.Unsynced()+e.inflight)
			e.setBlind(bl)
		} else if e.flags&listed == 0 {
			// Counts decided blind may wait in the later list.
			sh.enlist(id, e)
		}
	}
	claimed := ok && s.claimPush(e, b, ms)
	sh.mu.Unlock()
	// Described from the copy, without the lock, which every decision on
	// the counter needs.
	*out = window.Describe(v.C, at, *l, cost, ok)
	if ok && cost > 0 {
		if fn := s.cfg.Events.Unsynced; fn != nil {
			fn(b.name, cost)
		}
	}
	if claimed {
		s.pushClaimed(ctx, &w, sh, id, call, ms)
	}
	w.stop()
	return ok, nil
}

// admitBlind reports whether a request of cost c may be admitted by entry
// e, whose view was not synced for two intervals, without reading the
// fleet's count first: if the view, rolled to ms, leaves at least half of
// the limit after it, and the counter's fleet.Blind has room for it (which
// it then counts). A counter never synced is not admitted blind in a
// period (fleet.Blind) in which its shard dropped counters to stay within
// the table's bound: it may have been dropped with what it admitted blind
// in the period, and would start afresh. sh must be locked.
func (s *Store) admitBlind(sh *shard, e *entry, b *binding, ms, c int64) bool {
	l := &b.lim
	v := e.view()
	at := v.Roll(l, ms)
	if e.synced == 0 && sh.evicted != 0 && sh.evicted >= fleet.BlindPeriodStart(l, ms, v.C.Start) {
		// The shard dropped counters in this period: this one may have
		// been among them, with what it admitted blind.
		return false
	}
	if fleet.Remaining(l, v.C, at) < c+int64(l.Requests)/2 {
		return false
	}
	bl := e.blind()
	ok := bl.Admit(l, ms, v.C.Start, c, v.Unsynced()+e.inflight, b.maxUnsynced)
	e.setBlind(bl)
	if ok {
		s.blind.Add(c)
	}
	return ok
}

// awaitRoom waits, before a charge of cost c is counted in write-back
// entry e of id, for the push that requests wait for (flag granting) while
// one is on its way and the charge would bring what the server holds that
// the fleet has not seen (e's unsynced units and those on their way) to
// max_unsynced; the charge is then decided, or settled, from the view that
// push's answer refreshed. With claimPush, this keeps what a server holds
// unseen below max_unsynced plus one charge whatever the requests in
// flight: counted first and waited for after, each of them would add its
// charge while the push is on its way. It stops waiting past the request's
// bound on waits (Config.Wait) or its context, or while the shared store
// fails, and returns the counter's entry, which may be another one after
// a wait. sh must be locked; it is locked again on return.
func (s *Store) awaitRoom(ctx context.Context, w *waits, sh *shard, id ident, c *window.Charge, b *binding, e *entry, ms, cost int64) *entry {
	for cost > 0 && e.flags&granting != 0 && e.up+e.uc+e.inflight+cost >= b.maxUnsynced && s.failUntil.Load() <= ms {
		ch := s.waitCh(sh, id)
		sh.mu.Unlock()
		err := s.await(ctx, w, ch)
		sh.mu.Lock()
		e = s.entryFor(sh, id, c, b, ms)
		if err != nil {
			break
		}
	}
	return e
}

// claimPush reports whether a request that just counted units in
// write-back entry e must make them durable before it is answered, because
// what e holds unseen reached max_unsynced, and if so claims the push
// (flag granting), which the requests that would reach the bound meanwhile
// wait for (awaitRoom): one push per counter at a time. A request past its
// bound on waits may find the push claimed already; it does not wait
// again. sh must be locked.
func (s *Store) claimPush(e *entry, b *binding, ms int64) bool {
	if e.up+e.uc+e.inflight < b.maxUnsynced || s.failUntil.Load() > ms || e.flags&granting != 0 {
		return false
	}
	e.flags |= granting
	return true
}

// pushClaimed makes the unsynced counts of entry id durable for the
// request that claimed the push (claimPush), within its bound on waits,
// and lets the requests that wait for it go.
func (s *Store) pushClaimed(ctx context.Context, w *waits, sh *shard, id ident, call, ms int64) {
	s.push(s.bound(ctx, w), sh, id, call, ms)
	sh.mu.Lock()
	if e, _ := sh.lookup(id); e != nil {
		e.flags &^= granting
	}
	s.wake(sh, id)
	sh.mu.Unlock()
}

// waits bounds a request's waits for calls on their way for its counter
// (Config.Wait), from the first.
type waits struct {
	ctx    context.Context
	cancel context.CancelFunc
}

// bound returns ctx with the deadline of the request's waits, made at the
// first call.
func (s *Store) bound(ctx context.Context, w *waits) context.Context {
	if s.cfg.Wait <= 0 {
		return ctx
	}
	if w.ctx == nil {
		w.ctx, w.cancel = context.WithTimeout(ctx, s.cfg.Wait)
	}
	return w.ctx
}

func (w *waits) stop() {
	if w.cancel != nil {
		w.cancel()
	}
}

// await waits for ch, a call on its way for the counter, within ctx and
// the request's bound w, and returns why it did not come.
func (s *Store) await(ctx context.Context, w *waits, ch chan struct{}) error {
	bctx := s.bound(ctx, w)
	select {
	case <-ch:
		return nil
	case <-bctx.Done():
		if ctx.Err() == nil {
			return ErrWait
		}
		return ctx.Err()
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

// spendSlice admits charge c from what is left of the slice its counter
// holds, if it covers c's cost, without asking for another: for a charge
// to be decided exactly (window.Charge.Exact) whose counter a slice was
// leased for before. It reports whether it did.
func (s *Store) spendSlice(c *window.Charge, b *binding, ms int64, out *window.Decision) bool {
	sh, id := s.locate(c)
	cost := int64(c.Cost)
	sh.mu.Lock()
	e, _ := sh.lookup(id)
	if e == nil || e.up <= ms || e.uc < cost {
		sh.mu.Unlock()
		return false
	}
	e.b = b
	e.used = ms
	e.uc -= cost
	left := e.uc
	st, at := b.lim.Roll(e.state(), ms)
	e.setState(st)
	sh.mu.Unlock()
	*out = window.Describe(st, at, b.lim, cost, true)
	out.Remaining = min(out.Remaining+int(left), b.lim.Capacity())
	return true
}

// takeLease decides charge c from the slice its counter holds, asking
// for a slice if none is left; or reports that the counter is cold, for
// the caller to decide it exactly: its counter holds no slice and was not
// used for two intervals (or ever), so that a slice would cost the exact
// store's single call, and likely one more to give back what it left. A
// counter used again within two intervals is busy, and leases from 2 units
// on. Which counters were used lately is known from Store.uses first, so
// that a cold counter costs no entry in the table (at 100,000 keys, a
// lookup in the table misses the processor's caches twice).
func (s *Store) takeLease(ctx context.Context, ms, call int64, c *window.Charge, b *binding, out *window.Decision) (ok, cold bool, err error) {
	var w waits
	defer w.stop()
	sh, id := s.locate(c)
	cost := int64(c.Cost)
	busy := false
	switch s.uses.note(id, ms, 2*b.interval) {
	case useStale:
		// Not used for two intervals: no slice (an idle counter's went
		// back), and no need to look in the table.
		return false, true, nil
	case useRecent:
		busy = true
	}
	for {
		sh.mu.Lock()
		var e *entry
		if busy {
			e = s.entryFor(sh, id, c, b, ms)
		} else if e, _ = sh.lookup(id); e == nil {
			// Unknown to the table, and not known to have been used
			// lately: decided exactly, without an entry, which its next
			// use within two intervals makes.
			sh.mu.Unlock()
			return false, true, nil
		} else {
			e.b = b
		}
		last := e.used
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
				go s.grant(fleet.Background(context.WithoutCancel(ctx)), sh, id, call, ms, 0)
			}
			return true, false, nil
		}
		if e.flags&full != 0 && e.up > ms {
			// The fleet's budget was spent: deny, as the store did, until
			// its Retry-After (at most one interval).
			st, at := b.lim.Roll(e.state(), ms)
			e.setState(st)
			*out = window.Describe(st, at, b.lim, cost, false)
			sh.mu.Unlock()
			return false, false, nil
		}
		if !busy && e.flags&granting == 0 && (e.up <= ms || e.uc == 0) && (last == 0 || ms-last > 2*b.interval) {
			e.inflight = 2
			sh.mu.Unlock()
			return false, true, nil
		}
		if e.flags&granting != 0 {
			ch := s.waitCh(sh, id)
			sh.mu.Unlock()
			if err := s.await(ctx, &w, ch); err != nil {
				return false, false, err
			}
			continue
		}
		e.flags |= granting
		sh.enlist(id, e)
		sh.mu.Unlock()
		rep, err := s.grant(s.bound(ctx, &w), sh, id, call, ms, cost)
		if err != nil {
			return false, false, err
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
		return false, false, nil
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
	j := job{b: e.b, fid: e.fid, lease: true, want: max(nextWant(e), need), from: e.us, until: ms + life(e, ms, 1)}
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
// after, up to the rule's lease: a counter's first slice is 2 units (its
// first use was decided exactly, see cold), and a busy counter's slices
// grow to the lease in a few calls. The syncer quarters it when a slice
// goes back unused. e's shard must be locked.
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
	// The slice lives one interval, or longer far from the limit
	// (fleet.SliceLife), and never past the end of the window it was
	// counted in.
	until := ms + life(e, ms, rep.Servers)
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

// life is how long a slice of entry e granted at ms lives, from the
// counter as the last call returned it and the servers holding leases on
// it (fleet.SliceLife). Before a call, with servers 1, it is what the
// shared store is told the lease will last: only a count of the holders
// depends on it. e's shard must be locked.
func life(e *entry, ms, servers int64) int64 {
	b := e.b
	st, at := b.lim.Roll(e.state(), ms)
	return fleet.SliceLife(&b.lim, b.interval, fleet.Remaining(&b.lim, st, at), servers, b.lease)
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
	// until is when the lease asked for is expected to end (Unix ms),
	// which the shared store keeps to count the servers holding leases.
	until int64
	// id and sh locate the entry the reply goes to (not for orphans).
	id ident
	sh *shard
}

// call makes j's call to the backend.
func (s *Store) call(ctx context.Context, j *job, call, ms int64) (fleet.Reply, error) {
	c := s.fleetCall(j, call, ms)
	sent := time.Now()
	rep, err := s.cfg.Backend.Fleet(ctx, sent.Add(s.cfg.Timeout), &c)
	s.answered(&rep, err, call, sent)
	return rep, err
}

// fleetCall returns job j's call to the backend.
func (s *Store) fleetCall(j *job, call, ms int64) fleet.Call {
	return fleet.Call{ID: j.fid, Limit: &j.b.lim, Now: call, Delta: j.delta, Lease: j.lease,
		Want: j.want, Give: j.give, From: j.from, Holder: s.holder, Until: max(j.until, ms+j.b.interval)}
}

// answered follows the shared store's clock after a call made at its
// instant (call < 0) and sent at sent (see clock).
func (s *Store) answered(rep *fleet.Reply, err error, call int64, sent time.Time) {
	if err == nil && call < 0 {
		s.skew.sample(rep.Now, sent, time.Now())
	}
}

// run makes write-back job j's call and merges the reply into entry id
// of sh, or restores the delta if the call failed.
func (s *Store) run(ctx context.Context, sh *shard, id ident, j *job, call, ms int64) error {
	rep, err := s.call(ctx, j, call, ms)
	return s.merged(sh, id, j, &rep, err, ms)
}

// merged merges the reply rep (or error err) to write-back job j into
// entry id of sh, or restores the delta if the call failed.
func (s *Store) merged(sh *shard, id ident, j *job, rep *fleet.Reply, err error, ms int64) error {
	n := j.delta.Prev + j.delta.Curr
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, _ := sh.lookup(id)
	if e == nil {
		if err != nil {
			o := entry{b: j.b, fid: j.fid, cs: j.delta.Start, up: j.delta.Prev, uc: j.delta.Curr}
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
		bl := e.blind()
		bl.Note(l, ms, v.C.Start, v.Unsynced()+e.inflight)
		e.setBlind(bl)
		sh.enlist(id, e) // retried at the next tick
		s.failUntil.Store(ms + j.b.interval)
		return err
	}
	s.cfg.Merge(l, &v, *rep, ms, e.inflight)
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
	ctx = fleet.Background(ctx) // no request waits for a tick
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
				if final || tick%b.every == 0 {
					push, wait := pushDue(e, ms, recent, final)
					if push {
						jobs = append(jobs, detach(sh, id, e))
					} else if wait {
						// Visited every laterEvery ticks from now on.
						sh.postpone(id, e)
						continue
					}
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
				// Idle: not used for two intervals; what its slice left
				// goes back, however long the slice lives.
				idle := ms-e.used > 2*b.interval
				if ended && (e.uc > 0 || busy) || idle && e.uc > 0 {
					j := job{b: b, fid: e.fid, lease: true, give: e.uc, from: e.us, id: id, sh: sh, until: ms + life(e, ms, 1)}
					if ended && busy {
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
		if final || tick%laterEvery == 0 {
			waiting := sh.later[:0]
			for _, id := range sh.later {
				e, _ := sh.lookup(id)
				if e == nil || e.flags&(later|seen) != later {
					// Evicted, back in the list, or seen already in this
					// pass (an entry that went back to the list and came
					// again).
					continue
				}
				push, wait := pushDue(e, ms, ms-e.used <= 2*e.b.interval, final)
				if wait {
					e.flags |= seen
					waiting = append(waiting, id)
					continue
				}
				if push {
					jobs = append(jobs, detach(sh, id, e))
				}
				e.flags &^= later | listed
			}
			for _, id := range waiting {
				if e, _ := sh.lookup(id); e != nil {
					e.flags &^= seen
				}
			}
			clear(sh.later[len(waiting):])
			sh.later = waiting
		}
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
	fail := func(err error) {
		if err != nil {
			mu.Lock()
			if first == nil {
				first = err
			}
			mu.Unlock()
		}
	}
	// The jobs go by one, or by chunks to a backend that takes many, from
	// a few goroutines.
	bb, batch := s.cfg.Backend.(BatchBackend)
	size, n := 1, workers
	if batch {
		size, n = chunk, chunkWorkers
	}
	next := make(chan int, len(jobs)/size+1)
	for i := 0; i < len(jobs); i += size {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for w := 0; w < min(n, (len(jobs)+size-1)/size); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if batch {
					fail(s.runBatch(ctx, bb, jobs[i:min(i+size, len(jobs))], call, ms))
				} else {
					fail(s.runJob(ctx, &jobs[i], call, ms))
				}
			}
		}()
	}
	wg.Wait()
	if fn := s.cfg.Events.Flushed; fn != nil {
		fn(len(jobs), time.Since(began), first)
	}
}

// pushDue reports whether the syncer pushes the unsynced counts of
// write-back entry e (or reads the fleet's count of it) at a tick at ms,
// after rolling its view to ms, and if not, whether counts wait (then the
// entry is visited every laterEvery ticks only, so that a tick costs what
// the counters used lately cost, however many counts wait). Counts are pushed every interval while
// the counter is used from a fresh view (synced in the last two
// intervals, which the push keeps it) or is near its limit (less than half
// of it left), at the first tick after a counter's first decision (which
// learns the fleet's count), and by Close. Otherwise, counts decided
// blind (fleet.Blind)
// wait until they are half of max_unsynced or belong to the previous
// window (or, for a fixed window, to one that ends before the next visit):
// they are within the server's share of the bound wherever they are, and
// a counter decided now and then costs a push per window rather than one
// per decision. A token bucket's counts are pushed every
// interval. A counter used lately and near its limit is read again even
// with nothing to push. e's shard must be locked.
func pushDue(e *entry, ms int64, recent, final bool) (push, wait bool) {
	b := e.b
	l := &b.lim
	v := e.view()
	at := v.Roll(l, ms)
	e.setView(&v)
	u := v.Unsynced()
	if l.Algorithm == window.TokenBucket {
		return u != 0 || recent && !final, false
	}
	near := fleet.Remaining(l, v.C, at) < int64(l.Requests)/2
	if u == 0 {
		return recent && near && !final, false
	}
	if e.synced == 0 || ms-e.synced <= 2*b.interval {
		// Never synced (the push learns the fleet's count), or fresh.
		return true, false
	}
	if l.Algorithm == window.FixedWindow {
		// A fixed window's counts are dropped when it ends: pushed at the
		// last visit before.
		if _, end := l.Bounds(v.C.Start); end-ms <= laterEvery*b.interval {
			return true, false
		}
	}
	if final || near || v.U.Prev != 0 || 2*u >= b.maxUnsynced {
		return true, false
	}
	return false, true
}

// detach takes the unsynced counts of write-back entry e of id out of its
// view, as a job that pushes them. sh must be locked.
func detach(sh *shard, id ident, e *entry) job {
	v := e.view()
	d := v.Detach()
	e.setView(&v)
	e.inflight += d.Prev + d.Curr
	return job{b: e.b, fid: e.fid, delta: d, id: id, sh: sh}
}

// runJob makes one call of a tick and applies its reply.
func (s *Store) runJob(ctx context.Context, j *job, call, ms int64) error {
	rep, err := s.call(ctx, j, call, ms)
	return s.applyJob(j, &rep, err, ms)
}

// applyJob applies the reply rep (or error err) to a call of a tick.
func (s *Store) applyJob(j *job, rep *fleet.Reply, err error, ms int64) error {
	switch {
	case j.orphan:
		if err == nil && j.lease {
			s.granted(nil, j, rep, ms)
		} else if err != nil {
			if fn := s.cfg.Events.Dropped; fn != nil {
				fn(j.b.name, j.delta.Prev+j.delta.Curr+j.give)
			}
		}
		return err
	case j.lease:
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
		s.granted(e, j, rep, ms)
		return nil
	}
	return s.merged(j.sh, j.id, j, rep, err, ms)
}

// runBatch makes the calls of jobs at once through a backend that takes
// many (BatchBackend) and applies their replies.
func (s *Store) runBatch(ctx context.Context, bb BatchBackend, jobs []job, call, ms int64) error {
	calls := make([]fleet.Call, len(jobs))
	ptrs := make([]*fleet.Call, len(jobs))
	for i := range jobs {
		calls[i] = s.fleetCall(&jobs[i], call, ms)
		ptrs[i] = &calls[i]
	}
	reps := make([]fleet.Reply, len(jobs))
	errs := make([]error, len(jobs))
	sent := time.Now()
	bb.FleetAll(ctx, sent.Add(s.cfg.Timeout), ptrs, reps, errs)
	var first error
	for i := range jobs {
		s.answered(&reps[i], errs[i], call, sent)
		if err := s.applyJob(&jobs[i], &reps[i], errs[i], ms); err != nil && first == nil {
			first = err
		}
	}
	return first
}
