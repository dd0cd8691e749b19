package redispipe

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// directDialBound bounds the dials of a direct call through the clone
// (see runDirect), below the 100 ms after which go-redis tries a failed
// dial again.
const directDialBound = 90 * time.Millisecond

// maxStalledFactor bounds the lanes of a destination that are stuck in a
// stalled batch, as a multiple of MaxInFlight: up to that many, each is
// replaced at once by a fresh lane.
const maxStalledFactor = 4

// dest is one destination: a server, its queue of calls and its lanes.
type dest struct {
	p      *Pipeliner
	name   string
	client atomic.Pointer[redis.Client]

	mu   sync.Mutex
	cond sync.Cond // signalled when calls are queued or on close
	// queue holds the calls waiting for a lane.
	queue []*call
	// lanes holds every lane, stalled or not; healthy counts those not
	// stalled.
	lanes   []*lane
	healthy int
	// inFlight is the number of regular lanes, and extra how many more
	// spreadLocked may start (see lanesFor); both fixed at creation.
	inFlight, extra int
	// idle counts the lanes waiting for calls; lastBatch is when a lane
	// last took a batch (see spreadLocked).
	idle      int
	lastBatch time.Time
	// warmer runs warm every warmEvery, when servers may be slow, to
	// keep warmConns connections ready (see startWarming).
	warmer    *time.Timer
	warmConns int
	closed    bool
	// state is the destination's health; downErr is the error its calls
	// get while it is not up (see refuseLocked). slowTrip is the round
	// trip a slow destination's server was last seen to take.
	state    health
	downErr  error
	slowTrip time.Duration
	// probing is set while a probe goroutine runs.
	probing bool
	// peak is the longest recent batch time, decaying by half every
	// peakHalfLife; peakAt is when it was last updated.
	peak   time.Duration
	peakAt time.Time
	// probeReset asks a running probe goroutine to start again from the
	// first interval: the destination went down again.
	probeReset bool
	// lastUse is when a call last came for the destination, to the
	// nearest batch while it is up.
	lastUse time.Time

	// events are state changes not yet reported; delivering is set while a
	// goroutine reports them.
	events     []event
	delivering bool

	// directs counts the direct calls in flight (see submit); served is
	// set once a batch of the destination's client was answered (see
	// directLocked). Both guarded by mu.
	directs int
	served  bool
	// verifying is set while a lane's stall timer has the server verified
	// (see verify.go); lateAt is when this process was last seen late to
	// read the server's replies. Both guarded by mu.
	verifying bool
	lateAt    time.Time
	// answeredAt is when, in Unix nanoseconds, the latest PING of a
	// verification that the server answered was written.
	answeredAt atomic.Int64
	// watch is the connection of verifications; probeWatch, that of the
	// probes that tell a slow server from one that is down.
	watch, probeWatch watch
	// clone, if not nil, is the client of direct calls (see setClient).
	clone atomic.Pointer[redis.Client]
	// bound is the context of the direct calls through the clone (see
	// directContext).
	bound atomic.Pointer[boundContext]
	// memory reads the server's memory figures and notes its OOM replies.
	memory memoryWatch
}

// boundContext is a context, derived from the Pipeliner's, that ends at
// deadline.
type boundContext struct {
	ctx      context.Context
	cancel   context.CancelFunc // left to the deadline: calls may still use ctx
	deadline time.Time
}

// directContext returns the context of a direct call through the clone,
// which bounds go-redis's dials and waits for a connection (the clone's
// timeouts bound its reads and writes), and its deadline: between
// 9/10 of bound and bound after now. One context serves every call of a
// tenth of bound, so that a call does not make a context and a timer of
// its own, which costs one call at a time a few µs of its round trip
// (go's timers wake the network poller). It is derived from the
// Pipeliner's context, not the caller's: a caller that leaves during a
// dial waits for it (at most bound); its call's reply is discarded as
// usual.
func (d *dest) directContext(now time.Time, bound time.Duration) (context.Context, time.Time) {
	if b := d.bound.Load(); b != nil && b.deadline.Sub(now) >= bound-bound/10 && !b.deadline.After(now.Add(bound)) {
		return b.ctx, b.deadline
	}
	b := &boundContext{deadline: now.Add(bound)}
	b.ctx, b.cancel = context.WithDeadline(d.p.ctx, b.deadline)
	d.bound.Store(b)
	return b.ctx, b.deadline
}

