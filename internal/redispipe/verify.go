package redispipe

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A batch outstanding for longer than the stall threshold may have been
// lost with its server, or only not read yet: in a process short of CPU,
// the lane that waits for the reply may not have been scheduled although
// the reply sits in its socket. (Go runs goroutines woken by the network
// after those already waiting to run, so callers that never block, such
// as requests a deny cache answers, can keep a lane from its reply for
// hundreds of milliseconds, while timers still fire on time.) So before a
// destination is marked down for a stall, its server gets a second
// question: a PING on a connection of the destination's own, its watch
// connection, outside the client's pool. How soon the reply came is read
// at a few marks after the PING was written (verifyWait, then the marks
// of the question asked: the longest round trip of a server that is up,
// how long the server has to answer at all): at each, a read of the
// socket that does not wait tells whether a byte of the reply has come;
// however late this process runs, that read sees a reply that arrived.
// The reply is taken as come by the first mark at which such a read
// finds it. When this goroutine looks later than a mark (it was not
// scheduled), a reply found then counts for that mark: a process short of
// CPU gives its servers the benefit of the doubt, and a reply not found
// at a mark is certainly later than the mark. A server has, to answer at
// all, the stall verification's wait (see stallWait), and as long again
// as the verifying goroutine itself was late to look, up to
// maxVerifyWait in all (a machine short of CPU may not run the server at
// once either).

const (
	// verifyWait is how long the server has at least to answer the PING
	// of a verification.
	verifyWait = 25 * time.Millisecond
	// maxVerifyWait bounds how long the server has to answer when the
	// goroutine that waits for the answer is itself late to run (see
	// pingLocked).
	maxVerifyWait = 100 * time.Millisecond
	// watchDialTimeout bounds the dial of a watch connection by a
	// verification; prepareDialTimeout, in the background.
	watchDialTimeout   = 100 * time.Millisecond
	prepareDialTimeout = time.Second
	// lateFor is how long direct calls stay off after this process was
	// seen late to read replies (see directLocked): a direct call that times
	// out loses its reply with its connection.
	lateFor = 2 * time.Second
)

var pingCommand = []byte("*1\r\n$4\r\nPING\r\n")

// errNoDialer is the reason a verification fails with a client without a
// dialer.
var errNoDialer = errors.New("redispipe: the client has no dialer")

// watch is a destination's watch connection.
type watch struct {
	// mu is held by the goroutine that verifies.
	mu   sync.Mutex
	conn net.Conn
	// sock is the socket under conn, or nil if conn has none this package
	// can read without waiting; sealed is set when conn encrypts, so that
	// bytes on sock are records still to decrypt.
	sock   syscall.RawConn
	sealed bool
	// dialing is set while prepareWatch dials; dialed is closed when it
	// is done.
	dialing bool
	dialed  chan struct{}
	closed  bool
	buf     [256]byte

	// done is closed, and replaced, when a verification ends.
	done atomic.Pointer[chan struct{}]
	// dialTimeout bounds the dials of verifications (zero means
	// watchDialTimeout).
	dialTimeout time.Duration
	// last is the latest verdict, made with a PING written at lastAt.
	last   verdict
	lastAt time.Time
}

// verdict is the outcome of a verification.
type verdict struct {
	// answered reports whether the server answered the PING by the last
	// mark; within is then the first mark by which it had (a reply found
	// by a look later than the mark counts for the mark), and late is set
	// when that look was late.
	answered, late bool
	within         time.Duration
	// seen is how long after the PING the look that found its reply was
	// made: at least the round trip.
	seen time.Duration
	// beyond is how long after the PING no reply had come yet, for
	// certain: for a PING not answered, the wait it had.
	beyond time.Duration
	// err is why the PING could not be sent, or the read failed.
	err error
}

// answeredWithin reports whether the verdict says the server answered
// within x: true if it did by a mark no later than x, false if it had not
// by x or later (or never did); for an x between the marks the verdict
// saw, whether it had by the next mark.
func (v verdict) answeredWithin(x time.Duration) bool {
	return v.answered && v.within <= x || v.answered && v.beyond < x
}

// verify asks the destination's server whether it answers, with a PING
// on the watch connection read at verifyWait and at each of marks
// (increasing; the last is how long the server has), dialing the
// connection first if needed (once again if it broke), unless the latest
// verification's PING was written at since or later and its verdict
// settles the question: a reply seen, or none by the last of marks. The
// verdict then stands. Verifications are made one at a time.
func (d *dest) verify(since time.Time, marks ...time.Duration) verdict {
	d.watch.mu.Lock()
	return d.verifyHeld(&d.watch, since, withFirstMark(marks))
}

