// Package memstore is the in-memory store: a sliding-window counter per
// (Name, Key, Limit.Window), kept in a sharded map with a bounded number of
// keys. It decides with window.Take, so it answers exactly as every other
// store does.
//
// A Key's counters, whatever their Name and Window, live in one shard,
// chosen by a seeded hash of the Key, so that a request's charges on one Key
// take one lock. Charges on keys in different shards lock those shards in
// ascending order.
//
// Memory is bounded by Config.MaxKeys. Each shard holds at most its share of
// MaxKeys counters and evicts its least recently used counter to make room
// for a new one. Counters that can no longer affect a decision (see
// window.Expiry) are dropped when a new counter is inserted next to them at
// the cold end of the shard, and by one background sweeper per Store.
//
// A counter costs about 170 bytes of heap, measured with 200,000 keys of
// about 16 bytes (such as "ip:203.1.13.64") by
//
//	go test -run TestBytesPerKey -v ./internal/memstore/
//
// Keys of 17 to 24 bytes cost 8 bytes more. The figure moves between about
// 170 and 280 bytes with how full each shard's map is between two of its
// growth steps; a full store at the default MaxKeys of 1<<20 measured
// 221 MB (211 bytes per counter), and stayed there while four times as many
// new keys churned through it.
package memstore

import (
	"context"
	"crypto/sha256"
	"fmt"
	"hash/maphash"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/window"
)

// Defaults applied by New to the zero fields of a Config.
const (
	// DefaultMaxKeys is the default bound on the number of counters.
	DefaultMaxKeys = 1 << 20
	// DefaultShards is the default number of shards.
	DefaultShards = 64
	// DefaultSweepInterval is the default time between two sweeps.
	DefaultSweepInterval = time.Minute
)

const (
	// maxShards bounds Config.Shards.
	maxShards = 1 << 16
	// maxKeyLen is the longest Key stored as is; longer keys are replaced by
	// their SHA-256 digest.
	maxKeyLen = 64
	// inlineCharges is how many charges Take handles without allocating.
	inlineCharges = 8
	// sweepBatch is how many counters sweep looks at per lock hold.
	sweepBatch = 256
	// digested is set in counterKey.w when key holds a digest, so that a
	// digest never equals a short key that happens to have the same bytes.
	// Windows are below 2^50 ms (see window.MaxProduct), so the bit is free.
	digested = 1 << 62
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// MaxKeys bounds the number of counters kept. When a shard is full, a
	// new counter evicts that shard's least recently used one. Zero means
	// DefaultMaxKeys (1<<20). It must be at least Shards.
	MaxKeys int
	// Shards is the number of independently locked parts of the store. It
	// is rounded up to a power of two, at most 1<<16. Zero means
	// DefaultShards (64).
	Shards int
	// Now is the store's clock, used when Take is given the zero time and
	// by the sweeper to decide which counters have expired. Nil means
	// time.Now.
	Now func() time.Time
	// SweepInterval is the time between two sweeps for expired counters.
	// Zero means DefaultSweepInterval (one minute); a negative value
	// disables the sweeper, and expired counters are then reclaimed only
	// when new counters are inserted or when the key cap evicts them.
	SweepInterval time.Duration
}

// Store is an in-memory store of sliding-window counters. It is safe for
// concurrent use. Call Close to stop its sweeper when it is no longer
// needed.
type Store struct {
	shards []shard
	mask   uint64
	seed   maphash.Seed
	now    func() time.Time
	stop   *stopper // nil when the sweeper is disabled
}

// counterKey identifies a counter. It is comparable, so map lookups with a
// key built from a Charge allocate nothing.
type counterKey struct {
	name string
	key  string // Key, or its SHA-256 digest when Key is longer than maxKeyLen
	w    int64  // window in milliseconds, with the digested bit if key is a digest
}

// entry is a counter and its place in its shard's LRU list.
type entry struct {
	k          counterKey
	s          window.State
	prev, next *entry
}

func (e *entry) expired(now int64) bool {
	return window.Expiry(e.s.Start, now, e.k.w&^digested) <= 0
}