// setClient makes c the client of the destination.
func (d *dest) setClient(c *redis.Client) {
	d.mu.Lock()
	d.served = false // a new client has no connection yet
	d.client.Store(c)
	d.mu.Unlock()
	if t := d.p.directTimeout; t > 0 && !c.Options().ContextTimeoutEnabled {
		// go-redis waits for a reply for ReadTimeout whatever the
		// context, then tries again: direct calls go through a clone
		// that shares the client's pool but gives up after t, once.
		// (go-redis gives a clone none of the client's hooks.)
		clone := c.WithTimeout(t)
		clone.Options().MaxRetries = 0
		d.clone.Store(clone)
	} else {
		d.clone.Store(nil)
	}
}

// event is a state change for Config.OnStateChange.
type event struct {
	up    bool
	cause error
}

func newDest(p *Pipeliner, name string, c *redis.Client) *dest {
	// Until batches tell what is usual, the adaptive stall threshold
	// starts high (MaxStallThreshold) and comes down as the peak decays.
	d := &dest{p: p, name: name, peak: (MaxStallThreshold - MinStallThreshold) / 2, peakAt: time.Now()}
	d.probeWatch.dialTimeout = slowProbeWait
	done := make(chan struct{})
	d.watch.done.Store(&done)
	d.setClient(c)
	d.inFlight, d.extra = lanesFor(p.cfg.MaxInFlight, c.Options())
	d.cond.L = &d.mu
	d.mu.Lock()
	for range d.inFlight {
		d.startLaneLocked()
	}
	d.mu.Unlock()
	if d.stallThresholdLocked() > 0 {
		d.prepareWatch()
	}
	d.watchMemory()
	if p.slowRoundTrip > 0 {
		d.startWarming()
	}
	return d
}

// submit sends c on its way: to be sent by its caller, if the destination
// is idle (see directLocked), which direct then reports, with start, the
// time that the call starts at; or to the queue, for a lane. It returns
// the error of a destination that is down, slow or closed. One reading of
// the clock serves the call's checks, its start and its place in the
// queue, and one hold of the lock all its dealings with the destination.
func (d *dest) submit(c *call) (start time.Time, direct bool, err error) {
	p := d.p
	now := time.Now()
	direct = !p.noDirect && p.send == nil
	if direct && c.hasDeadline && !d.client.Load().Options().ContextTimeoutEnabled {
		// The clone of direct calls gives up after directTimeout, for a
		// write and for a read: the caller's deadline must leave room
		// for both.
		direct = p.directTimeout > 0 && c.deadline.Sub(now) >= 2*p.directTimeout
	}
	d.mu.Lock()
	if err := d.refuseLocked(c, now); err != nil {
		d.mu.Unlock()
		return time.Time{}, false, err
	}
	if direct && d.directLocked(now) {
		d.directs++
		d.lastUse = now
		d.mu.Unlock()
		return now, true, nil
	}
	if c.timed {
		c.queued = now // for overrun
	}
	d.queue = append(d.queue, c)
	d.spreadLocked(now)
	d.mu.Unlock()
	d.cond.Signal()
	return time.Time{}, false, nil
}

// spreadAfter is how long after the latest batch left a call may wait
// for a lane, all of them being busy, before an extra lane takes it.
const spreadAfter = 10 * time.Millisecond

// extraLanes bounds the lanes started by spreadLocked, beyond the
// regular ones (see lanesFor).
const extraLanes = 4

