package redispipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// dormantAfter is how long a destination that is down or slow keeps
	// being probed without calls for it; the next call restarts the
	// probes.
	dormantAfter = 10 * time.Second
	// minProbeTimeout bounds a probe's dial and PING from below; a probe
	// never waits longer than the interval after it or this, whichever is
	// longer, except for a read from a client that ignores deadlines and
	// for the PING that tells a slow server from one that is down
	// (slowProbeWait).
	minProbeTimeout = 250 * time.Millisecond
	// slowProbeWait is how long the PING of a probe waits for a reply when
	// servers may be slow (Config.Bound): a server that answers later than
	// the slow round trip but within slowProbeWait is slow; one that does
	// not answer, down.
	slowProbeWait = time.Second
	// lagTolerance is how late a stall timer may fire before this process
	// is taken as short of CPU.
	lagTolerance = 5 * time.Millisecond
	// lateRecent is how long after a batch was seen late while its server
	// answered at once this process still counts as short of CPU for the
	// calls that reach their deadline (see overrun).
	lateRecent = maxVerifyWait
)

// health is the state of a destination.
type health int

const (
	// up: calls are sent.
	up health = iota
	// slow: the server answers, but later than the slow round trip
	// (Config.Bound); calls fail at once.
	slow
	// down: the server does not answer, or its connection failed; calls
	// fail at once.
	down
)

// unavailableError is the error of calls for a destination that is down
// or slow.
type unavailableError struct {
	dest  string
	slow  bool
	cause error
}

func (e *unavailableError) Error() string {
	if e.slow {
		return fmt.Sprintf("redispipe: %s slow: %v", e.dest, e.cause)
	}
	return fmt.Sprintf("redispipe: %s unavailable: %v", e.dest, e.cause)
}

// Is reports whether target is ErrUnavailable.
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the reason the destination went down or slow.
func (e *unavailableError) Unwrap() error { return e.cause }

// stallMarksLocked returns the marks at which a stall's verification
// reads its PING's reply (see verify): verifyWait, then the slow round
// trip if it comes first, then stallWaitLocked.
func (d *dest) stallMarksLocked() []time.Duration {
	w := d.stallWaitLocked()
	if s := d.p.slowRoundTrip; s > verifyWait && s < w {
		return []time.Duration{verifyWait, s, w}
	}
	return []time.Duration{verifyWait, w}
}

// stallWaitLocked returns how long the server has to answer the PING of
// a stall's verification before it is taken as down: verifyWait, or twice
// its recent slowest batch time if longer, at most maxVerifyWait; and at
// least half of Config.Bound, so that a server whose round trip rose
// within what the callers' bound allows is not taken for one that
// stopped, while one that stopped is found before the first calls of the
// stalled batch reach that bound.
func (d *dest) stallWaitLocked() time.Duration {
	w := min(max(verifyWait, 2*d.peak), maxVerifyWait)
	if b := d.p.cfg.Bound; b > 0 {
		w = max(w, b/2)
	}
	return w
}

// onTimer runs when the lane's batch has been out for spreadAfter, when
// calls that wait may be owed an extra lane (see spreadLocked), or may
// have reached its stall threshold. The destination is marked down only
// if its server does not answer a verification either (see verify.go),
// and slow if it answers later than the slow round trip; if it answers in
// time, the batches outstanding are late, not lost, and get another stall
// threshold.
func (l *lane) onTimer() {
	d := l.d
	d.mu.Lock()
	if !l.busy || l.stalled || d.state != up || d.closed {
		d.mu.Unlock()
		return
	}
	now := time.Now()
	d.spreadLocked(now)
	// The timer fires again at the batch's spreadAfter, if that is still
	// to come (a firing meant for an earlier batch came late), and at its
	// stall threshold.
	next := l.due
	if s := l.start.Add(spreadAfter); d.extra > 0 && s.After(now) && (next.IsZero() || s.Before(next)) {
		next = s
	}
	if next.IsZero() {
		// Stalls are not detected.
		d.mu.Unlock()
		return
	}
	if wait := next.Sub(now); wait > 0 {
		// Not yet due: the batch is only spreadAfter old, or the timer
		// was armed for an earlier batch, or the batch was given more
		// time.
		d.mu.Unlock()
		l.timer.Reset(wait)
		return
	}
	if now.Sub(l.due) > lagTolerance {
		// The timer itself fired late: this process is short of CPU.
		d.lateAt = now
	}
	if d.verifying {
		// Another lane's timer is verifying the server; its verdict
		// holds for this batch too. Look again once it is in.
		l.due = now.Add(lagTolerance)
		d.mu.Unlock()
		l.timer.Reset(lagTolerance)
		return
	}
	d.verifying = true
	n, took := len(l.batch), now.Sub(l.start)
	marks := d.stallMarksLocked()
	d.mu.Unlock()

	v := d.verify(now.Add(-lagTolerance), marks...)

	d.mu.Lock()
	d.verifying = false
	if !v.answered {
		d.mu.Unlock()
		d.markStalled(fmt.Errorf("%w: %d calls outstanding for %s, and %s", ErrStalled, n, took.Round(time.Millisecond), v.describe()))
		return
	}
	if s := d.p.slowRoundTrip; s > 0 && !v.answeredWithin(s) {
		d.mu.Unlock()
		d.markSlow(v.seen, fmt.Errorf("%w: %d calls outstanding for %s, and %s", ErrSlow, n, took.Round(time.Millisecond), v.describeSlow(s)))
		return
	}
	// The server answers in time: whatever keeps the replies of the
	// batches outstanding, it is not the server being down; if it
	// answered at once, it is this process being late to read them.
	now = time.Now()
	if v.answeredWithin(verifyWait) {
		d.lateAt = now
	}
	thr := d.stallThresholdLocked()
	var again []*lane
	for _, o := range d.lanes {
		if o.busy && !o.stalled && !o.due.After(now) {
			o.due = now.Add(thr)
			again = append(again, o)
		}
	}
	d.mu.Unlock()
	for _, o := range again {
		o.timer.Reset(thr)
	}
}

