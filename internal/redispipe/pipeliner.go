// Package redispipe runs Lua scripts on Redis for many goroutines at once,
// sharing round trips, and keeps requests away from servers that stopped
// answering. It never knows what a script decides: it sends scripts and
// returns their replies. docs/redis.md says what users see of it: round
// trips shared between requests, and servers that stall or die answered
// by the failure policy within the store's timeout.
//
// # Batching
//
// A Pipeliner sends calls to one destination per server: the server of a
// *redis.Client (including one from redis.NewFailoverClient, for
// Sentinel), each master of a *redis.ClusterClient (found from the hash
// slot of the call's first key with the client's own slot map), or each
// shard of a *redis.Ring (found with Ring.GetShardClientForKey). Each
// destination has a queue and MaxInFlight worker goroutines, its lanes. A
// call joins its destination's queue; an idle lane takes everything queued,
// up to MaxBatch calls, and sends it as one pipeline of EVALSHA commands.
// While the batch is on the wire, new calls queue and leave together in the
// next batch. There is no timer: a call to an idle destination leaves at
// once, and batches grow only when calls arrive faster than round trips end.
//
// The calls of a batch that run a script made with NewBatchScript are
// merged: those for one destination (and one hash slot, on a Cluster) go
// as one EVALSHA, which the script decides in one run, with one reading of
// the server's clock; each call still gets its own reply or error. One run
// for many decisions costs the server much less than one run each.
//
// Run and RunBy send one call; RunQuiet one of background work, left out
// of the batch sizes reported to Config.OnBatch; RunAll many at once (a
// fleet syncer's tick), queued together so that they leave in as few
// batches, and share as few script runs, as the batch size allows.
//
// A call for a destination that is idle (up, nothing queued, no batch in
// flight) is sent by its caller itself, saving the hand-off to a lane and
// back, which is most of what the pipeline would add to the round trip of
// one call at a time; but not before the destination's server has
// answered a batch: the first call sets up a connection and loads the
// script, round trips that a lane waits for as long as the server
// answers. A direct call gives up after the stall threshold
// (MaxStallThreshold when it is adaptive) and marks the destination down
// unless the server answers a PING, as a lane does, whatever the client's
// ReadTimeout, with a context deadline that also bounds go-redis's dials
// and their retries (five, 100 ms apart, by default): with a client without
// Options.ContextTimeoutEnabled it goes through a clone of the client
// (Client.WithTimeout) that shares its pool, to which go-redis gives none
// of the client's hooks, and only when the caller's deadline leaves room
// for twice the stall threshold.
//
// A script missing from a server's cache (NOSCRIPT) is loaded there with
// SCRIPT LOAD and the call is sent again in the same step, so a cold cache
// never fails a call. On a Cluster, a call answered with MOVED or ASK is
// sent at once, with EVAL, to the node the reply names (after ASKING, for
// ASK: the slot is being migrated and the call's keys have moved), and
// MOVED makes the client reload its slot map; one answered with TRYAGAIN
// (a migration has split its keys between two nodes), CLUSTERDOWN or
// READONLY is sent again after a wait that doubles from 2 ms up to 50 ms,
// for as long as its deadline leaves room, and then fails with that
// reply. go-redis is kept from sending a Cluster batch again on its own
// when the first reply is one it retries, which would run again the calls
// of the batch that the node did run.
//
// # Deadlines
//
// No goroutine is started per call: the caller waits for its reply or for
// its context to end, whichever comes first, even with a client whose
// Options.ContextTimeoutEnabled is off (go-redis then waits for a reply up
// to ReadTimeout whatever the context says). A reply that arrives after its
// caller left is discarded; what the script did on the server stays done.
// A batch runs with the latest deadline of its callers, which bounds
// go-redis's dialing, retries and waits for a connection even with such a
// client, and a call whose caller has already left is not sent.
//
// # Health
//
// A destination is marked down when one of its batches has been
// outstanding for longer than the stall threshold (Config.StallThreshold)
// and its server does not answer a PING either, or when a batch fails with
// a connection error. The PING goes on a connection of the destination's
// own, outside the client's pool, and the server has 25 ms (or twice its
// recent slowest batch time, at most 100 ms, and at least half of
// Config.Bound) to answer; whether it did is read from the socket without
// waiting, so that a process short of CPU, whose goroutines run late,
// does not take a server that answers for one that stopped. A server that
// answers in time leaves its batches outstanding: they are late, not lost.
//
// With Config.Bound, the bound callers give their calls, a server has a
// third state: slow, when it answers a PING, but later than three
// quarters of Bound, which leaves a call no time to be decided within
// Bound. Calls for a slow destination fail at once, as for one that is
// down, rather than each waiting out its deadline.
//
// A call's own deadline (that of RunBy) is a bound on the server, not on
// this process: a reply that has come but that a process short of CPU has
// not read yet is waited for, 20 ms at a time and up to a second past the
// deadline, once the server has answered a PING written after the call
// was sent (so that the call's reply was sent before). The call waits for
// that answer within this process's scheduling lag (the runtime's recent
// scheduling latency, or the lateness of the call's own timer) plus
// 15 ms; with more than 25 ms of lag, twice the lag plus 15 ms, a PING
// written up to 100 ms before the call was sent counting too. A call
// counts as sent just before its batch is written. A server that answers
// later gets no more than the deadline, give or take this process's lag. For the same reason, no call is sent
// directly while this process has more goroutines waiting to run than
// processors, or was seen late to read replies in the last two seconds.
//
// Calls for a destination that is down or slow fail at once with an error
// that wraps ErrUnavailable and the cause (ErrSlow for a slow one), and so
// do the calls queued or in flight to it when it goes down or slow. Other
// destinations carry on. Such a destination is probed, first after
// Config.ProbeInterval and then at doubling intervals up to
// Config.MaxProbeInterval: a probe opens a connection with the client's
// dialer, outside its pool and retries, then sends PING through the
// client; with Config.Bound, it first sends PING on a connection of its
// own and reads the reply on time, as a verification does, waiting up to
// a second: a reply within the slow round trip makes the destination up
// (after the PING through the client), a later one slow, none down. The
// destination is up again as soon as a probe succeeds or a batch that
// stalled is answered after all (within the slow round trip, with
// Config.Bound). On a Cluster, a destination going down, and each probe
// of one that is down, make the client reload its slot map
// (ClusterClient.ReloadState), so that calls move to a promoted replica as
// soon as the cluster has one. Config.OnStateChange hears about every
// change.
//
// # Memory
//
// An OOM reply (a server over its maxmemory with the policy noeviction)
// is final: its call fails with it at once, sent once, and the server
// stays up, but counts as out of memory for 10 s (ServerState.OutOfMemory,
// IsOutOfMemory). Each destination's memory figures (maxmemory,
// maxmemory-policy, used_memory, evicted_keys: Memory) are read when it is
// made and every Config.MemoryEvery, with one INFO memory stats (CONFIG
// GET maxmemory* where INFO is refused) through a clone of its client,
// never on a call's way; Config.OnMemory hears the first reading, the
// evictions and the OOM replies.
//
// # Round trips that grow
//
// When every lane of a destination is busy and none has left for 10 ms, an
// extra lane (up to 4 beyond MaxInFlight) takes the calls that wait: with
// a server whose round trip is long, lanes tend to leave together, and a
// call that just missed them would wait for a whole round trip before its
// own. A destination has no more lanes than the client's pool has
// connections for (PoolSize): MaxInFlight at most PoolSize, the extra
// ones what is left beside them and a direct call; a lane without a
// connection would only wait for one with calls it took from the queue.
// With Config.Bound, each destination keeps connections ready in the
// client's pool for its lanes, extra ones included, as many as the pool
// can spare beside the regular lanes and a direct call (none with a pool
// of MaxInFlight+1 connections or fewer): at creation and every ten
// minutes, it takes them from the pool one after the other, each through
// a redis.Conn of its own (a clone's) with a PING, and gives them all
// back, so that a connection is held for the PINGs (a dial or a round
// trip each) of the others, not for a wait of the server's. A new
// connection takes a round trip or two to set up, which a call waiting
// for an extra lane would wait for on top of its own.
package redispipe

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults of Config.
const (
	// DefaultMaxBatch is the largest batch when Config.MaxBatch is zero.
	DefaultMaxBatch = 128
	// DefaultMaxInFlight is the number of batches that may be outstanding
	// to the server of a *redis.Client when Config.MaxInFlight is zero.
	DefaultMaxInFlight = 4
	// DefaultMaxInFlightPerNode is the number of batches that may be
	// outstanding to each master of a *redis.ClusterClient, or each shard
	// of a *redis.Ring, when Config.MaxInFlight is zero: these already have
	// a batch in flight per node.
	DefaultMaxInFlightPerNode = 1
	// DefaultProbeInterval is the wait before the first probe of a
	// destination that went down, when Config.ProbeInterval is zero.
	DefaultProbeInterval = 25 * time.Millisecond
	// DefaultMaxProbeInterval bounds the doubling wait between probes when
	// Config.MaxProbeInterval is zero.
	DefaultMaxProbeInterval = 200 * time.Millisecond

	// MinStallThreshold and MaxStallThreshold bound the adaptive stall
	// threshold used when Config.StallThreshold is zero: MinStallThreshold
	// plus twice the destination's longest recent batch time (a peak that
	// halves every second), at most MaxStallThreshold. A new destination
	// starts at MaxStallThreshold.
	MinStallThreshold = 20 * time.Millisecond
	// MaxStallThreshold: see MinStallThreshold.
	MaxStallThreshold = 35 * time.Millisecond
)