// spreadLocked starts an extra lane for the calls queued, at now, if every
// lane is busy and none has taken a batch for spreadAfter. With a server
// whose round trip is long, the lanes tend to leave together, and a call
// that just missed them would wait for a whole round trip before its own.
// An extra lane ends when it finds nothing queued after its batch.
//
// It is asked when a call is queued and when the timer of a lane whose
// batch has been out for spreadAfter fires (see onTimer): the lane that
// took the latest batch, if still busy, asks spreadAfter after it took
// it, which is when calls that waited since then are owed a lane. No
// timer of its own wakes up while the batches come back sooner, as they
// do from a server that is up and near.
func (d *dest) spreadLocked(now time.Time) {
	if d.idle > 0 || len(d.queue) == 0 || d.healthy >= d.inFlight+d.extra ||
		d.p.send != nil || d.state != up || d.closed || now.Sub(d.lastBatch) < spreadAfter {
		return
	}
	d.lastBatch = now // one extra lane at a time
	d.startLaneLocked()
}

// refuseLocked returns why d takes no call c, if it takes none, at now: it
// is closed, or down, or slow and c cannot wait for its server's round
// trip (which starts its probes). d.mu must be held.
func (d *dest) refuseLocked(c *call, now time.Time) error {
	if d.closed {
		return ErrClosed
	}
	if d.state != up {
		d.lastUse = now
		if !d.probing {
			d.startProbeLocked()
		}
		if !d.patientLocked(c, now) {
			return d.downErr
		}
	}
	return nil
}

// patientLocked reports whether d is slow and call c can wait for its
// server: it has no deadline, or one further than four thirds of the
// round trip the server was last seen to take. A slow server still
// serves such calls (a background sync, say), which need no answer
// within a request's bound. d.mu must be held.
func (d *dest) patientLocked(c *call, now time.Time) bool {
	return d.state == slow && (!c.hasDeadline || c.deadline.Sub(now) > d.slowTrip*4/3)
}

// enqueueAll is submit for calls, all for d, queued at once so that a
// lane takes them together (none is sent directly).
func (d *dest) enqueueAll(calls []*call) error {
	now := time.Now()
	d.mu.Lock()
	// The calls share their deadline.
	if err := d.refuseLocked(calls[0], now); err != nil {
		d.mu.Unlock()
		return err
	}
	for _, c := range calls {
		c.queued = now // for overrun
	}
	d.queue = append(d.queue, calls...)
	d.spreadLocked(now)
	d.mu.Unlock()
	d.cond.Broadcast()
	return nil
}

// close fails the queued calls with ErrClosed and wakes the lanes so that
// they end.
func (d *dest) close() {
	d.mu.Lock()
	d.closed = true
	queued := d.queue
	d.queue = nil
	d.mu.Unlock()
	if d.warmer != nil {
		d.warmer.Stop()
	}
	d.stopMemory()
	d.cond.Broadcast()
	d.closeWatch()
	for _, c := range queued {
		c.complete(nil, ErrClosed)
		c.release()
	}
}

// stallThresholdLocked returns the stall threshold of the next batch, or
// zero if stalls are not detected.
func (d *dest) stallThresholdLocked() time.Duration {
	if t := d.p.cfg.StallThreshold; t != 0 {
		return max(t, 0)
	}
	return min(MinStallThreshold+2*d.peak, MaxStallThreshold)
}

// peakHalfLife is how fast the batch time peak of the adaptive stall
// threshold forgets.
const peakHalfLife = time.Second

// observeLocked records the time a batch took, at now.
func (d *dest) observeLocked(took time.Duration, now time.Time) {
	if dt := now.Sub(d.peakAt); dt > 0 && d.peak > 0 {
		d.peak = time.Duration(float64(d.peak) * math.Exp2(-float64(dt)/float64(peakHalfLife)))
	}
	d.peak = max(d.peak, took)
	d.peakAt = now
}

