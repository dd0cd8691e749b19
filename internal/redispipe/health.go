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
	// dormantAfter is how long a destination that is down keeps being
	// probed without calls for it; the next call restarts the probes.
	dormantAfter = 10 * time.Second
	// minProbeTimeout bounds a probe's dial and PING from below; a probe
	// never waits longer than the interval after it or this, whichever is
	// longer, except for a read from a client that ignores deadlines.
	minProbeTimeout = 250 * time.Millisecond
	// lagTolerance is how late a stall timer may fire before this process
	// is taken as short of CPU.
	lagTolerance = 5 * time.Millisecond
)

// unavailableError is the error of calls for a destination that is down.
type unavailableError struct {
	dest  string
	cause error
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("redispipe: %s unavailable: %v", e.dest, e.cause)
}

// Is reports whether target is ErrUnavailable.
func (e *unavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the reason the destination went down.
func (e *unavailableError) Unwrap() error { return e.cause }

// onTimer runs when the lane's batch may have reached its stall threshold.
// The destination is marked down only if its server does not answer a
// verification either (see verify.go); if it does, the batches
// outstanding are late, not lost, and get another stall threshold.
func (l *lane) onTimer() {
	d := l.d
	d.mu.Lock()
	if !l.busy || l.stalled || d.down || d.closed {
		d.mu.Unlock()
		return
	}
	now := time.Now()
	if wait := l.due.Sub(now); wait > 0 {
		// The timer was armed for an earlier batch, or the batch was
		// given more time.
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
	d.mu.Unlock()

	v := d.verify(now.Add(-lagTolerance))

	d.mu.Lock()
	d.verifying = false
	if !v.answered {
		d.mu.Unlock()
		d.markDown(fmt.Errorf("%w: %d calls outstanding for %s, and %s", ErrStalled, n, took.Round(time.Millisecond), v.describe()))
		return
	}
	// The server answers: whatever keeps the replies of the batches
	// outstanding (this process being late to read them, most likely),
	// it is not the server being down.
	now = time.Now()
	d.lateAt = now
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
// RunBy) while its destination's server answers (see call.wait).
const maxOverrun = time.Second

// answering reports whether the destination is up and its server answered
// a verification lately (within the stall threshold), asking it now if
// not. A server that does not answer is marked down. It is false when
// stall detection is off.
func (d *dest) answering() bool {
	d.mu.Lock()
	thr := d.stallThresholdLocked()
	if d.down || d.closed || thr <= 0 {
		d.mu.Unlock()
		return false
	}
	d.mu.Unlock()
	now := time.Now()
	v := d.verify(now.Add(-thr))
	if !v.answered {
		if d.p.ctx.Err() == nil {
			d.markDown(fmt.Errorf("%w: a call outstanding past its deadline, and %s", ErrStalled, v.describe()))
		}
		return false
	}
	d.noteLate()
	return true
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
	return fmt.Sprintf("no answer to a PING within %s", v.wait)
}

// markDown marks the destination down for cause, unless it is already,
// and fails every call queued or in flight to it. Lanes stuck in a batch
// are replaced, so that the destination can be used as soon as it is up.
func (d *dest) markDown(cause error) {
	d.mu.Lock()
	if d.down || d.closed {
		d.mu.Unlock()
		return
	}
	err := &unavailableError{dest: d.name, cause: cause}
	d.down, d.downErr = true, err
	queued := d.queue
	d.queue = nil
	var inflight []*call
	stalled := 0
	for _, l := range d.lanes {
		if l.stalled {
			stalled++
		} else if l.busy {
			l.stalled = true
			d.healthy--
			stalled++
			for _, c := range l.batch {
				// The lane may release its reference as soon as d.mu is
				// unlocked; hold one so that the call is not recycled
				// before it is completed below.
				c.refs.Add(1)
				inflight = append(inflight, c)
			}
		}
	}
	for d.healthy < d.p.cfg.MaxInFlight && stalled < maxStalledFactor*d.p.cfg.MaxInFlight {
		d.startLaneLocked()
	}
	if !d.probing {
		d.startProbeLocked()
	} else {
		d.probeReset = true
	}
	d.events = append(d.events, event{up: false, cause: cause})
	d.mu.Unlock()

	for _, c := range queued {
		c.complete(nil, err)
		c.release()
	}
	for _, c := range inflight {
		c.complete(nil, err)
		c.release()
	}
	if d.p.kind == kindCluster {
		d.p.cluster.ReloadState(d.p.ctx)
	}
	d.deliver()
}

// markUp marks the destination up, unless it is already.
func (d *dest) markUp() {
	d.mu.Lock()
	if !d.down || d.closed {
		d.mu.Unlock()
		return
	}
	d.down, d.downErr = false, nil
	d.events = append(d.events, event{up: true})
	d.mu.Unlock()
	d.deliver()
}

// startProbeLocked starts the probe goroutine.
func (d *dest) startProbeLocked() {
	d.probing = true
	d.p.wg.Add(1)
	go d.probe()
}

// probe probes the destination, which is down, until it is up, nobody
// has wanted it for a while, or the Pipeliner is closed.
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
		if d.p.kind == kindCluster {
			// The node may have been replaced by a replica.
			d.p.cluster.ReloadState(d.p.ctx)
		}
		if d.stopProbing() {
			return
		}
		if d.ping(max(interval, minProbeTimeout)) == nil {
			d.markUp()
		}
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

// stopProbing reports whether the probe goroutine should end, because the
// destination is up or closed, or nobody has wanted it for dormantAfter;
// if so it is no longer probing.
func (d *dest) stopProbing() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.down && !d.closed && time.Since(d.lastUse) <= dormantAfter {
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