var (
	// ErrUnavailable is wrapped by the error of a call whose destination
	// is down, together with the reason it went down.
	ErrUnavailable = errors.New("redispipe: destination unavailable")
	// ErrStalled is the reason a destination went down when one of its
	// batches was outstanding for longer than the stall threshold.
	ErrStalled = errors.New("redispipe: batch outstanding too long")
	// ErrSlow is the reason a destination is slow: its server answers,
	// but later than the slow round trip (see Config.Bound). The error of
	// a call for a slow destination wraps both ErrUnavailable and ErrSlow.
	ErrSlow = errors.New("redispipe: server answers too late")
	// ErrClosed is returned by Run after Close, and by calls that Close
	// found waiting.
	ErrClosed = errors.New("redispipe: closed")
)

// Config configures a Pipeliner. The zero value is ready to use.
type Config struct {
	// MaxBatch is the largest number of calls sent to one destination in
	// one pipeline. Zero means DefaultMaxBatch.
	MaxBatch int
	// MaxInFlight is the number of batches that may be outstanding to one
	// destination at once; each is a worker goroutine and a connection,
	// so a destination whose client's pool is smaller (Options.PoolSize)
	// has as many as the pool has connections. Zero means
	// DefaultMaxInFlight for a *redis.Client and DefaultMaxInFlightPerNode
	// for a *redis.ClusterClient or *redis.Ring.
	MaxInFlight int
	// StallThreshold is how long a batch may be outstanding before its
	// destination is marked down. Zero means adaptive: MinStallThreshold
	// plus twice the destination's longest recent batch time, at most
	// MaxStallThreshold, and MaxStallThreshold for a destination that has
	// no history yet. A negative value turns stall detection off;
	// connection errors still mark destinations down.
	//
	// A batch outstanding past the threshold marks its destination down
	// only if the server does not answer a PING either, and slow if it
	// answers later than Bound allows (see the package documentation):
	// this process being late to read a reply is not the server stalling.
	// A batch that was only slow, not lost, marks its destination up again
	// as soon as it is answered (within the slow round trip, with Bound).
	StallThreshold time.Duration
	// Bound is how long callers give a call, as the Redis store's
	// Timeout does; zero means that they give none. When positive (and
	// stall detection is on), servers have a third state beside up and
	// down: slow. A server is slow when it answers a PING, but later than
	// the slow round trip, three quarters of Bound: with batching, a call
	// may wait for a round trip in flight before its own, so a server
	// that takes longer cannot decide within Bound. Calls for a slow
	// server fail at once, as for one that is down, with an error that
	// wraps ErrUnavailable and ErrSlow, rather than each waiting out its
	// deadline, until a probe (as for a server that is down) finds it
	// answering within the slow round trip again. Bound also gives a
	// stall's PING at least half of it to be answered, so that a server
	// whose round trip rose but still fits is not taken for one that
	// stopped.
	Bound time.Duration
	// ProbeInterval is the wait before the first probe of a destination
	// that went down; it doubles after each failed probe, up to
	// MaxProbeInterval. Zero means DefaultProbeInterval and
	// DefaultMaxProbeInterval.
	ProbeInterval, MaxProbeInterval time.Duration
	// OnStateChange, if not nil, is called when a destination goes down
	// (up false, with the cause) or comes back (up true, nil cause). dest
	// names the destination: the server's address, as in the client's
	// options ("FailoverClient" for a Sentinel client). Calls for one
	// destination are made one at a time, in order, from the goroutine
	// that saw the change; OnStateChange must not block for long.
	OnStateChange func(dest string, up bool, cause error)
	// OnBatch, if not nil, is called with the number of calls of each
	// batch before it is sent, on the goroutine that sends it; it must be
	// fast.
	OnBatch func(calls int)
	// MemoryEvery is how often each server's memory figures (Memory) are
	// read: once when its destination is made, then at this interval,
	// one command each time (INFO memory stats, or CONFIG GET maxmemory*
	// where INFO is refused), never on a call's way. Zero means
	// DefaultMemoryEvery; a negative value, never.
	MemoryEvery time.Duration
	// OnMemory, if not nil, is called with a destination's memory
	// figures when they are first read, when a later reading finds keys
	// evicted since the one before or a change of whether the server may
	// evict (Memory.MayEvict), and when its server answers OOM after not
	// doing so for 10 s. Calls are made from goroutines of their own; it
	// must not block for long.
	OnMemory func(dest string, e MemoryEvent)
}