// maxOverrun bounds how long a call may wait past its deadline (that of
// RunBy) for a reply that this process is late to read (see call.wait).
const maxOverrun = time.Second

// overrunStep is how long a call waits on past its deadline before
// overrun is asked again.
const overrunStep = MinStallThreshold

// overrunSlack is how long a call past its deadline, and past this
// process's lag, waits for the verdict of a verification.
const overrunSlack = 15 * time.Millisecond

// starvedLag is the scheduling lag past which this process counts as
// short of CPU at a call's deadline (see overrun): the slack of the bound
// a user sets, which goroutines released at once by a burst of requests
// can take up on a busy machine without this process starving.
const starvedLag = 25 * time.Millisecond

// overrun reports whether call c, whose deadline has passed and whose
// timer was due at fired and ran at now, may wait on for a reply that
// has most likely come but is not read yet, and for how long before it
// asks again. That is a reply the server sent before it answered a PING
// written after c was sent. A call still queued for a lane (all of them
// busy) has no reply yet: it waits on only while this process is short of
// CPU. Until such an answer is known, the call waits for one (the caller
// verifies the server itself, or waits for the verification under way)
// for as long as its wait past the deadline stays within this process's
// lag (the runtime's recent scheduling latency, or the lateness of the
// call's own timer) plus overrunSlack; if that lag is more than
// starvedLag, this process is short of CPU, its verifications are late
// too: the wait is twice the lag plus overrunSlack, and within it an
// answer to a PING written up to lateRecent before the call was sent
// counts as well. A server that answers later than the deadline, slow or
// not, thus leaves the call to end at it, give or take twice this
// process's lag and overrunSlack. It is false when stall detection is
// off, and from maxOverrun past the deadline.
func (d *dest) overrun(c *call, fired, now time.Time) (time.Duration, bool) {
	over := now.Sub(c.deadline)
	if over >= maxOverrun {
		return 0, false
	}
	lag := max(d.p.lag(now), now.Sub(fired))
	starved := lag > starvedLag
	d.mu.Lock()
	thr := d.stallThresholdLocked()
	late := starved || now.Sub(d.lateAt) < lateRecent
	if d.state != up || d.closed || thr <= 0 {
		d.mu.Unlock()
		return 0, false
	}
	d.mu.Unlock()
	since := time.Unix(0, c.sent.Load())
	if c.sent.Load() == 0 {
		if !late && !d.p.busy(now) {
			return 0, false
		}
		since = c.queued
	}
	until := c.deadline.Add(lag + overrunSlack)
	if starved {
		// The verification that would find the answer runs late too,
		// by as much again.
		until = until.Add(lag)
	}
	if d.awaitAnswer(since, until, c.done) {
		return overrunStep, true
	}
	// Short of CPU, the verifications are late too: an answer to a PING
	// written shortly before the call was sent counts as well, but only
	// within the same bound (such a PING may have been answered just
	// before the server slowed down, which says nothing of this call's
	// reply).
	if t := time.Now(); starved && t.Before(until) && d.answeredAt.Load() >= since.Add(-lateRecent).UnixNano() {
		return min(overrunStep, until.Sub(t)), true
	}
	return 0, false
}

// noteLate records that this process was seen late to read replies.
func (d *dest) noteLate() {
	d.mu.Lock()
	d.lateAt = time.Now()
	d.mu.Unlock()
}