// shard is one lock's worth of counters. head is the sentinel of a circular
// list ordered from most (head.next) to least (head.prev) recently used.
type shard struct {
	mu   sync.Mutex
	m    map[counterKey]*entry
	head entry
	cap  int
	_    [24]byte // pads shard to 128 bytes so shards don't share cache lines
}

// New returns a Store configured by cfg, or an error if cfg is invalid. The
// Store starts a sweeper goroutine unless cfg.SweepInterval is negative.
func New(cfg Config) (*Store, error) {
	maxKeys, shards, every, now := cfg.MaxKeys, cfg.Shards, cfg.SweepInterval, cfg.Now
	switch {
	case maxKeys < 0:
		return nil, fmt.Errorf("memstore: MaxKeys is %d, must not be negative", maxKeys)
	case maxKeys == 0:
		maxKeys = DefaultMaxKeys
	}
	switch {
	case shards < 0:
		return nil, fmt.Errorf("memstore: Shards is %d, must not be negative", shards)
	case shards > maxShards:
		return nil, fmt.Errorf("memstore: Shards is %d, must be at most %d", shards, maxShards)
	case shards == 0:
		shards = DefaultShards
	}
	n := 1
	for n < shards {
		n <<= 1
	}
	if maxKeys < n {
		return nil, fmt.Errorf("memstore: MaxKeys is %d, must be at least Shards (%d)", maxKeys, n)
	}
	if every == 0 {
		every = DefaultSweepInterval
	}
	if now == nil {
		now = time.Now
	}

	s := &Store{
		shards: make([]shard, n),
		mask:   uint64(n - 1),
		seed:   maphash.MakeSeed(),
		now:    now,
	}
	// Share MaxKeys out so that the capacities add up to exactly MaxKeys.
	base, extra := maxKeys/n, maxKeys%n
	for i := range s.shards {
		sh := &s.shards[i]
		sh.m = make(map[counterKey]*entry)
		sh.head.prev, sh.head.next = &sh.head, &sh.head
		sh.cap = base
		if i < extra {
			sh.cap++
		}
	}
	if every > 0 {
		st := &stopper{stop: make(chan struct{}), done: make(chan struct{})}
		s.stop = st
		// The sweeper holds the shards, not s, so that an unreachable Store
		// can be collected; the cleanup then stops the sweeper.
		go sweepEvery(s.shards, now, every, st)
		runtime.AddCleanup(s, func(st *stopper) { st.signal() }, st)
	}
	return s, nil
}

// Close stops the sweeper and waits for it to return. It is idempotent and
// always returns nil. The Store remains usable after Close; expired counters
// are then reclaimed only as new counters are inserted.
func (s *Store) Close() error {
	if s.stop != nil {
		s.stop.signal()
		<-s.stop.done
	}
	return nil
}

// Len returns the number of counters held, expired or not.
func (s *Store) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}