// kind is the sort of client a Pipeliner sends through.
type kind int

const (
	kindSingle kind = iota
	kindCluster
	kindRing
)

// Pipeliner runs scripts on Redis, batching concurrent calls per
// destination (see the package documentation). It is safe for concurrent
// use.
type Pipeliner struct {
	cfg     Config
	kind    kind
	single  *dest
	cluster *redis.ClusterClient
	ring    *redis.Ring

	// ctx is the parent of every batch's context; Close cancels it.
	ctx    context.Context
	cancel context.CancelFunc
	closed atomic.Bool
	wg     sync.WaitGroup

	// send, if not nil, replaces the way a lane sends a batch and reports
	// whether the server answered; the benchmarks of alternatives set it,
	// which also turns direct calls off.
	send func(d *dest, ctx context.Context, sent []*call) bool
	// noDirect turns direct calls off (see directLocked).
	noDirect bool
	// busy reports whether this process is short of CPU (processBusy;
	// tests of direct calls replace it), and lag how late its goroutines
	// run lately (processLag).
	busy func(now time.Time) bool
	lag  func(now time.Time) time.Duration
	// slowRoundTrip is three quarters of Config.Bound, or zero: the
	// longest PING round trip of a server that is up.
	slowRoundTrip time.Duration
	// directTimeout bounds the network reads and writes of a direct call;
	// zero means that direct calls are made only when go-redis honours
	// the caller's deadline itself.
	directTimeout time.Duration

	// redirects sends again the calls that Cluster nodes turned away.
	redirects redirector

	// byClient finds the destination of a node client quickly.
	byClient sync.Map // *redis.Client → *dest
	mu       sync.Mutex
	// byName holds every destination, by address; guarded by mu.
	byName map[string]*dest
}

