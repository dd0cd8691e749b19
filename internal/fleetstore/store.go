// Package fleetstore is the coordination layer of the fleet modes: it sits
// between a Limiter and the Redis store, behind the same Take, and decides
// the charges of rules in lease or write-back mode in memory, from a local
// table of counters that a background syncer keeps in step with the
// fleet's counters in the shared store. Charges of rules in exact mode go
// to the exact store unchanged. The arithmetic is package fleet's; the
// modes, their bounds and their settings are described in docs/fleet.md.
//
// # Modes
//
// Lease: a counter not used for two intervals is decided exactly, in the
// shared store's single call with the request's exact charges (a slice
// for it would cost that call, and likely one more to give it back). A
// counter used again within two intervals is busy: every request that
// finds its slice spent asks the shared store for a slice of the
// remaining budget (fleet.Grant: at most the rule's lease, and at most
// remaining / (2 × servers holding leases)); requests spend it locally.
// The size asked for starts at 2 units and doubles with each slice while
// the counter is busy; busy counters ask for the next slice ahead. A
// slice lives one sync interval when it was granted near the limit, ten
// far from it (fleet.SliceLife), and never past the end of the window it
// was counted in; what is left of it is given back when it ends, or when
// its counter goes idle for two intervals, unless the counter is still
// busy, in which case the same call renews it. The fleet admits at most
// what exact mode would (see fleet.Grant); the price is false denials, at
// most (servers − 1) × lease per window, while other servers hold unspent
// slices.
//
// Write-back: requests are decided from the local view (fleet.View): the
// fleet's count as last synced plus what this server counted since. A
// request that brings a counter's unsynced count to max_unsynced pushes it
// at once and waits for the answer; requests whose charge would bring it
// there again while that push is on its way wait for it before they are
// counted, so that a server holds at most max_unsynced − 1 units plus one
// charge that the fleet has not seen. A counter not synced for two intervals
// (or never) is decided blind, from its view as it is, within this
// server's share of the bound (fleet.Blind) and while its view is far from
// the limit; otherwise it is read again before it decides. Every sync
// interval the syncer pushes the deltas (keyed by window, fleet.Delta) of
// the counters used from fresh views or near their limit, and merges the
// fleet's count that comes back; counts decided blind wait until they are
// half of max_unsynced or their window ends, and their counters are
// visited every 16 ticks only (a later list). Over the limit, per window:
// at most servers × max_unsynced, plus what the fleet admits in one sync
// interval (fleet.OverBound).
//
// # Settles and refunds
//
// The cost of a request known only once it has run (docs/usage.md) is
// settled through the local count too (Settle): in write-back mode it is
// added to the view and pushed as any count, with no call of its own; in
// lease mode it comes out of the slice held, and what the slice does not
// cover goes to the exact store's own settle. Refund (a rule that counts
// by outcome, a usage that came in under its estimate) gives back in
// process the same way.
//
// # A slow shared store
//
// A request waits for the calls for its counter (a slice on its way, a
// push at max_unsynced) at most Config.Wait in all (package middleware
// sets it to the Redis store's Timeout), and is then decided without them
// (write-back) or fails with ErrWait (lease), which the Limiter's failure
// policy answers. The syncer's ticks and the slices
// asked for ahead are background calls (fleet.Background), bounded by
// their own deadline rather than a decision's, so that a shared store too
// slow for decisions still syncs (docs/redis.md, docs/fleet.md).
//
// # The syncer seam
//
// The syncer knows counters, windows and deltas, not HTTP: each tick it
// detaches, per counter, a fleet.Delta keyed by window and sends a
// fleet.Call to the Backend; the fleet.Reply that comes back is merged into
// the local view by Config.Merge (fleet.View.Synced by default). A
// backend that keeps one count per region, and a merge that sums them, fit
// behind the same seam.
//
// # Memory
//
// The table is bounded (Config.MaxKeys) like the memory store: a full
// shard evicts the least recently used of 8 entries drawn at random; the
// deltas and slices of an evicted counter are pushed and given back by the
// next tick, or dropped (and counted) if more than 4096 wait. An entry is
// 112 bytes, plus its share of the index and of the allocator's rounding:
// the heap grows by about 120 bytes per counter (TestMemoryPerKey checks
// at most 128). A lease counter takes an entry only once it is busy: the
// last uses of the others are kept in a fixed array of 65,536 slots
// (512 KiB, made with the first lease charge). There is one goroutine per
// store (the syncer, which makes a tick's calls from up to 16 goroutines while the tick
// runs, or, with a BatchBackend such as the Redis store, sends them in
// chunks of 256 calls that share script runs, from up to 4), and a busy
// counter's next slice is asked for on a goroutine that lives until the
// answer; none per counter.
package fleetstore

