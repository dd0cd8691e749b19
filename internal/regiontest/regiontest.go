// Package regiontest simulates regions on one machine for tests and the
// regions benchmark: a redis-server per region (started by
// internal/redistest) and, between each region and each peer's Redis, a
// Proxy (package delayproxy) that delays every byte by a one-way delay in
// each direction, keeps their order (pipelined commands stay pipelined),
// and can slow down, stop forwarding, cut the link and heal it.
package regiontest

import (
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// The regions of the design notes' scenario.
const (
	USEast1      = "us-east-1"
	EUWest1      = "eu-west-1"
	APSoutheast1 = "ap-southeast-1"
)

// Names are the three regions, in order.
var Names = []string{USEast1, EUWest1, APSoutheast1}

// NotesDelays are the one-way delays of the design notes' scenario: about
// 40 ms between us-east-1 and eu-west-1, 90 ms between eu-west-1 and
// ap-southeast-1, 120 ms between us-east-1 and ap-southeast-1.
func NotesDelays(a, b string) time.Duration {
	return ScaledDelays(1)(a, b)
}

// ScaledDelays returns the notes' delays divided by div, for tests that
// keep the proportions with smaller delays.
func ScaledDelays(div int) func(a, b string) time.Duration {
	return func(a, b string) time.Duration {
		pair := map[[2]string]time.Duration{
			{USEast1, EUWest1}:      40 * time.Millisecond,
			{EUWest1, APSoutheast1}: 90 * time.Millisecond,
			{USEast1, APSoutheast1}: 120 * time.Millisecond,
		}
		if d, ok := pair[[2]string{a, b}]; ok {
			return d / time.Duration(div)
		}
		return pair[[2]string{b, a}] / time.Duration(div)
	}
}

// Sim is the regions of a test: a Redis per region and a proxy from each
// region to each peer's Redis.
type Sim struct {
	Names   []string
	Servers map[string]*redistest.Server
	// Links[from][to] is the proxy region from dials to reach to's Redis.
	Links map[string]map[string]*Proxy
	// delay is the one-way delay of each link, which Heal restores.
	delay func(a, b string) time.Duration
}

// New starts a redis-server per region of names and a proxy from each
// region to each other region's Redis, delayed by delay(from, to); all are
// stopped when the test ends.
func New(t testing.TB, names []string, delay func(a, b string) time.Duration) *Sim {
	t.Helper()
	s := &Sim{Names: names, Servers: map[string]*redistest.Server{}, Links: map[string]map[string]*Proxy{}, delay: delay}
	for _, n := range names {
		s.Servers[n] = redistest.Standalone(t)
	}
	for _, a := range names {
		s.Links[a] = map[string]*Proxy{}
		for _, b := range names {
			if a == b {
				continue
			}
			p, err := NewProxy(s.Servers[b].Addr(), delay(a, b))
			if err != nil {
				t.Fatalf("regiontest: %v", err)
			}
			t.Cleanup(func() { _ = p.Close() })
			s.Links[a][b] = p
		}
	}
	return s
}

// Local returns a client of region r's own Redis.
func (s *Sim) Local(t testing.TB, r string) *redis.Client {
	return s.Servers[r].Client(t, nil)
}

// Peers returns region r's clients of the other regions' Redis, through
// the proxies, keyed by region. Commands fail fast while a link is cut;
// a command that meets a connection the cut closed is retried on another.
// Each client has a pool of 256 connections, so that requests that wait a
// cross-region round trip do not also queue for a connection, and sends
// no CLIENT SETINFO on a new connection, as docs/regions.md advises.
func (s *Sim) Peers(t testing.TB, r string) map[string]redis.UniversalClient {
	t.Helper()
	out := map[string]redis.UniversalClient{}
	for b, p := range s.Links[r] {
		c := redis.NewClient(&redis.Options{Addr: p.Addr(), PoolSize: 256, DisableIdentity: true, MaxRetries: 3, MinRetryBackoff: time.Millisecond, MaxRetryBackoff: 5 * time.Millisecond, DialTimeout: time.Second, ReadTimeout: 2 * time.Second})
		t.Cleanup(func() { _ = c.Close() })
		out[b] = c
	}
	return out
}

// Partition cuts every link between region r and the others, both ways.
// It returns when every link is cut, with the instant the last was.
func (s *Sim) Partition(r string) time.Time {
	return s.change(r, func(p *Proxy, _ time.Duration) { p.Cut() })
}

// SlowDown delays every byte between region r and the others by d each
// way instead of the links' own delay, until Heal: a peer that answers,
// but late. It returns the instant the last link slowed down.
func (s *Sim) SlowDown(r string, d time.Duration) time.Time {
	return s.change(r, func(p *Proxy, _ time.Duration) { p.SetDelay(d) })
}

// Drop stops every link between region r and the others from carrying
// anything, without closing a connection, until Heal: a region whose
// packets are dropped. It returns the instant the last link stopped.
func (s *Sim) Drop(r string) time.Time {
	return s.change(r, func(p *Proxy, _ time.Duration) { p.Stop() })
}

// Heal heals every link between region r and the others: cut, slowed
// down or dropping, each carries again with its own delay. It returns the
// instant the last link was healed, from which a test measures what
// healing takes.
func (s *Sim) Heal(r string) time.Time {
	return s.change(r, func(p *Proxy, own time.Duration) {
		p.Heal()
		p.SetDelay(own)
	})
}

// change applies do to every link between region r and the others, both
// ways, at once (each proxy runs in a process of its own, see package
// delayproxy, and answers in its own time), with each link's own delay,
// and returns when the last change took effect.
func (s *Sim) change(r string, do func(p *Proxy, own time.Duration)) time.Time {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var last time.Time
	apply := func(p *Proxy, own time.Duration) {
		defer wg.Done()
		do(p, own)
		at := p.ChangedAt()
		mu.Lock()
		if at.After(last) {
			last = at
		}
		mu.Unlock()
	}
	for b, p := range s.Links[r] {
		wg.Add(2)
		go apply(p, s.delay(r, b))
		go apply(s.Links[b][r], s.delay(b, r))
	}
	wg.Wait()
	return last
}