// describe says, for the cause of a stall, what the verification found.
func (v verdict) describe() string {
	if v.err != nil {
		return fmt.Sprintf("no PING could be sent to it (%v)", v.err)
	}
	return fmt.Sprintf("no answer to a PING within %s", v.beyond.Round(time.Millisecond))
}

// describeSlow says, for the cause of a server found slow, what the
// verification found, s being the slow round trip.
func (v verdict) describeSlow(s time.Duration) string {
	return fmt.Sprintf("a PING answered after more than %s (within %s), longer than the %s a server that is up may take",
		v.beyond.Round(time.Millisecond), v.within.Round(time.Millisecond), s)
}

// markDown marks the destination down for cause, unless it is already
// (see setState).
func (d *dest) markDown(cause error) { d.setState(down, 0, cause) }

// markSlow marks the destination slow for cause, its server taking trip
// to answer, unless it is already (see setState).
func (d *dest) markSlow(trip time.Duration, cause error) { d.setState(slow, trip, cause) }

// markStalled marks the destination down for cause, a PING unanswered
// after a stall, unless it is down or slow already: a server known to
// answer late is not taken as down for not answering within a stall's
// wait (only a probe, which waits longer, or a connection error, tells).
func (d *dest) markStalled(cause error) {
	d.mu.Lock()
	isSlow := d.state == slow
	d.mu.Unlock()
	if !isSlow {
		d.markDown(cause)
	}
}

// markUp marks the destination up, unless it is already.
func (d *dest) markUp() { d.setState(up, 0, nil) }

// setState moves the destination to state to, for cause (for slow, its
// server taking trip to answer), unless it is there already or closed. A
// destination that leaves up fails every call queued or in flight to it,
// but, going slow, those that can wait for its server (patientLocked);
// lanes stuck in a batch are replaced, so that the destination can be
// used as soon as it is up again, and it is probed until it is.
func (d *dest) setState(to health, trip time.Duration, cause error) {
	d.mu.Lock()
	if to == slow {
		d.slowTrip = max(trip, d.p.slowRoundTrip)
	}
	if d.state == to || d.closed {
		d.mu.Unlock()
		return
	}
	from := d.state
	d.state = to
	if to == up {
		d.downErr = nil
		d.events = append(d.events, event{up: true})
		d.mu.Unlock()
		d.deliver()
		return
	}
	err := &unavailableError{dest: d.name, slow: to == slow, cause: cause}
	d.downErr = err
	d.events = append(d.events, event{up: false, cause: cause})
	if from != up {
		// Calls fail at once already, and a probe runs.
		d.mu.Unlock()
		d.deliver()
		return
	}
	now := time.Now()
	var queued, inflight []*call
	kept := d.queue[:0]
	for _, c := range d.queue {
		if d.patientLocked(c, now) {
			kept = append(kept, c)
		} else {
			queued = append(queued, c)
		}
	}
	clear(d.queue[len(kept):])
	d.queue = kept
	stalled := 0
	for _, l := range d.lanes {
		if l.stalled {
			stalled++
		} else if l.busy {
			l.stalled = true
			d.healthy--
			stalled++
			for _, c := range l.batch {
				if d.patientLocked(c, now) {
					continue // answered when the server answers
				}
				// The lane may release its reference as soon as d.mu is
				// unlocked; hold one so that the call is not recycled
				// before it is completed below.
				c.refs.Add(1)
				inflight = append(inflight, c)
			}
		}
	}
	for d.healthy < d.inFlight && stalled < maxStalledFactor*d.inFlight {
		d.startLaneLocked()
	}
	if !d.probing {
		d.startProbeLocked()
	} else {
		d.probeReset = true
	}
	d.mu.Unlock()

	for _, c := range queued {
		c.complete(nil, err)
		c.release()
	}
	for _, c := range inflight {
		c.complete(nil, err)
		c.release()
	}
	if to == down && d.p.kind == kindCluster {
		d.p.cluster.ReloadState(d.p.ctx)
	}
	d.deliver()
}

// answeredLate records that a batch a stall left outstanding was answered
// after all, took after it was sent: the server is up if it took no longer
// than the slow round trip, and slow, not down, otherwise.
func (d *dest) answeredLate(took time.Duration) {
	s := d.p.slowRoundTrip
	if s <= 0 || took <= s {
		d.markUp()
		return
	}
	d.mu.Lock()
	wasDown := d.state == down
	d.mu.Unlock()
	if wasDown {
		d.markSlow(took, fmt.Errorf("%w: a batch answered after %s, longer than the %s a server that is up may take",
			ErrSlow, took.Round(time.Millisecond), s))
	}
}