import (
	"context"
	"errors"
	"hash/maphash"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/window"
)

const (
	// DefaultLease is the largest slice a lease grants when Settings.Lease
	// is 0.
	DefaultLease = 100
	// DefaultSyncInterval is the sync interval when Settings.SyncInterval
	// is 0.
	DefaultSyncInterval = 100 * time.Millisecond
	// DefaultMaxUnsynced bounds the default max_unsynced of a counter:
	// Requests / 10, at least 1 and at most this.
	DefaultMaxUnsynced = 100
	// DefaultMaxKeys is the table's capacity when Config.MaxKeys is 0.
	DefaultMaxKeys = 1 << 20
	// maxOrphans bounds the calls of evicted counters waiting for the
	// next tick.
	maxOrphans = 4096
	// workers is how many calls the syncer has on their way at once;
	// the pipeline batches those for one server.
	workers = 16
	// chunk is how many calls the syncer sends at once to a BatchBackend,
	// from chunkWorkers goroutines: chunks of a few hundred share script
	// runs without holding back for long the decisions queued with them.
	chunk, chunkWorkers = 256, 4
	// laterEvery is how often, in ticks, the syncer visits the write-back
	// counters whose counts wait (see pushDue).
	laterEvery = 16
	shards     = 64
)

// Settings are a rule's coordination settings.
type Settings struct {
	Mode fleet.Mode
	// Lease is the largest slice a lease grants, in cost units; 0 means
	// DefaultLease.
	Lease int
	// SyncInterval is how often write-back deltas are pushed and how long
	// a slice granted near the limit lives (fleet.SliceLife); 0 means
	// DefaultSyncInterval.
	SyncInterval time.Duration
	// MaxUnsynced is how many units a server may count for one counter
	// before it pushes them at once and waits; 0 means Requests / 10,
	// between 1 and DefaultMaxUnsynced.
	MaxUnsynced int
}

// Backend is the shared store. *redisstore.Store implements it.
type Backend interface {
	Fleet(ctx context.Context, deadline time.Time, c *fleet.Call) (fleet.Reply, error)
}

// BatchBackend is a Backend that also takes many calls at once, sharing
// round trips and script runs, as *redisstore.Store does: the syncer then
// sends a tick's calls by chunks. The reply and error of calls[i] go to
// out[i] and errs[i].
type BatchBackend interface {
	Backend
	FleetAll(ctx context.Context, deadline time.Time, calls []*fleet.Call, out []fleet.Reply, errs []error)
}

// Exact decides the charges of rules in exact mode.
type Exact interface {
	Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error)
}

// Events are told what the layer does; any may be nil. They are called
// without locks held, and must be fast.
type Events struct {
	// Unsynced: n units admitted locally in write-back mode, not yet
	// pushed.
	Unsynced func(rule string, n int64)
	// Flushed: one tick of the syncer, how many calls it made, how long
	// they took and the first error.
	Flushed func(calls int, d time.Duration, err error)
	// Granted: a lease granted units.
	Granted func(rule string, units int64)
	// GaveBack: units of a slice that were not used and went back.
	GaveBack func(rule string, units int64)
	// Dropped: deltas or slices of evicted counters that could not wait
	// for the next tick.
	Dropped func(rule string, units int64)
}