// awaitAnswer reports whether the server answered a PING written at since
// or later: as the latest verification found, or as the one under way
// finds if it ends by until (one the caller starts, if none is). It
// returns by until whatever the verification's own wait: a verification
// the caller starts runs on, for whoever asks next. It returns true at
// once when done, the channel of the call that asks (see call.wait),
// receives: the call has its outcome (its reply, or the error of a
// server found down), which it then reads without waiting; the value
// received is sent back for it.
func (d *dest) awaitAnswer(since, until time.Time, done chan struct{}) bool {
	w := &d.watch
	for started := false; ; {
		if d.answeredAt.Load() >= since.UnixNano() {
			return true
		}
		if started {
			return false // the verification this call started found no answer
		}
		ended := w.done.Load()
		if w.mu.TryLock() {
			if w.conn != nil || !w.dialing {
				// The channel the verification started here closes (the
				// one loaded above may be an earlier one's).
				ended = w.done.Load()
				started = true
				d.p.wg.Add(1)
				go func() {
					defer d.p.wg.Done()
					d.verifyHeld(w, since, []time.Duration{verifyWait})
				}()
			} else {
				w.mu.Unlock()
			}
		}
		wait := time.Until(until)
		if wait <= 0 || ended == nil {
			return false
		}
		t := time.NewTimer(wait)
		select {
		case <-*ended:
		case <-t.C:
		case v := <-done:
			t.Stop()
			done <- v
			return true
		}
		t.Stop()
	}
}

// probeVerify is verify on the probe's own connection, which a probe
// waits on for up to slowProbeWait without holding up the verifications
// of stalls and deadlines.
func (d *dest) probeVerify(marks ...time.Duration) verdict {
	d.probeWatch.mu.Lock()
	return d.verifyHeld(&d.probeWatch, time.Now(), withFirstMark(marks))
}

// verifyHeld is verify on w, whose mu the caller holds; it unlocks it.
func (d *dest) verifyHeld(w *watch, since time.Time, marks []time.Duration) verdict {
	patience := marks[len(marks)-1]
	if !w.lastAt.IsZero() && !w.lastAt.Before(since) && (w.last.answered || w.last.beyond >= patience) {
		v := w.last
		w.mu.Unlock()
		return v
	}
	if w.conn == nil && w.dialing {
		// The background dial is under way: its deadline is a long one,
		// which a process short of CPU needs; a dial of our own would
		// have a short one.
		dialed := w.dialed
		w.mu.Unlock()
		t := time.NewTimer(prepareDialTimeout)
		select {
		case <-dialed:
		case <-t.C:
		case <-d.p.ctx.Done():
		}
		t.Stop()
		w.mu.Lock()
	}
	v := w.verifyLocked(d, marks)
	w.last = v
	if v.answered {
		d.answeredAt.Store(w.lastAt.UnixNano())
	}
	lost := w.conn == nil && w == &d.watch
	next := make(chan struct{})
	if done := w.done.Swap(&next); done != nil {
		close(*done)
	}
	w.mu.Unlock()
	if lost {
		d.prepareWatch()
	}
	return v
}

// withFirstMark returns marks (increasing) with verifyWait first, so that
// every verdict tells whether the server answered within verifyWait.
func withFirstMark(marks []time.Duration) []time.Duration {
	if len(marks) > 0 && marks[0] == verifyWait {
		return marks
	}
	out := make([]time.Duration, 0, len(marks)+1)
	out = append(out, verifyWait)
	for _, m := range marks {
		if m > out[len(out)-1] {
			out = append(out, m)
		}
	}
	return out
}

func (w *watch) verifyLocked(d *dest, marks []time.Duration) verdict {
	for attempt := 0; ; attempt++ {
		if w.closed {
			return verdict{err: ErrClosed}
		}
		fresh := w.conn == nil
		if fresh {
			w.lastAt = time.Now()
			if err := w.dialLocked(d); err != nil {
				return verdict{err: err}
			}
		}
		v, keep := w.pingLocked(marks)
		if !keep {
			w.dropLocked()
		}
		if v.err == nil || fresh || attempt > 0 {
			return v
		}
		// The connection broke since the last verification (a server
		// that closes idle connections, or a restart): dial again.
	}
}

// prepareWatch dials the watch connection in the background, unless it
// is up or being dialed, so that a verification under load seldom has to
// dial (a dial's deadline says little in a process short of CPU).
func (d *dest) prepareWatch() {
	w := &d.watch
	w.mu.Lock()
	if w.conn != nil || w.dialing || w.closed {
		w.mu.Unlock()
		return
	}
	w.dialing = true
	dialed := make(chan struct{})
	w.dialed = dialed
	w.mu.Unlock()
	d.p.wg.Add(1)
	go func() {
		defer d.p.wg.Done()
		conn, err := d.dialWatch(prepareDialTimeout)
		w.mu.Lock()
		defer w.mu.Unlock()
		w.dialing = false
		close(dialed)
		if err != nil {
			return
		}
		if w.conn != nil || w.closed {
			_ = conn.Close()
			return
		}
		w.setLocked(conn)
	}()
}

// closeWatch closes the watch connection, and the probe's, for good.
func (d *dest) closeWatch() {
	for _, w := range []*watch{&d.watch, &d.probeWatch} {
		w.mu.Lock()
		w.closed = true
		w.dropLocked()
		w.mu.Unlock()
	}
}

