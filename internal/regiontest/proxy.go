// Package regiontest simulates regions on one machine for tests and the
// regions benchmark: a redis-server per region (started by
// internal/redistest) and, between each region and each peer's Redis, a
// Proxy that delays every chunk of bytes by a fixed one-way delay in each
// direction, keeps their order (pipelined commands stay pipelined), and
// can cut the link and heal it. Linux netem would do the same in the
// kernel; it is not available everywhere the tests run.
package regiontest

import (
	"net"
	"sync"
	"time"
)

// chunk is bytes read from one side, and when they arrived.
type chunk struct {
	b  []byte
	at time.Time
}

// Proxy forwards TCP connections from a loopback listener to a target
// address, delaying each direction by Delay. It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	delay  time.Duration

	mu    sync.Mutex
	cut   bool
	conns map[net.Conn]struct{}
	done  chan struct{}
	wg    sync.WaitGroup
}

// NewProxy listens on a free loopback port and forwards to target, each
// chunk released delay after it arrived, in each direction.
func NewProxy(target string, delay time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, delay: delay, conns: map[net.Conn]struct{}{}, done: make(chan struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial to reach the target through the proxy.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Delay is the proxy's one-way delay.
func (p *Proxy) Delay() time.Duration { return p.delay }

// Cut cuts the link: the connections through it are closed and new ones
// are closed as soon as they are accepted, until Heal.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for c := range p.conns {
		_ = c.Close()
	}
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() error {
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

// track adds c to the open connections, or reports false if the link is
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

// pipe copies src to dst through a FIFO that releases each chunk delay
// after it was read. When either side fails, both are closed.
func (p *Proxy) pipe(dst, src net.Conn) {
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{b: buf[:n], at: time.Now()}
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
	for ch := range q {
		if d := time.Until(ch.at.Add(p.delay)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-p.done:
				t.Stop()
				return
			}
		}
		if _, err := dst.Write(ch.b); err != nil {
			return
		}
	}
}