// ErrWait is the error of a lease request whose counter's slice, on its
// way, did not come within Config.Wait.
var ErrWait = errors.New("fleetstore: the counter's slice did not come within the request's bound")

// Config configures a Store.
type Config struct {
	Backend Backend
	Exact   Exact
	// ID names a counter in the shared store (redisstore.FleetID).
	ID func(c *window.Charge) fleet.ID
	// MaxKeys bounds the counters kept in process; 0 means DefaultMaxKeys.
	MaxKeys int
	// Timeout bounds each call of the syncer; 0 means one second.
	Timeout time.Duration
	// Wait bounds how long a request waits for calls for its counter (a
	// slice, a push: its own, or one on its way, which with a slow shared
	// store may take up to Timeout); past it, the request's charge fails
	// with ErrWait (lease) or is decided without it (write-back). 0 means
	// no bound but the request's context.
	Wait time.Duration
	// Now, if set, is the clock of the syncer, whose calls are then made
	// at its instants; nil means the shared store's clock.
	Now func() time.Time
	// Manual, if set, starts no syncer: the caller calls Sync.
	Manual bool
	// Merge merges a reply into a counter's write-back view; nil means
	// fleet.View.Synced.
	Merge  func(l *window.Limit, v *fleet.View, r fleet.Reply, now, inflight int64)
	Events Events
}

// binding is a rule's settings with defaults applied, for one limit.
type binding struct {
	name        string
	set         Settings
	lim         window.Limit
	lease       int64
	interval    int64 // ms
	maxUnsynced int64
	every       int64 // ticks
}

type bindKey struct {
	name string
	lim  window.Limit
}

// Store is the coordination layer. It is safe for concurrent use.
type Store struct {
	cfg    Config
	rules  atomic.Pointer[map[string]Settings]
	tickMs atomic.Int64
	shards [shards]shard
	seed   maphash.Seed
	holder uint32
	// clock follows the shared store's clock, when it keeps time.
	skew storeClock
	// failUntil: no request waits for a push before this instant (ms).
	failUntil atomic.Int64
	// latest is the latest explicit instant decided at (ms).
	latest atomic.Int64

	bmu      sync.Mutex
	bindings map[bindKey]*binding
	// recent holds bindings by a hash of their rule and limit (recentSlot),
	// read without a lock: every decision needs its charges' bindings, and
	// a lock shared by all of them would be the most contended of the
	// layer.
	recent [64]atomic.Pointer[binding]

	omu     sync.Mutex
	orphans []job

	// uses remembers the last use of lease counters (see takeLease).
	uses uses

	tick      atomic.Int64
	evictions atomic.Uint64
	// blind counts the units admitted blind (fleet.Blind).
	blind     atomic.Int64
	syncMu    sync.Mutex
	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// New returns a Store. It starts the syncer unless cfg.Manual is set; Close
// stops it.
func New(cfg Config) (*Store, error) {
	if cfg.Backend == nil || cfg.Exact == nil || cfg.ID == nil {
		return nil, errors.New("fleetstore: Backend, Exact and ID are required")
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Merge == nil {
		cfg.Merge = func(l *window.Limit, v *fleet.View, r fleet.Reply, now, inflight int64) {
			v.Synced(l, r.State, now, inflight)
		}
	}
	s := &Store{cfg: cfg, seed: maphash.MakeSeed(), holder: rand.Uint32(), bindings: map[bindKey]*binding{}}
	per := max(cfg.MaxKeys/shards, 1)
	for i := range s.shards {
		s.shards[i].max = per
	}
	empty := map[string]Settings{}
	s.rules.Store(&empty)
	s.tickMs.Store(DefaultSyncInterval.Milliseconds())
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	if cfg.Manual {
		close(s.done)
	} else {
		go s.loop()
	}
	return s, nil
}

// SetRules sets the settings of the rules in lease or write-back mode, by
// rule name; charges of other rules are exact.
func (s *Store) SetRules(rules map[string]Settings) {
	m := make(map[string]Settings, len(rules))
	tick := int64(0)
	for name, set := range rules {
		if set.Mode == fleet.Exact {
			continue
		}
		m[name] = set
		iv := intervalOf(set)
		if tick == 0 || iv < tick {
			tick = iv
		}
	}
	if tick == 0 {
		tick = DefaultSyncInterval.Milliseconds()
	}
	s.rules.Store(&m)
	s.tickMs.Store(tick)
}

func intervalOf(set Settings) int64 {
	if set.SyncInterval <= 0 {
		return DefaultSyncInterval.Milliseconds()
	}
	return max(set.SyncInterval.Milliseconds(), 1)
}

// Close stops the syncer, after one last tick that pushes what is
// unsynced and gives back what is leased.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		if !s.cfg.Manual {
			s.Sync(context.Background(), s.clock(), true)
		}
	})
	return nil
}