// startProbeLocked starts the probe goroutine.
func (d *dest) startProbeLocked() {
	d.probing = true
	d.p.wg.Add(1)
	go d.probe()
}

// probe probes the destination, which is down or slow, until it is up,
// nobody has wanted it for a while, or the Pipeliner is closed.
func (d *dest) probe() {
	defer d.p.wg.Done()
	interval := d.p.cfg.ProbeInterval
	t := time.NewTimer(interval)
	defer t.Stop()
	for {
		select {
		case <-d.p.ctx.Done():
			d.mu.Lock()
			d.probing = false
			d.mu.Unlock()
			return
		case <-t.C:
		}
		d.mu.Lock()
		isDown := d.state == down
		d.mu.Unlock()
		if isDown && d.p.kind == kindCluster {
			// The node may have been replaced by a replica.
			d.p.cluster.ReloadState(d.p.ctx)
		}
		if d.stopProbing() {
			return
		}
		d.probeOnce(max(interval, minProbeTimeout))
		if d.stopProbing() {
			return
		}
		d.mu.Lock()
		if d.probeReset {
			d.probeReset = false
			interval = d.p.cfg.ProbeInterval
		} else {
			interval = min(2*interval, d.p.cfg.MaxProbeInterval)
		}
		d.mu.Unlock()
		t.Reset(interval)
	}
}

// probeOnce asks the server whether it answers, within timeout, and
// marks the destination up if it does. When servers may be slow, the
// question goes first on a watch connection of the probe's own (see
// verify), whose reply
// is read on time however late this process runs: a server that answers
// within the slow round trip is then asked again through the client
// before it is marked up; one that answers later, within slowProbeWait,
// is slow; one that does not, down.
func (d *dest) probeOnce(timeout time.Duration) {
	s := d.p.slowRoundTrip
	if s <= 0 {
		if d.ping(timeout) == nil {
			d.markUp()
		}
		return
	}
	v := d.probeVerify(s, max(timeout, slowProbeWait))
	switch {
	case v.answeredWithin(s):
		if d.ping(timeout) == nil {
			d.markUp()
		}
	case v.answered:
		d.markSlow(v.seen, fmt.Errorf("%w: %s", ErrSlow, v.describeSlow(s)))
	default:
		d.markDown(fmt.Errorf("%w: %s", ErrStalled, v.describe()))
	}
}

// stopProbing reports whether the probe goroutine should end, because the
// destination is up or closed, or nobody has wanted it for dormantAfter;
// if so it is no longer probing.
func (d *dest) stopProbing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.state != up && !d.closed && time.Since(d.lastUse) <= dormantAfter {
		return false
	}
	d.probing, d.probeReset = false, false
	return true
}

// ping checks that the destination's server accepts a connection, with
// the client's own dialer but outside its pool and retries, and then that
// it answers PING.
func (d *dest) ping(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(d.p.ctx, timeout)
	defer cancel()
	c := d.client.Load()
	opt := c.Options()
	if opt.Dialer != nil {
		conn, err := opt.Dialer(ctx, opt.Network, opt.Addr)
		if err != nil {
			return err
		}
		_ = conn.Close()
	}
	return c.Ping(ctx).Err()
}

// deliver reports the pending state changes to Config.OnStateChange, in
// order, unless another goroutine is doing so.
func (d *dest) deliver() {
	fn := d.p.cfg.OnStateChange
	d.mu.Lock()
	if fn == nil {
		d.events = d.events[:0]
	}
	if d.delivering || len(d.events) == 0 {
		d.mu.Unlock()
		return
	}
	d.delivering = true
	for len(d.events) > 0 {
		ev := d.events[0]
		d.events = append(d.events[:0], d.events[1:]...)
		d.mu.Unlock()
		fn(d.name, ev.up, ev.cause)
		d.mu.Lock()
	}
	d.delivering = false
	d.mu.Unlock()
}

// isRedisError reports whether err is an error reply of the server (or
// redis.Nil).
func isRedisError(err error) bool {
	var re redis.Error
	return errors.As(err, &re)
}

// isConnError reports whether err says that the connection to the server
// failed, as opposed to an error reply, a context that ended, an
// exhausted pool or a closed client.
func isConnError(err error) bool {
	if err == nil || isRedisError(err) {
		return false
	}
	var op *net.OpError
	if errors.As(err, &op) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return true
	}
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, redis.ErrPoolTimeout), errors.Is(err, redis.ErrClosed):
		return false
	}
	return true
}

// isRedirect reports whether a Cluster node's error reply asks for the
// call to go elsewhere or later.
func isRedirect(err error) bool {
	if _, ok := redis.IsMovedError(err); ok {
		return true
	}
	if _, ok := redis.IsAskError(err); ok {
		return true
	}
	return redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsReadOnlyError(err)
}