// Take decides charges at now, all or nothing, as the middleware Store
// contract describes: the request is admitted only if every charge fits its
// limit, and only then is each charge's cost counted. The zero now means the
// Store's clock (Config.Now).
//
// Take returns an error, and decides nothing, if out and charges differ in
// length, if a charge has an invalid Limit or a negative Cost, or if ctx is
// already done. A charge that costs more than its limit is simply denied.
//
// Only the admitted charges that cost something change a counter: reads
// (Cost 0) and denied requests neither create a counter, so probes of
// unknown keys use no memory, nor roll an existing one forward. A new
// counter keeps a copy of its Key, or of the Key's SHA-256 digest when the
// Key is longer than 64 bytes, and its Name as given, since names come from
// configuration rather than from requests. Two charges naming the
// same counter are each decided against the counter as it was before the
// request, and both costs are counted if it is admitted.
//
// Take allocates nothing for up to 8 charges on existing counters.
func (s *Store) Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
	if len(out) != len(charges) {
		return false, fmt.Errorf("memstore: %d decisions for %d charges, want as many", len(out), len(charges))
	}
	for i := range charges {
		c := &charges[i]
		if err := c.Limit.Validate(); err != nil {
			return false, fmt.Errorf("memstore: charge %d (%q): %w", i, c.Name, err)
		}
		if c.Cost < 0 {
			return false, fmt.Errorf("memstore: charge %d (%q): cost %d must not be negative", i, c.Name, c.Cost)
		}
	}
	if err := ctx.Err(); err != nil {
		return false, fmt.Errorf("memstore: %w", err)
	}
	if len(charges) == 0 {
		return true, nil
	}
	if now.IsZero() {
		now = s.now()
	}
	ms := now.UnixMilli()

	var (
		workBuf  [inlineCharges]work
		stateBuf [inlineCharges]window.State
		sumBuf   [inlineCharges][sha256.Size]byte
		lockBuf  [inlineCharges]uint32
		works    []work
		states   []window.State
		sums     [][sha256.Size]byte
		locks    []uint32
	)
	if n := len(charges); n <= inlineCharges {
		works, states, sums, locks = workBuf[:n], stateBuf[:n], sumBuf[:n], lockBuf[:0]
	} else {
		works, states, sums, locks = make([]work, n), make([]window.State, n), make([][sha256.Size]byte, n), make([]uint32, 0, n)
	}
	// Name each counter, find its shard, and spot charges that repeat a
	// counter, all before taking any lock.
	dup := false
	for i := range charges {
		c, w := &charges[i], &works[i]
		w.k = counterKey{name: c.Name, key: c.Key, w: c.Limit.Window.Milliseconds()}
		if len(c.Key) > maxKeyLen {
			sums[i] = sha256.Sum256(unsafe.Slice(unsafe.StringData(c.Key), len(c.Key)))
			w.k.w |= digested
		}
		w.shard = s.shardOf(w.storedKey(&sums[i]))
		w.first, w.cost = i, int64(c.Cost)
		for j := range i {
			if works[j].first == j && works[j].k == w.k {
				w.first, dup = j, true
				works[j].cost += w.cost
				break
			}
		}
		locks = insertSorted(locks, w.shard)
	}

	for _, si := range locks {
		s.shards[si].mu.Lock()
	}
	for i := range works {
		w := &works[i]
		if w.first != i {
			continue
		}
		sh := &s.shards[w.shard]
		k := w.k
		k.key = w.storedKey(&sums[i])
		if e := sh.m[k]; e != nil {
			sh.moveToFront(e)
			if e.expired(ms) {
				e.s = window.State{} // it can no longer tell anything
			}
			w.e, states[i] = e, e.s
		} else {
			states[i] = window.State{}
		}
	}
	if dup {
		for i := range works {
			if f := works[i].first; f != i {
				states[i] = states[f]
			}
		}
	}

	allowed := window.Take(states, ms, charges, out)

	if allowed {
		s.charge(works, states, sums, charges, ms)
	}
	for _, si := range locks {
		s.shards[si].mu.Unlock()
	}
	return allowed, nil
}

// shardOf returns the index of the shard that holds the counters of key, a
// stored key (possibly a digest).
func (s *Store) shardOf(key string) uint32 {
	return uint32(maphash.String(s.seed, key) & s.mask)
}

// work is Take's scratch space for one charge.
type work struct {
	k     counterKey // with Key as given, even when it is digested
	e     *entry     // the existing counter, or nil
	cost  int64      // the cost of every charge on the counter, if first == i
	shard uint32
	first int // index of the first charge naming the same counter
}

// storedKey returns the key of w's counter as the map holds it: Key, or
// its digest in sum, which must then be copied to be kept. It is rebuilt
// when needed rather than kept in w, which would make Take's buffers escape
// to the heap.
func (w *work) storedKey(sum *[sha256.Size]byte) string {
	if w.k.w&digested != 0 {
		return unsafe.String(&sum[0], len(sum))
	}
	return w.k.key
}