// Abandon stops the syncer without a last tick, as a process that dies
// would: what is unsynced is lost. For tests.
func (s *Store) Abandon() {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
	})
}

// Len is the number of counters in the table.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Evictions is how many counters the table dropped to stay within MaxKeys.
func (s *Store) Evictions() uint64 { return s.evictions.Load() }

// Blind is how many units write-back counters admitted from views not
// synced for two intervals, without reading the fleet's count first
// (fleet.Blind).
func (s *Store) Blind() int64 { return s.blind.Load() }

func (s *Store) clock() time.Time {
	if s.cfg.Now != nil {
		return s.cfg.Now()
	}
	return time.Time{}
}

// instant returns the instant to decide at (Unix ms, on the shared
// store's clock as last measured when now is zero) and the instant to
// pass in calls (-1 for the store's clock).
func (s *Store) instant(now time.Time) (ms, call int64) {
	if now.IsZero() {
		return time.Now().UnixMilli() + s.skew.offset.Load(), -1
	}
	ms = now.UnixMilli()
	for {
		l := s.latest.Load()
		if ms <= l || s.latest.CompareAndSwap(l, ms) {
			break
		}
	}
	return ms, ms
}

// bind returns the binding of charge c, or nil if its rule is exact.
func (s *Store) bind(rules map[string]Settings, c *window.Charge, cur *binding) *binding {
	if len(rules) == 0 {
		return nil
	}
	set, ok := rules[c.Name]
	if !ok || !fleet.Supports(c.Limit.Algorithm) {
		return nil
	}
	if cur != nil && cur.set == set && cur.lim == c.Limit && cur.name == c.Name {
		return cur
	}
	r := &s.recent[recentSlot(c)]
	if b := r.Load(); b != nil && b.set == set && b.lim == c.Limit && b.name == c.Name {
		return b
	}
	k := bindKey{c.Name, c.Limit}
	s.bmu.Lock()
	defer s.bmu.Unlock()
	if b, ok := s.bindings[k]; ok && b.set == set {
		r.Store(b)
		return b
	}
	b := &binding{name: c.Name, set: set, lim: c.Limit, interval: intervalOf(set)}
	b.lease = int64(set.Lease)
	if b.lease <= 0 {
		b.lease = DefaultLease
	}
	b.maxUnsynced = int64(set.MaxUnsynced)
	if b.maxUnsynced <= 0 {
		b.maxUnsynced = min(max(int64(c.Limit.Requests)/10, 1), DefaultMaxUnsynced)
	}
	b.every = max(b.interval/max(s.tickMs.Load(), 1), 1)
	if len(s.bindings) >= 4096 {
		clear(s.bindings) // limits from LimitsFunc: keep the cache bounded
	}
	s.bindings[k] = b
	r.Store(b)
	return b
}