// New returns a Pipeliner that sends calls through client, which must be a
// *redis.Client (including one from redis.NewFailoverClient), a
// *redis.ClusterClient or a *redis.Ring.
func New(client redis.Scripter, cfg Config) (*Pipeliner, error) {
	if cfg.MaxBatch < 0 || cfg.MaxInFlight < 0 || cfg.ProbeInterval < 0 || cfg.MaxProbeInterval < 0 {
		return nil, errors.New("redispipe: negative MaxBatch, MaxInFlight or probe interval")
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = DefaultMaxBatch
	}
	if cfg.ProbeInterval == 0 {
		cfg.ProbeInterval = DefaultProbeInterval
	}
	if cfg.MaxProbeInterval == 0 {
		cfg.MaxProbeInterval = max(DefaultMaxProbeInterval, cfg.ProbeInterval)
	}
	if cfg.MaxProbeInterval < cfg.ProbeInterval {
		return nil, fmt.Errorf("redispipe: MaxProbeInterval %s is shorter than ProbeInterval %s", cfg.MaxProbeInterval, cfg.ProbeInterval)
	}
	p := &Pipeliner{cfg: cfg, byName: make(map[string]*dest), busy: processBusy, lag: processLag}
	switch t := cfg.StallThreshold; {
	case t > 0:
		p.directTimeout = t
	case t == 0:
		p.directTimeout = MaxStallThreshold
	}
	if cfg.Bound < 0 {
		return nil, fmt.Errorf("redispipe: negative Bound %s", cfg.Bound)
	}
	if cfg.StallThreshold >= 0 {
		p.slowRoundTrip = cfg.Bound * 3 / 4
	}
	switch c := client.(type) {
	case *redis.Client:
		if c == nil {
			return nil, errors.New("redispipe: nil client")
		}
		p.kind = kindSingle
	case *redis.ClusterClient:
		if c == nil {
			return nil, errors.New("redispipe: nil client")
		}
		p.kind, p.cluster = kindCluster, c
	case *redis.Ring:
		if c == nil {
			return nil, errors.New("redispipe: nil client")
		}
		p.kind, p.ring = kindRing, c
	case nil:
		return nil, errors.New("redispipe: nil client")
	default:
		return nil, fmt.Errorf("redispipe: unsupported client type %T", client)
	}
	if p.cfg.MaxInFlight == 0 {
		p.cfg.MaxInFlight = DefaultMaxInFlightPerNode
		if p.kind == kindSingle {
			p.cfg.MaxInFlight = DefaultMaxInFlight
		}
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	p.redirects.p = p
	if c, ok := client.(*redis.Client); ok {
		d, err := p.destFor(c)
		if err != nil {
			return nil, err
		}
		p.single = d
	}
	return p, nil
}

// Run runs script with keys and args on the destination of keys[0] (the
// only one for a *redis.Client, which also accepts no keys), batched with
// other calls, and returns the script's reply as go-redis decodes it (see
// redis.Cmd.Result): a Lua table becomes an []any, and a Lua false or nil
// makes redis.Nil the error.
//
// Run returns when the reply arrives, when ctx ends, or at once if the
// destination is down, whichever comes first; the error then wraps
// ctx's error or ErrUnavailable. An error reply of the script is returned
// as the error. Keys and args are copied: the caller may reuse them once
// Run returns. Values of args are sent as go-redis sends command
// arguments, and a *[]byte as the []byte it points to (which, unlike a
// []byte, costs the caller no allocation to pass as an any).
func (p *Pipeliner) Run(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	return p.RunBy(ctx, time.Time{}, script, keys, args...)
}

// RunBy is Run that also returns at deadline, if it is not zero: the
// same as Run with a context that ends then, without the cost of making
// one for every call.
func (p *Pipeliner) RunBy(ctx context.Context, deadline time.Time, script *redis.Script, keys []string, args ...any) (any, error) {
	return p.run(ctx, deadline, false, script, keys, args...)
}

func (p *Pipeliner) run(ctx context.Context, deadline time.Time, quiet bool, script *redis.Script, keys []string, args ...any) (any, error) {
	if p.closed.Load() {
		return nil, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("redispipe: %w", context.Cause(ctx))
	}
	d, err := p.route(ctx, keys)
	if err != nil {
		return nil, err
	}
	c := newCall(ctx, deadline, script, keys, args)
	c.dest = d
	c.quiet = quiet
	if p.kind == kindCluster {
		c.slot = Slot(keys[0])
	}
	start, direct, err := d.submit(c)
	switch {
	case err != nil:
		c.release()
		c.release()
		return nil, err
	case direct:
		return d.runDirect(ctx, c, start)
	}
	return c.wait(ctx)
}

// RunQuiet is Run for background work (polling a key, say) that is not
// counted in Config.OnBatch, so that the batch sizes report decisions
// only; it is batched, and fails fast on a server that is down, as Run.
func (p *Pipeliner) RunQuiet(ctx context.Context, script *redis.Script, keys []string, args ...any) (any, error) {
	return p.run(ctx, time.Time{}, true, script, keys, args...)
}

// Call is one call of RunAll: the keys and arguments of a script run, as
// Run takes them, and, once RunAll returns, its reply as Run returns it.
type Call struct {
	Keys []string
	Args []any
	Val  any
	Err  error
}

// RunAll runs script once for each of calls, as Run would, and returns
// when each has its reply or ctx or deadline ends: the calls join their
// destinations' queues at once, so that they leave in as few batches as
// the batch size allows, rather than one round trip each. Like RunQuiet,
// they are not counted in Config.OnBatch: RunAll is for background work
// (a syncer's tick) that should not hold back the decisions queued with
// it for long, so callers send a few hundred calls at a time.
func (p *Pipeliner) RunAll(ctx context.Context, deadline time.Time, script *redis.Script, calls []Call) {
	queued := make([]*call, len(calls))
	// The calls by destination: their indexes in calls.
	var dests []*dest
	var groups [][]int
	for i := range calls {
		cl := &calls[i]
		cl.Val, cl.Err = nil, nil
		if p.closed.Load() {
			cl.Err = ErrClosed
			continue
		}
		if err := ctx.Err(); err != nil {
			cl.Err = fmt.Errorf("redispipe: %w", context.Cause(ctx))
			continue
		}
		d, err := p.route(ctx, cl.Keys)
		if err != nil {
			cl.Err = err
			continue
		}
		c := newCall(ctx, deadline, script, cl.Keys, cl.Args)
		c.dest = d
		c.quiet = true
		if p.kind == kindCluster {
			c.slot = Slot(cl.Keys[0])
		}
		queued[i] = c
		g := 0
		for g < len(dests) && dests[g] != d {
			g++
		}
		if g == len(dests) {
			dests, groups = append(dests, d), append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	var batch []*call
	for g, d := range dests {
		batch = batch[:0]
		for _, i := range groups[g] {
			batch = append(batch, queued[i])
		}
		if err := d.enqueueAll(batch); err != nil {
			for _, i := range groups[g] {
				queued[i].release()
				queued[i].release()
				queued[i], calls[i].Err = nil, err
			}
		}
	}
	for i, c := range queued {
		if c != nil {
			calls[i].Val, calls[i].Err = c.wait(ctx)
		}
	}
}

// route returns the destination of a call with keys.
func (p *Pipeliner) route(ctx context.Context, keys []string) (*dest, error) {
	if p.kind == kindSingle {
		return p.single, nil
	}
	if len(keys) == 0 {
		return nil, errors.New("redispipe: a call without keys has no destination on a Cluster or Ring")
	}
	var (
		c   *redis.Client
		err error
	)
	if p.kind == kindCluster {
		c, err = p.cluster.MasterForKey(ctx, keys[0])
	} else {
		c, err = p.ring.GetShardClientForKey(keys[0])
	}
	if err != nil {
		return nil, fmt.Errorf("redispipe: no server for key: %w", err)
	}
	if d, ok := p.byClient.Load(c); ok {
		return d.(*dest), nil
	}
	return p.destFor(c)
}

// destFor returns the destination of the node client c, creating it on
// first use. A new client for a known address takes over that address's
// destination.
func (p *Pipeliner) destFor(c *redis.Client) (*dest, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed.Load() {
		return nil, ErrClosed
	}
	name := c.Options().Addr
	d, ok := p.byName[name]
	if !ok {
		d = newDest(p, name, c)
		p.byName[name] = d
	} else {
		d.setClient(c)
	}
	p.byClient.Store(c, d)
	return d, nil
}

// Close fails the calls still queued with ErrClosed, stops the worker and
// probe goroutines and waits for them. A batch in flight ends first: at
// once with a client that honours context deadlines, otherwise when the
// server answers or the client's ReadTimeout passes. Close does not close
// the client.
func (p *Pipeliner) Close() error {
	p.mu.Lock()
	if p.closed.Swap(true) {
		p.mu.Unlock()
		return nil
	}
	dests := make([]*dest, 0, len(p.byName))
	for _, d := range p.byName {
		dests = append(dests, d)
	}
	p.mu.Unlock()
	p.cancel()
	for _, d := range dests {
		d.close()
	}
	p.redirects.close()
	p.wg.Wait()
	return nil
}