// lane is a worker goroutine of a destination: it takes queued calls and
// sends them as one pipeline, one batch at a time.
type lane struct {
	d *dest
	// The fields below are guarded by d.mu.
	batch   []*call // the batch being sent
	spare   []*call // an empty buffer for the next batch
	busy    bool
	stalled bool
	start   time.Time
	// due is when the batch is taken as stalled unless the server answers
	// a verification (see onTimer); zero if stalls are not detected.
	due time.Time
	// timer calls onTimer when the batch in flight has been out for
	// spreadAfter (see spreadLocked) and when it reaches its stall
	// threshold.
	timer *time.Timer
	// sent, group and args are scratch space for exec.
	sent, group []*call
	args        []any
	// armed is set while timer is armed for the batch in flight, and
	// landed once the batch is back (see land); wasStalled then says
	// whether it was taken as stalled, and took how long it was out.
	// Only the lane's goroutine uses them.
	armed, landed, wasStalled bool
	took                      time.Duration
}

// land records that the lane's batch is back, answered or not: the lane
// is no longer busy, and the batch's time is observed (but the first's of
// the destination, see served). For a batch of one call answered, exec
// calls it before it completes the call, so that a caller that makes its
// next call as soon as it has its reply finds the destination idle and
// sends that call itself (see directLocked): a lane still busy then would
// keep such a caller's calls in the lanes, each paying the hand-off to
// the lane and back. (The callers of a larger batch, woken together, are
// better off in the next batch together than the first of them alone.)
// Later calls, for the same batch, do nothing.
func (l *lane) land(answered bool) {
	if l.landed {
		return
	}
	l.landed = true
	d := l.d
	if l.armed {
		l.timer.Stop()
	}
	end := time.Now()
	refreshLag(end) // kept current for the deadlines (see overrun)
	d.mu.Lock()
	l.took = end.Sub(l.start)
	l.batch, l.busy = nil, false
	l.wasStalled = l.stalled
	if d.served {
		d.observeLocked(l.took, end)
	}
	// (The time of the first batch answered, which set up a connection
	// and most likely loaded the script, says little of the server's
	// usual pace.)
	d.served = d.served || answered
	d.mu.Unlock()
}

// startLaneLocked starts a lane.
func (d *dest) startLaneLocked() {
	l := &lane{d: d}
	l.timer = time.AfterFunc(time.Hour, l.onTimer)
	l.timer.Stop()
	d.lanes = append(d.lanes, l)
	d.healthy++
	d.p.wg.Add(1)
	go l.run()
}

// removeLocked forgets the lane, which is about to end.
func (l *lane) removeLocked() {
	d := l.d
	for i, o := range d.lanes {
		if o == l {
			d.lanes = append(d.lanes[:i], d.lanes[i+1:]...)
			break
		}
	}
	l.timer.Stop()
}

