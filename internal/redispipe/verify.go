package redispipe

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync"
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
// connection, outside the client's pool. The server is down only if no
// byte of a reply has come verifyWait after the PING was written, as a
// read of the socket that does not wait finds at the moment of the
// verdict: however late this process runs, that read sees a reply that
// arrived. The server has verifyWait, or twice its recent slowest batch
// time if longer (a machine short of CPU may not run it at once either),
// at most maxVerifyWait, and as long again as the verifying goroutine
// itself was late to look, up to maxVerifyWait in all.

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
	// seen late to read replies (see tryDirect): a direct call that times
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
	// last is the latest verdict, made with a PING written at lastAt.
	last   verdict
	lastAt time.Time
}

// verdict is the outcome of a verification.
type verdict struct {
	// answered reports whether the server answered the PING within wait;
	// late, that it had when the read that waited for the reply timed
	// out, so that this process was late to run.
	answered, late bool
	wait           time.Duration
	// err is why the PING could not be sent, or the read failed.
	err error
}

// verify asks the destination's server whether it answers, on the watch
// connection, dialing it first if needed (once again if it broke), unless
// the latest verification's PING was written at since or later: its
// verdict then stands. Verifications are made one at a time.
func (d *dest) verify(since time.Time) verdict {
	w := &d.watch
	w.mu.Lock()
	if !w.lastAt.IsZero() && !w.lastAt.Before(since) {
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
	d.mu.Lock()
	wait := min(max(verifyWait, 2*d.peak), maxVerifyWait)
	d.mu.Unlock()
	v := w.verifyLocked(d, wait)
	v.wait = wait
	w.last = v
	lost := w.conn == nil
	w.mu.Unlock()
	if lost {
		d.prepareWatch()
	}
	return v
}

func (w *watch) verifyLocked(d *dest, wait time.Duration) verdict {
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
		v, keep := w.pingLocked(wait)
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

// closeWatch closes the watch connection for good.
func (d *dest) closeWatch() {
	w := &d.watch
	w.mu.Lock()
	w.closed = true
	w.dropLocked()
	w.mu.Unlock()
}

func (w *watch) dialLocked(d *dest) error {
	conn, err := d.dialWatch(watchDialTimeout)
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

// pingLocked sends PING on the watch connection and waits wait for a
// reply. keep reports whether the connection may serve again.
func (w *watch) pingLocked(wait time.Duration) (v verdict, keep bool) {
	plain := w.sock != nil && !w.sealed
	if plain {
		// Bytes of an earlier reply that came late are stale. (A read
		// deadline that passed would fail the read before it is made.)
		_ = w.conn.SetReadDeadline(time.Time{})
		if err := drain(w.sock, w.buf[:]); err != nil {
			return verdict{err: err}, false
		}
	}
	w.lastAt = time.Now()
	if err := w.conn.SetDeadline(w.lastAt.Add(wait)); err != nil {
		return verdict{err: err}, false
	}
	if _, err := w.conn.Write(pingCommand); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// The server does not even read.
			return verdict{}, false
		}
		return verdict{err: err}, false
	}
	n, err := w.conn.Read(w.buf[:])
	if n > 0 {
		// A reply, +PONG or an error such as -NOAUTH: the server answers.
		// The rest of a reply read in part is drained next time, from
		// a plain socket; another connection serves again only whole.
		return verdict{answered: true}, plain || w.buf[n-1] == '\n'
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return verdict{err: err}, false
	}
	if w.sock == nil {
		return verdict{}, false
	}
	// The read timed out, which says nothing if this goroutine was not
	// scheduled before its deadline: look at the socket itself.
	deadline := w.lastAt.Add(wait)
	for {
		_ = w.conn.SetReadDeadline(time.Time{})
		pending, err := peek(w.sock, w.buf[:])
		switch {
		case err != nil:
			return verdict{err: err}, false
		case pending:
			return verdict{answered: true, late: true}, plain
		}
		// Nothing yet. If this goroutine woke late, the machine is short
		// of CPU, and so may the server be: it gets as long again as
		// this goroutine was late, up to maxVerifyWait in all.
		now := time.Now()
		late := now.Sub(deadline)
		if late <= lagTolerance || now.Sub(w.lastAt) >= maxVerifyWait {
			// A late reply is drained before the next PING.
			return verdict{}, plain
		}
		deadline = now.Add(min(late, maxVerifyWait-now.Sub(w.lastAt)))
		_ = w.conn.SetReadDeadline(deadline)
		if n, err := w.conn.Read(w.buf[:]); n > 0 {
			return verdict{answered: true, late: true}, plain || w.buf[n-1] == '\n'
		} else if !errors.Is(err, os.ErrDeadlineExceeded) {
			return verdict{err: err}, false
		}
	}
}
