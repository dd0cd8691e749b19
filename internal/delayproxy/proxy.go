// Package delayproxy is a TCP proxy for tests: it forwards connections
// from a loopback listener to a target address and delays every byte by a
// one-way delay in each direction, which a test may change while
// connections are open, keeping the bytes' order (pipelined commands stay
// pipelined). It can also stop forwarding without closing anything, as
// when a host vanishes and its packets are dropped, and cut the link
// (close every connection). Linux netem would do the same in the kernel;
// it is not available everywhere the tests run.
//
// The proxy runs in a process of its own (the test binary started again,
// see child.go): in the test's process, its goroutines would wait to run
// behind the test's, and a busy test would see a slower link than it set.
//
// It serves the tests of a slow or vanished Redis (a Redis behind a link
// whose delay rises mid-run) and those of regions (package regiontest).
package delayproxy

import (
	"net"
	"strconv"
	"sync"
	"testing"
	"time"
)

// chunk is bytes read from one side, and when they may be written to the
// other: the instant they were read plus the delay then in force.
type chunk struct {
	b       []byte
	release time.Time
}

// Proxy forwards TCP connections from a loopback listener to a target
// address. It is safe for concurrent use.
type Proxy struct {
	// ctl, if not nil, drives the proxy that runs in a process of its
	// own (see child.go); the fields below are then unused.
	ctl *child

	ln     net.Listener
	target string

	mu sync.Mutex
	// delay is the one-way delay of the bytes read from now on.
	delay time.Duration
	// held is set while nothing is forwarded (Stop); changed is closed,
	// and replaced, whenever held changes.
	held    bool
	changed chan struct{}
	// changedAt is when SetDelay, Stop, Cut or Heal last ran.
	changedAt time.Time
	cut       bool
	conns     map[net.Conn]struct{}
	done      chan struct{}
	wg        sync.WaitGroup
}

// New listens on a free loopback port and forwards to target, each byte
// delayed by delay in each direction. The proxy runs in a process of its
// own, this binary started again (see child.go), so that how busy the
// calling process is does not change the delay it sets.
func New(target string, delay time.Duration) (*Proxy, error) {
	c, err := childStart(target, delay)
	if err != nil {
		return nil, err
	}
	return &Proxy{ctl: c}, nil
}

// newLocal is New in this process: the proxy of the child process.
func newLocal(target string, delay time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, delay: delay, changed: make(chan struct{}),
		conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Start is New for a test: it fails tb if the proxy cannot listen, and
// closes the proxy when tb ends.
func Start(tb testing.TB, target string, delay time.Duration) *Proxy {
	tb.Helper()
	p, err := New(target, delay)
	if err != nil {
		tb.Fatalf("delayproxy: %v", err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// Addr is the address clients dial to reach the target through the proxy.
func (p *Proxy) Addr() string {
	if p.ctl != nil {
		return p.ctl.addr
	}
	return p.ln.Addr().String()
}

// Delay returns the one-way delay in force.
func (p *Proxy) Delay() time.Duration {
	if c := p.ctl; c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.delay
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay
}

// SetDelay sets the one-way delay of the bytes read from now on, and
// resumes forwarding if it was stopped. Bytes already read keep the delay
// they were read under, and no byte overtakes an earlier one: when the
// delay falls, new bytes wait behind those still held.
func (p *Proxy) SetDelay(d time.Duration) {
	if c := p.ctl; c != nil {
		c.do("delay " + strconv.FormatInt(int64(d), 10))
		c.mu.Lock()
		c.delay = d
		c.mu.Unlock()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay, p.changedAt = d, time.Now()
	p.setHeldLocked(false)
}

// Stop stops forwarding in both directions without closing any
// connection: bytes are still accepted from each side and held, none is
// delivered, and new connections are accepted and dialed but carry
// nothing, as when the target's host vanishes and its packets are
// dropped. SetDelay resumes forwarding; what was held is then delivered
// at once, in order, as TCP would retransmit it.
func (p *Proxy) Stop() {
	if p.ctl != nil {
		p.ctl.do("stop")
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.changedAt = time.Now()
	p.setHeldLocked(true)
}

func (p *Proxy) setHeldLocked(held bool) {
	if p.held != held {
		p.held = held
		close(p.changed)
		p.changed = make(chan struct{})
	}
}

// state returns whether forwarding is stopped and the channel closed at
// the next change of that.
func (p *Proxy) state() (held bool, changed <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held, p.changed
}

// Cut cuts the link: the connections through it are closed and new ones
// are closed as soon as they are accepted, until Heal.
func (p *Proxy) Cut() {
	if p.ctl != nil {
		p.ctl.do("cut")
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut, p.changedAt = true, time.Now()
	for c := range p.conns {
		_ = c.Close()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	if p.ctl != nil {
		p.ctl.do("heal")
		return
	}
	p.mu.Lock()
	p.cut, p.changedAt = false, time.Now()
	p.mu.Unlock()
}

// ChangedAt returns when the latest SetDelay, Stop, Cut or Heal took
// effect: in the proxy's process, somewhat before the call returned. A
// test that measures from a change measures from this.
func (p *Proxy) ChangedAt() time.Time {
	if c := p.ctl; c != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.changed
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changedAt
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
	if p.ctl != nil {
		return p.ctl.close()
	}
	p.mu.Lock()
	select {
	case <-p.done:
		p.mu.Unlock()
		return nil
	default:
	}
	close(p.done)
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	err := p.ln.Close()
	p.wg.Wait()
	return err
}

// track adds cs to the open connections, or reports false if the link is
// cut or the proxy closed.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
	}
	if p.cut {
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
	p.mu.Unlock()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(c)
	}
}

func (p *Proxy) serve(c net.Conn) {
	defer p.wg.Done()
	if !p.track(c) {
		_ = c.Close()
		return
	}
	u, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil || !p.track(u) {
		if u != nil {
			_ = u.Close()
		}
		p.untrack(c)
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(u, c) }()
	go func() { defer wg.Done(); p.pipe(c, u) }()
	wg.Wait()
	p.untrack(c, u)
}

// pipe copies src to dst through a FIFO that releases each chunk at its
// release instant, or later while forwarding is stopped. When either side
// fails, both are closed.
func (p *Proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				now := time.Now()
				q <- chunk{b: buf[:n], release: now.Add(p.Delay())}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		_ = dst.Close()
		_ = src.Close()
		for range q {
		}
	}()
	var last time.Time
	for ch := range q {
		// No chunk overtakes an earlier one.
		release := ch.release
		if release.Before(last) {
			release = last
		}
		if !p.await(release) {
			return
		}
		last = release
		if _, err := dst.Write(ch.b); err != nil {
			return
		}
	}
}

// await waits until release has passed while forwarding is not stopped,
// and reports false if the proxy was closed first.
func (p *Proxy) await(release time.Time) bool {
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		held, changed := p.state()
		var fire <-chan time.Time
		if !held {
			d := time.Until(release)
			if d <= 0 {
				return true
			}
			if t == nil {
				t = time.NewTimer(d)
			} else {
				t.Reset(d)
			}
			fire = t.C
		}
		select {
		case <-fire:
			return true
		case <-changed:
		case <-p.done:
			return false
		}
	}
}