func (l *lane) run() {
	d := l.d
	defer d.p.wg.Done()
	for {
		d.mu.Lock()
		if len(d.queue) == 0 && d.healthy > d.inFlight && !l.stalled {
			// An extra lane (see spreadLocked) that is not needed.
			l.removeLocked()
			d.healthy--
			d.mu.Unlock()
			return
		}
		for len(d.queue) == 0 && !d.closed {
			d.idle++
			d.cond.Wait()
			d.idle--
		}
		if d.closed {
			l.removeLocked()
			d.healthy--
			d.mu.Unlock()
			return
		}
		if n := d.p.cfg.MaxBatch; len(d.queue) > n {
			l.batch = append(l.spare[:0], d.queue[:n]...)
			rest := copy(d.queue, d.queue[n:])
			clear(d.queue[rest:])
			d.queue = d.queue[:rest]
		} else {
			// Swap buffers: the queue keeps the lane's empty one.
			l.batch, d.queue = d.queue, l.spare[:0]
		}
		l.spare = nil
		more := len(d.queue) > 0
		thr := d.stallThresholdLocked()
		now := time.Now()
		l.busy, l.start = true, now
		d.lastUse, d.lastBatch = now, now
		l.due = time.Time{}
		if thr > 0 {
			l.due = now.Add(thr)
		}
		// The lane's timer fires at the stall threshold, and first at
		// spreadAfter if an extra lane may be owed then (see
		// spreadLocked); a batch answered sooner stops it unfired.
		first := thr
		if d.extra > 0 && (first <= 0 || first > spreadAfter) {
			first = spreadAfter
		}
		d.mu.Unlock()
		if more {
			d.cond.Signal() // another lane may take the rest
		}
		if first > 0 {
			l.timer.Reset(first)
		}

		if fn := d.p.cfg.OnBatch; fn != nil {
			if n := counted(l.batch); n > 0 {
				fn(n)
			}
		}
		batch := l.batch
		l.armed, l.landed = first > 0, false
		answered := l.exec(batch)
		l.land(answered) // unless exec did
		if l.wasStalled && answered {
			// The batch was slow, not lost: the server answers.
			d.answeredLate(l.took)
		}
		for i, c := range batch {
			c.release()
			batch[i] = nil
		}
		l.spare = batch[:0]
		if l.wasStalled {
			d.mu.Lock()
			if d.closed || d.healthy >= d.inFlight {
				// A fresh lane took this one's place.
				l.removeLocked()
				d.mu.Unlock()
				return
			}
			l.stalled = false
			d.healthy++
			d.mu.Unlock()
		}
	}
}