// recentSlot returns the slot of Store.recent for charge c's binding: a
// cheap hash of its rule's name and its limit. Bindings whose hashes
// collide take turns in the slot; the others are found under the lock.
func recentSlot(c *window.Charge) int {
	h := uint64(len(c.Name))
	if n := len(c.Name); n > 0 {
		h = h*31 + uint64(c.Name[0])
		h = h*31 + uint64(c.Name[n-1])
		h = h*31 + uint64(c.Name[n/2])
	}
	l := &c.Limit
	h = h*31 + uint64(l.Requests)
	h = h*31 + uint64(l.Window)
	h = h*31 + uint64(l.Algorithm)
	h = h*31 + uint64(l.Burst)
	h = h*31 + uint64(l.Period)
	return int(mix64(h) % uint64(len(Store{}.recent)))
}

// locate returns the shard and identity of charge c's counter.
func (s *Store) locate(c *window.Charge) (*shard, ident) {
	// Two hashes of strings, mixed: a maphash.Hash would copy both into
	// its buffer first.
	k := mix64(maphash.String(s.seed, c.Key) + 0x9e3779b97f4a7c15*maphash.String(s.seed, c.Name))
	ser := c.Limit.Series()
	id := ident{h1: k ^ ser*0x9e3779b97f4a7c15, h2: mix64(k + ser)}
	return &s.shards[id.h2%shards], id
}

func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// entryFor returns the entry of id, making it if needed, at ms. sh must
// be locked.
func (s *Store) entryFor(sh *shard, id ident, c *window.Charge, b *binding, ms int64) *entry {
	if e, _ := sh.lookup(id); e != nil {
		e.b = b
		return e
	}
	e, old, evicted := sh.insert(id)
	if evicted {
		s.evictions.Add(1)
		s.orphan(&old)
		sh.evicted = max(sh.evicted, ms)
	}
	e.fid = s.cfg.ID(c)
	e.b = b
	return e
}

// orphan keeps what an evicted entry still owes the shared store for the
// next tick.
func (s *Store) orphan(e *entry) {
	var j job
	switch {
	case e.b == nil:
		return
	case e.b.set.Mode == fleet.WriteBack && (e.up != 0 || e.uc != 0):
		j = job{b: e.b, fid: e.fid, delta: fleet.Delta{Start: e.cs, Prev: e.up, Curr: e.uc}, orphan: true}
	case e.b.set.Mode == fleet.Lease && e.uc > 0 && e.flags&granting == 0:
		j = job{b: e.b, fid: e.fid, lease: true, give: e.uc, from: e.us, orphan: true}
	default:
		return
	}
	s.omu.Lock()
	if len(s.orphans) < maxOrphans {
		s.orphans = append(s.orphans, j)
		s.omu.Unlock()
		return
	}
	s.omu.Unlock()
	if fn := s.cfg.Events.Dropped; fn != nil {
		fn(e.b.name, j.delta.Prev+j.delta.Curr+j.give)
	}
}