func (w *watch) dialLocked(d *dest) error {
	timeout := w.dialTimeout
	if timeout == 0 {
		timeout = watchDialTimeout
	}
	conn, err := d.dialWatch(timeout)
	if err != nil {
		return err
	}
	w.setLocked(conn)
	return nil
}

// dialWatch dials a watch connection with the client's dialer.
func (d *dest) dialWatch(timeout time.Duration) (net.Conn, error) {
	opt := d.client.Load().Options()
	if opt.Dialer == nil {
		return nil, errNoDialer
	}
	ctx, cancel := context.WithTimeout(d.p.ctx, timeout)
	defer cancel()
	return opt.Dialer(ctx, opt.Network, opt.Addr)
}

func (w *watch) setLocked(conn net.Conn) {
	w.conn = conn
	w.sock, w.sealed = socketOf(conn)
}

func (w *watch) dropLocked() {
	if w.conn != nil {
		_ = w.conn.Close()
	}
	w.conn, w.sock, w.sealed = nil, nil, false
}

// socketOf returns the socket under c, if it has one, and whether c
// encrypts what goes through it.
func socketOf(c net.Conn) (sock syscall.RawConn, sealed bool) {
	if t, ok := c.(*tls.Conn); ok {
		c, sealed = t.NetConn(), true
	}
	if s, ok := c.(syscall.Conn); ok && canPeek {
		if r, err := s.SyscallConn(); err == nil {
			return r, sealed
		}
	}
	return nil, sealed
}

// pingLocked sends PING on the watch connection and reads its reply at
// each of marks after it was written (see verdict). keep reports whether
// the connection may serve again: not after a PING left unanswered,
// whose late reply could be taken for the next one's.
func (w *watch) pingLocked(marks []time.Duration) (v verdict, keep bool) {
	plain := w.sock != nil && !w.sealed
	if plain {
		// Bytes of an earlier reply that came late are stale. (A read
		// deadline that passed would fail the read before it is made.)
		_ = w.conn.SetReadDeadline(time.Time{})
		if err := drain(w.sock, w.buf[:]); err != nil {
			return verdict{err: err}, false
		}
	}
	patience := marks[len(marks)-1]
	w.lastAt = time.Now()
	if err := w.conn.SetDeadline(w.lastAt.Add(patience)); err != nil {
		return verdict{err: err}, false
	}
	if _, err := w.conn.Write(pingCommand); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The server does not even read.
			return verdict{beyond: patience}, false
		}
		return verdict{err: err}, false
	}
	// The marks count from the moment the PING was written, which may be
	// later than lastAt in a process short of CPU.
	sent := time.Now()
	// got returns the verdict of a reply seen at a mark.
	got := func(mark time.Duration, late bool, n int) (verdict, bool) {
		// A reply, +PONG or an error such as -NOAUTH: the server
		// answers. The rest of a reply read in part is drained next
		// time, from a plain socket; another connection serves again
		// only whole.
		return verdict{answered: true, late: late, within: mark, beyond: v.beyond, seen: time.Since(sent)},
			plain || n < 0 || w.buf[n-1] == '\n'
	}
	for _, mark := range marks {
		if mark <= v.beyond {
			continue // known to have had no reply by then
		}
		deadline := sent.Add(mark)
		_ = w.conn.SetReadDeadline(deadline)
		n, err := w.conn.Read(w.buf[:])
		if n > 0 {
			return got(mark, false, n)
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			return verdict{err: err}, false
		}
		if w.sock == nil {
			v.beyond = mark
			continue
		}
		// The read timed out, which says nothing if this goroutine was
		// not scheduled before its deadline: look at the socket itself.
		_ = w.conn.SetReadDeadline(time.Time{})
		now := time.Now()
		pending, err := peek(w.sock, w.buf[:])
		switch {
		case err != nil:
			return verdict{err: err}, false
		case pending:
			return got(mark, now.Sub(deadline) > lagTolerance, -1)
		}
		v.beyond = now.Sub(sent)
	}
	// Nothing by the last mark. If this goroutine woke late, the machine
	// is short of CPU, and so may the server be: it gets as long again as
	// this goroutine was late, up to maxVerifyWait in all.
	deadline := sent.Add(patience)
	for w.sock != nil {
		now := time.Now()
		late := now.Sub(deadline)
		if late <= lagTolerance || now.Sub(sent) >= maxVerifyWait {
			break
		}
		deadline = now.Add(min(late, maxVerifyWait-now.Sub(sent)))
		_ = w.conn.SetReadDeadline(deadline)
		if n, err := w.conn.Read(w.buf[:]); n > 0 {
			return got(patience, true, n)
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			return verdict{err: err}, false
		}
		_ = w.conn.SetReadDeadline(time.Time{})
		now = time.Now()
		if pending, err := peek(w.sock, w.buf[:]); err != nil {
			return verdict{err: err}, false
		} else if pending {
			return got(patience, true, -1)
		}
		v.beyond = now.Sub(sent)
	}
	v.beyond = max(v.beyond, patience)
	return v, false
}