// exec sends the pending calls of batch and completes them. It reports
// whether the server answered.
func (l *lane) exec(batch []*call) bool {
	d := l.d
	sent := l.sent[:0]
	var latest time.Time
	all := true
	for _, c := range batch {
		if !c.isPending() {
			continue // the caller gave up already
		}
		sent = append(sent, c)
		if !c.hasDeadline {
			all = false
		} else if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	defer func() {
		clear(sent)
		l.sent = sent[:0]
	}()
	if len(sent) == 0 {
		return false
	}
	client := d.client.Load()
	var pipe redis.Pipeliner
	send := d.p.send
	if send == nil {
		// (A command keeps the context it is made with, but go-redis
		// goes by the one it is sent with, Exec's below.)
		pipe = client.Pipeline()
		l.group, l.args = d.p.commands(d.p.ctx, pipe, sent, l.group, l.args[:0])
		defer func() {
			// The commands are done with: their arguments may be reused.
			clear(l.args)
			l.args = l.args[:0]
		}()
	}
	// One reading of the clock, the batch built, stamps its calls sent
	// and bounds it.
	now := time.Now()
	stampSent(sent, now)
	// The batch may take as long as its most patient caller waits. Clients
	// that do not honour deadlines on reads still honour them while
	// dialing, retrying and waiting for a connection.
	// A caller may wait past its deadline while the server answers (see
	// call.wait).
	ctx := d.p.ctx
	if all {
		if client.Options().ContextTimeoutEnabled {
			// The deadline also ends the batch's reads: a hung server
			// keeps the connection no longer than the callers wait.
			latest = later(latest, now.Add(MaxStallThreshold))
		} else {
			// It bounds only dials, retries and waits for a
			// connection, which a late process may take long for.
			latest = later(latest, now).Add(maxOverrun)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	if send != nil {
		return send(d, ctx, sent)
	}
	_, err := pipe.Exec(ctx)
	if isConnError(err) && d.p.ctx.Err() == nil {
		d.markDown(err)
		// markDown completed the calls of the batch, unless the
		// destination was closed first.
		uerr := &unavailableError{dest: d.name, cause: err}
		for _, c := range sent {
			c.complete(nil, uerr)
		}
		return false
	}
	answered := err == nil || isRedisError(err)
	if len(sent) == 1 && !lacksScript(sent) {
		// A caller alone, answered: the lane is free before it is.
		l.land(answered)
	}
	d.finish(ctx, client, sent)
	return answered
}

// lacksScript reports whether a call of sent failed because the server
// lacks its script, which finish then loads and sends it again.
func lacksScript(sent []*call) bool {
	for _, c := range sent {
		if err := c.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			return true
		}
	}
	return false
}

// stampSent records now as when calls were sent, just before they are
// written: a PING written after it tells of their replies (see overrun),
// and one written while a late lane was still building the batch would
// not, its answer coming before the batch was on its way.
func stampSent(calls []*call, now time.Time) {
	t := now.UnixNano()
	for _, c := range calls {
		c.sent.Store(t)
	}
}

// finish completes the calls of a batch that was answered, sending again
// those that failed for want of the script, and handing over to the
// redirector those that a Cluster node turned away.
func (d *dest) finish(ctx context.Context, client *redis.Client, sent []*call) {
	var noscript, redirect []*call
	oom := false
	for _, c := range sent {
		val, err := c.result()
		switch {
		case err == nil || !isRedisError(err):
			c.complete(val, err)
		case IsOutOfMemory(err):
			// Final: the failure policy's at once (see IsOutOfMemory).
			oom = true
			c.complete(val, err)
		case redis.HasErrorPrefix(err, "NOSCRIPT"):
			noscript = append(noscript, c)
		case d.p.kind == kindCluster && isRedirect(err):
			redirect = append(redirect, c)
		default:
			c.complete(val, err)
		}
	}
	if oom {
		d.noteOutOfMemory()
	}
	if len(noscript) > 0 {
		redirect = d.reload(ctx, client, noscript, redirect)
	}
	if len(redirect) > 0 {
		d.p.redirects.add(redirect)
	}
}

// reload loads the scripts of calls on the destination's server and sends
// the calls again in the same pipeline, then completes them. It returns
// redirect with the calls that need a Cluster redirection appended.
func (d *dest) reload(ctx context.Context, client *redis.Client, calls, redirect []*call) []*call {
	pipe := client.Pipeline()
	var loaded []*scriptInfo
	for _, c := range calls {
		if !c.isPending() {
			continue
		}
		if !containsScript(loaded, c.script) {
			loaded = append(loaded, c.script)
			// Not Script.Load, which would take the unanswered reply
			// for the script's hash.
			pipe.ScriptLoad(ctx, c.script.src)
		}
		c.setCmd(ctx)
		d.p.queue(ctx, pipe, c.cmd)
	}
	if len(loaded) == 0 {
		return redirect
	}
	_, err := pipe.Exec(ctx)
	if isConnError(err) && d.p.ctx.Err() == nil {
		// As for a batch: the calls fail as unavailable, not with the
		// connection's error.
		d.markDown(err)
		uerr := &unavailableError{dest: d.name, cause: err}
		for _, c := range calls {
			c.complete(nil, uerr)
		}
		return redirect
	}
	var again []*call
	for _, c := range calls {
		if !c.isPending() {
			continue
		}
		val, err := c.result()
		switch {
		case redis.HasErrorPrefix(err, "NOSCRIPT"):
			// Someone flushed the cache between SCRIPT LOAD and
			// EVALSHA: send the script itself, which cannot miss.
			again = append(again, c)
		case err != nil && d.p.kind == kindCluster && isRedirect(err):
			redirect = append(redirect, c)
		default:
			c.complete(val, err)
		}
	}
	if len(again) > 0 {
		pipe := client.Pipeline()
		for _, c := range again {
			c.cmd, c.idx, c.merged = evalCmd(ctx, c), 0, false
			d.p.queue(ctx, pipe, c.cmd)
		}
		_, _ = pipe.Exec(ctx)
		for _, c := range again {
			c.complete(c.result())
		}
	}
	return redirect
}

func containsScript(list []*scriptInfo, s *scriptInfo) bool {
	for _, o := range list {
		if o == s {
			return true
		}
	}
	return false
}

// commands gives each call of sent a command and queues the commands on
// pipe. The calls of one batch script (of one hash slot, on a Cluster)
// share one command, whose arguments are appended to args. group and args
// are scratch space, returned for reuse once the commands are done with.
func (p *Pipeliner) commands(ctx context.Context, pipe redis.Pipeliner, sent, group []*call, args []any) ([]*call, []any) {
	for _, c := range sent {
		c.cmd = nil
	}
	for i, c := range sent {
		if c.cmd != nil {
			continue // merged into an earlier call's command
		}
		if !c.script.batch {
			c.setCmd(ctx)
			p.queue(ctx, pipe, c.cmd)
			continue
		}
		group = append(group[:0], c)
		slot := -1
		if p.kind == kindCluster {
			slot = c.slot
		}
		for _, o := range sent[i+1:] {
			if o.cmd == nil && o.script == c.script && (slot < 0 || o.slot == slot) {
				group = append(group, o)
			}
		}
		if len(group) == 1 {
			c.setCmd(ctx)
		} else {
			args = mergeCmd(ctx, group, args)
		}
		p.queue(ctx, pipe, c.cmd)
	}
	clear(group)
	return group[:0], args
}

// directLocked reports whether a call may be sent by its caller itself
// at now (see submit, which counts it in flight). That is the case when
// the destination is idle (up, with nothing queued or in flight), so that
// there is nothing to batch the call with: sending it from the caller's
// goroutine saves handing it to a lane and the reply back, which on an
// idle machine is most of the latency that the pipeline adds to a round
// trip. A direct call gives up after directTimeout (see runDirect); with a
// client that does not honour context deadlines, the caller's deadline
// must leave room for that twice (a write and a read), and without
// directTimeout (stall detection off) only callers without a deadline
// may call directly (submit checks both). Nor is a call direct while the
// destination's recent slowest batch took more than half of
// directTimeout; nor before the server has answered a batch of the
// client's: the first call sets up a connection (a dial, HELLO) and, the
// server lacking the script, loads it, round trips on top of its own
// that directTimeout, meant for one, does not leave room for on a busy
// machine, while a lane waits for them as long as the server answers.
// d.mu must be held.
func (d *dest) directLocked(now time.Time) bool {
	p := d.p
	if !d.served || d.state != up || d.directs > 0 || len(d.queue) > 0 {
		return false
	}
	if p.directTimeout > 0 && 2*d.peak > p.directTimeout {
		// The server's recent round trips leave a direct call too little
		// room: one that times out loses its reply with its connection.
		return false
	}
	for _, l := range d.lanes {
		if l.busy {
			return false
		}
	}
	// Nor while this process is short of CPU, or was late to read
	// replies lately: a direct call that times out for that loses its
	// reply, while a lane's batch waits for it as long as the server
	// answers.
	return now.Sub(d.lateAt) >= lateFor && !p.busy(now)
}

// runDirect sends c, for which submit said direct at start, from the
// caller's goroutine and returns its outcome. Calls that arrive meanwhile
// queue for the lanes. A connection error or a read that stalls marks the
// destination down, as from a lane.
func (d *dest) runDirect(ctx context.Context, c *call, start time.Time) (any, error) {
	// A direct call ends within its caller's deadline, and within
	// directTimeout, as a stalled batch would.
	// bounded is set when the call ends at directTimeout rather than at
	// the caller's deadline: always through the clone (submit left
	// room for it), and when the deadline is further away otherwise.
	client, run := d.clone.Load(), ctx
	bounded := client != nil
	if client != nil {
		// The clone ends reads at directTimeout. A context deadline bounds
		// go-redis's dials, which it tries five times, 100 ms apart, by
		// default: without it a call to a server that refuses connections
		// would wait 400 ms; with the caller's own, a dial slowed by a
		// busy machine would fail the call.
		run, _ = d.directContext(start, max(d.p.directTimeout, directDialBound))
	} else {
		client = d.client.Load()
		dl, ok := c.deadline, c.hasDeadline
		if t := d.p.directTimeout; t > 0 && (!ok || dl.Sub(start) > t) {
			dl, ok, bounded = start.Add(t), true, true
		}
		if ok {
			var cancel context.CancelFunc
			run, cancel = context.WithDeadline(ctx, dl)
			defer cancel()
		}
	}
	if fn := d.p.cfg.OnBatch; fn != nil && !c.quiet {
		fn(1)
	}
	c.setCmd(run)
	err := client.Process(run, c.cmd)
	end := time.Now()
	var ne net.Error
	// A read or a context that timed out at directTimeout, not at the
	// caller's own deadline nor because the caller left.
	// (A reply read after the deadline passed is a reply all the same.)
	timedOut := err != nil && ((errors.As(err, &ne) && ne.Timeout()) || run.Err() != nil)
	stalled := timedOut && bounded && ctx.Err() == nil
	d.mu.Lock()
	d.directs--
	if !stalled {
		// (The time of a call that stalled tells nothing of the server's
		// usual pace, which the verification below goes by.)
		d.observeLocked(end.Sub(start), end)
	}
	d.mu.Unlock()
	open := d.p.ctx.Err() == nil
	switch {
	case open && stalled:
		// As for a batch: the server is down only if it does not answer
		// a verification either, and slow if it answers late. The
		// verdict gives the call its error if it comes by the call's
		// deadline (the call has no reply either way: it went with the
		// connection), and the destination its state whenever it comes.
		verdict := make(chan error, 1)
		d.p.wg.Add(1)
		go func() {
			defer d.p.wg.Done()
			verdict <- d.judgeDirect(end.Sub(start), end, err)
		}()
		var cerr error
		var expired <-chan time.Time
		if c.hasDeadline {
			t := time.NewTimer(time.Until(c.deadline))
			defer t.Stop()
			expired = t.C
		}
		select {
		case cerr = <-verdict:
		case <-expired:
			cerr = fmt.Errorf("redispipe: no reply read within %s: %w", end.Sub(start).Round(time.Millisecond), err)
		case <-ctx.Done():
			cerr = fmt.Errorf("redispipe: no reply read within %s: %w", end.Sub(start).Round(time.Millisecond), context.Cause(ctx))
		}
		c.complete(nil, cerr)
	case open && isConnError(err):
		d.markDown(err)
		c.complete(nil, &unavailableError{dest: d.name, cause: err})
	default:
		one := [1]*call{c}
		d.finish(ctx, client, one[:])
	}
	c.release() // the destination's reference
	return c.wait(ctx)
}

// judgeDirect verifies the server after a direct call timed out, took
// after it was sent with the error err, at end; it marks the destination
// down or slow if the verdict says so, and returns the call's error.
func (d *dest) judgeDirect(took time.Duration, end time.Time, err error) error {
	d.mu.Lock()
	marks := d.stallMarksLocked()
	d.mu.Unlock()
	v := d.verify(end, marks...)
	if v.answeredWithin(verifyWait) {
		d.noteLate()
	}
	s := d.p.slowRoundTrip
	switch {
	case v.answered && (s <= 0 || v.answeredWithin(s)):
		// This process, or this connection, was too slow for the reply:
		// the server is up.
		return fmt.Errorf("redispipe: no reply read within %s although the server answers: %w",
			took.Round(time.Millisecond), err)
	case v.answered:
		cause := fmt.Errorf("%w: a call outstanding for %s, and %s: %w",
			ErrSlow, took.Round(time.Millisecond), v.describeSlow(s), err)
		d.markSlow(v.seen, cause)
		return &unavailableError{dest: d.name, slow: true, cause: cause}
	}
	cause := fmt.Errorf("%w: a call outstanding for %s, and %s: %w",
		ErrStalled, took.Round(time.Millisecond), v.describe(), err)
	d.markStalled(cause)
	return &unavailableError{dest: d.name, cause: cause}
}

// later returns the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