// charge writes back the counters of an admitted request: each counter that
// one of its charges costs something is set to its rolled state plus every
// cost charged to it, and created if new. Reads leave counters as they
// were, unrolled, as denials do. The shards of works must be locked.
func (s *Store) charge(works []work, states []window.State, sums [][sha256.Size]byte, charges []window.Charge, now int64) {
	// Update existing counters before inserting new ones, so that an
	// insertion cannot evict a counter this call still has to write.
	inserts := false
	for i := range works {
		w := &works[i]
		if w.first != i || w.cost == 0 {
			continue
		}
		// window.Take added charge i's cost; add those of the charges that
		// repeat its counter.
		states[i].Curr += w.cost - int64(charges[i].Cost)
		if w.e != nil {
			w.e.s = states[i]
		} else {
			inserts = true
		}
	}
	if !inserts {
		return
	}
	for i := range works {
		if w := &works[i]; w.first == i && w.cost > 0 && w.e == nil {
			// A fresh key, so that nothing kept points into sums.
			k := counterKey{name: charges[i].Name, key: strings.Clone(w.storedKey(&sums[i])), w: w.k.w}
			s.shards[w.shard].insert(k, states[i], now)
		}
	}
}

// insertSorted adds v to the ascending set s, unless it is already there.
func insertSorted(s []uint32, v uint32) []uint32 {
	i := len(s)
	for i > 0 && s[i-1] >= v {
		if s[i-1] == v {
			return s
		}
		i--
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}

// insert adds a counter for k with state st; k must not share memory with
// the caller's Charge. It first drops up to two expired counters at the cold
// end of the list, then, if the shard is still full, its least recently used
// counter. sh.mu must be held.
func (sh *shard) insert(k counterKey, st window.State, now int64) {
	for range 2 {
		e := sh.head.prev
		if e == &sh.head || !e.expired(now) {
			break
		}
		sh.remove(e)
	}
	if len(sh.m) >= sh.cap {
		sh.remove(sh.head.prev)
	}
	e := &entry{k: k, s: st}
	sh.m[k] = e
	sh.pushFront(e)
}

func (sh *shard) pushFront(e *entry) {
	e.prev, e.next = &sh.head, sh.head.next
	e.next.prev = e
	sh.head.next = e
}

func (sh *shard) moveToFront(e *entry) {
	if sh.head.next == e {
		return
	}
	e.prev.next, e.next.prev = e.next, e.prev
	sh.pushFront(e)
}

func (sh *shard) remove(e *entry) {
	e.prev.next, e.next.prev = e.next, e.prev
	e.prev, e.next = nil, nil
	delete(sh.m, e.k)
}

// sweep drops the expired counters of sh and returns how many it dropped.
// It walks from the least recently used end and releases sh.mu every
// sweepBatch counters, so that Take waits for tens of microseconds rather
// than the milliseconds a full shard takes. Counters that move while the
// lock is released may be missed until the next sweep.
func (sh *shard) sweep(now int64) int {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n, budget := 0, len(sh.m)
	for e, steps := sh.head.prev, 0; e != &sh.head && budget > 0; steps++ {
		if steps == sweepBatch {
			steps = 0
			sh.mu.Unlock()
			runtime.Gosched()
			sh.mu.Lock()
			if e.prev == nil { // removed meanwhile: start again at the end
				if e = sh.head.prev; e == &sh.head {
					break
				}
			}
		}
		budget--
		prev := e.prev
		if e.expired(now) {
			sh.remove(e)
			n++
		}
		e = prev
	}
	return n
}

// sweep drops every counter that is expired at now and returns how many it
// dropped. The sweeper calls it; tests call it directly.
func (s *Store) sweep(now time.Time) int {
	return sweepShards(s.shards, now.UnixMilli())
}

func sweepShards(shards []shard, now int64) int {
	n := 0
	for i := range shards {
		n += shards[i].sweep(now)
	}
	return n
}

// stopper stops the sweeper once.
type stopper struct {
	once sync.Once
	stop chan struct{}
	done chan struct{}
}

func (st *stopper) signal() { st.once.Do(func() { close(st.stop) }) }

// sweepEvery sweeps shards every interval until st is signalled.
func sweepEvery(shards []shard, now func() time.Time, every time.Duration, st *stopper) {
	t := time.NewTicker(every)
	defer t.Stop()
	sweepLoop(shards, now, t.C, st)
}

// sweepLoop sweeps shards at every tick until st is signalled, then closes
// st.done.
func sweepLoop(shards []shard, now func() time.Time, tick <-chan time.Time, st *stopper) {
	defer close(st.done)
	for {
		select {
		case <-st.stop:
			return
		case <-tick:
			sweepShards(shards, now().UnixMilli())
		}
	}
}