// Take decides charges at now, all or nothing, as the middleware Store
// contract says: charges of rules in lease or write-back mode locally,
// the others with the exact store. A request that a later charge denies
// gives back what earlier ones counted.
func (s *Store) Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
	rules := *s.rules.Load()
	var bbuf [8]*binding
	bs := bbuf[:0]
	if len(charges) > len(bbuf) {
		bs = make([]*binding, 0, len(charges))
	}
	local := 0
	for i := range charges {
		c := &charges[i]
		b := s.bind(rules, c, nil)
		if b != nil {
			if err := c.Limit.Validate(); err != nil {
				return false, err
			}
			local++
		}
		bs = append(bs, b)
	}
	if local == 0 {
		return s.cfg.Exact.Take(ctx, now, charges, out)
	}
	ms, call := s.instant(now)
	all := true
	decided := 0
	for i := range charges {
		b := bs[i]
		if b == nil {
			continue
		}
		c := &charges[i]
		var ok, cold bool
		var err error
		if c.Exact() {
			// Decided in the shared store (window.Charge.Exact), but from
			// what is left of a slice this server holds, which the store
			// counted already: the budget that was leased before the
			// charge had to be exact is spent, not stranded.
			if b.set.Mode != fleet.Lease || !s.spendSlice(c, b, ms, &out[i]) {
				bs[i] = nil
				local--
				continue
			}
			ok = true
		} else if b.set.Mode == fleet.Lease {
			ok, cold, err = s.takeLease(ctx, ms, call, c, b, &out[i])
			if cold {
				// Decided exactly, with the request's exact charges.
				bs[i] = nil
				local--
				continue
			}
		} else {
			ok, err = s.takeWriteBack(ctx, ms, call, c, b, &out[i])
		}
		if err != nil {
			s.undo(charges[:i], bs[:i], out[:i], ms)
			return false, err
		}
		decided = i + 1
		if !ok {
			all = false
			break
		}
	}
	if !all {
		s.undo(charges[:decided-1], bs[:decided-1], out[:decided-1], ms)
		for i := decided; i < len(charges); i++ {
			out[i] = window.Decision{Allowed: true}
		}
		for i := 0; i < decided-1; i++ {
			if bs[i] == nil {
				out[i] = window.Decision{Allowed: true}
			}
		}
		return false, nil
	}
	switch local {
	case len(charges):
		return true, nil
	case 0:
		// Every local charge was of a cold counter.
		return s.cfg.Exact.Take(ctx, now, charges, out)
	}
	// The exact charges, in one call.
	var cbuf [8]window.Charge
	var dbuf [8]window.Decision
	ec, ed := cbuf[:0], dbuf[:0]
	for i := range charges {
		if bs[i] == nil {
			ec = append(ec, charges[i])
			ed = append(ed, window.Decision{})
		}
	}
	ok, err := s.cfg.Exact.Take(ctx, now, ec, ed)
	if err != nil || !ok {
		s.undo(charges, bs, out, ms)
	}
	if err != nil {
		return false, err
	}
	k := 0
	for i := range charges {
		if bs[i] == nil {
			out[i] = ed[k]
			k++
		} else if !ok {
			out[i].Remaining += charges[i].Cost
		}
	}
	return ok, nil
}

// undo gives back, locally, what the admitted local charges counted.
func (s *Store) undo(charges []window.Charge, bs []*binding, out []window.Decision, ms int64) {
	for i := range charges {
		if bs[i] != nil && out[i].Allowed {
			s.giveBack(&charges[i], bs[i])
		}
	}
}

// giveBack takes the cost of c, a charge of a rule in a fleet mode, off
// its counter in process: back to the slice in lease mode, off the view
// and what is unsynced in write-back mode (units already pushed stay
// counted).
func (s *Store) giveBack(c *window.Charge, b *binding) {
	if c.Cost == 0 {
		return
	}
	sh, id := s.locate(c)
	sh.mu.Lock()
	if e, _ := sh.lookup(id); e != nil {
		cost := int64(c.Cost)
		if b.set.Mode == fleet.Lease {
			e.uc += cost
		} else {
			if b.lim.Algorithm == window.TokenBucket {
				e.cc = max(0, e.cc-cost*(b.lim.Window.Milliseconds()/b.lim.Tick()))
			} else {
				e.cc = max(0, e.cc-cost)
			}
			e.uc = max(0, e.uc-cost)
		}
	}
	sh.mu.Unlock()
}

// Busy reports whether a lease call or a waited-for push of some counter
// is on its way.
func (s *Store) Busy() bool {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := len(sh.waits)
		for _, id := range sh.list {
			if e, _ := sh.lookup(id); e != nil && e.flags&granting != 0 {
				n++
			}
		}
		sh.mu.Unlock()
		if n > 0 {
			return true
		}
	}
	return false
}
