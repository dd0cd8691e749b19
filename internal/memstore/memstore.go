// Package memstore is the in-memory store: a sliding-window counter per
// (Name, Key, Limit.Window), kept in sharded hash tables with a bounded
// number of counters. It decides with window.Take, so it answers exactly
// as every other store does.
//
// A Key's counters, whatever their Name and Window, live in one shard,
// chosen by a seeded hash of the Key, so that a request's charges on one Key
// take one lock. Charges on keys in different shards lock those shards in
// ascending order.
//
// # Identity
//
// A counter is identified by a 128-bit hash of (Name, Window, Key), not by
// the Key's bytes, which the store never keeps. Each 64-bit half is a
// maphash of the Key under a seed of its own, XORed with a mix of a seeded
// hash of the Name and of the Window that differs between the halves and
// is one-to-one in the Window; the three seeds are drawn at random by New.
// Counters of two different Keys share a record only if both halves
// collide: for keys nobody chose to collide, the chance that any two of n
// live counters do is about n²/2^129, 2^-89 (1.6e-27) for a million
// counters. An attacker who wants their key to land on a victim's counter
// must find a 128-bit collision under seeds they never see, and learns
// nothing from a miss. Two Names of the configuration collide, merging
// their counters of equal Window, only if their 64-bit hashes do: 2^-64
// per pair of names, drawn once per Store, and not something a request can
// influence.
//
// # Layout
//
// A counter is a 40-byte record: the two halves of its identity (16
// bytes), the start of its window (8), its previous and current counts as
// two uint32 (8), and 8 bytes holding when it expires (milliseconds after
// the start below 2^31 ms, about 24.8 days, and whole seconds rounded up
// beyond, which only keeps a long-window counter up to a second longer)
// and the access stamp used for eviction. A count of 2^32-1 or more, or an
// expiry more than 68 years away, moves the record's state to a small
// per-shard map of full 64-bit states (a "wide" record), so decisions stay
// exact whatever the counts.
//
// Records are packed in chunks of 256 (10,240 bytes, an allocator size
// class); removing a record moves the shard's last record into its place,
// so the chunks stay full and the last ones can be freed. They are found
// through an open-addressing index of uint32 slots with linear probing, at
// most 3/4 full: a slot holds the record's number and as many bits of its
// hash as are left over, so that probes that miss rarely read a record.
//
// # Bounds and eviction
//
// Memory is bounded by Config.MaxKeys. Each shard holds at most its share
// of MaxKeys counters. A new counter in a full shard evicts one, chosen as
// Redis's approximate LRU does: among 8 counters picked at random, the
// first one that has expired, else the least recently used (each shard
// stamps a counter with a tick of its own clock at every read or write). A
// shard holding 8 counters or fewer is searched whole, which is exact LRU.
// Each insertion also checks the next two counters of the shard, in turn,
// and drops them if they have expired.
//
// # Giving memory back
//
// One background sweeper per Store drops every counter that can no longer
// affect a decision (see window.Expiry), then frees the chunks left empty
// and rebuilds any index that has become four times larger than its
// counters need (a Go map would never shrink). Counters written at t with
// windows of w are therefore all released by the first sweep at or after
// t + 2w. A sweep costs about 50 ns per counter it drops and releases the
// shard's lock every 256 counters; rebuilding an index, smaller after a
// sweep or twice as large when a shard grows, holds the lock for about
// 10 ns per counter (0.1 to 0.2 ms for a full shard at the defaults).
//
// # Measured
//
// One counter costs 48.8 bytes of heap with the default 64 shards,
// measured after GC with 1,000,000 keys such as "ip:203.1.13.64" on one
// rule with a 10 s window (the length of the Key does not matter):
// 40.6 bytes of records (40, and the last, partly full chunk of each shard)
// and 8.4 of index. The index is a power of two in size, so it costs
// between 5.3 and 10.7 bytes per counter as shards fill. A store full at
// the default MaxKeys of 1<<20 holds 50.5 MB, and stays there however many
// new keys churn through it. Once those counters have expired, one sweep
// brings the store back to 13 KB; when a tenth of them are still live, to
// 54 bytes per live counter. Measured by
//
//	go test -run 'TestBytesPerKey|TestMemoryReleased' -v ./internal/memstore/
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"time"

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
	// inlineCharges is how many charges Take handles without allocating.
	inlineCharges = 8
	// sweepBatch is how many counters sweep looks at per lock hold.
	sweepBatch = 256
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// MaxKeys bounds the number of counters kept. When a shard is full, a
	// new counter evicts one of that shard's expired or least recently
	// used counters (an approximate LRU; see the package doc). Zero means
	// DefaultMaxKeys (1<<20). It must be at least Shards, and at most
	// 2^32-1 per shard.
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
	// when new counters are inserted or when the key cap evicts them, and
	// the memory of a store that shrinks is not given back.
	SweepInterval time.Duration
}

// Store is an in-memory store of sliding-window counters. It is safe for
// concurrent use. Call Close to stop its sweeper when it is no longer
// needed.
type Store struct {
	shards     []shard
	shardShift uint // a Key's shard is the top bits of its second hash
	// The seeds of a counter's identity: two for the Key, one for the Name.
	key1, key2, name maphash.Seed
	now              func() time.Time
	stop             *stopper // nil when the sweeper is disabled
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
	if per := int64(maxKeys/n) + int64(min(maxKeys%n, 1)); per > maxShardKeys {
		return nil, fmt.Errorf("memstore: MaxKeys is %d, must be at most %d per shard (%d shards)", maxKeys, int64(maxShardKeys), n)
	}
	if every == 0 {
		every = DefaultSweepInterval
	}
	if now == nil {
		now = time.Now
	}

	s := &Store{
		shards:     make([]shard, n),
		shardShift: uint(64 - bits.TrailingZeros(uint(n))),
		key1:       maphash.MakeSeed(),
		key2:       maphash.MakeSeed(),
		name:       maphash.MakeSeed(),
		now:        now,
	}
	// Share MaxKeys out so that the capacities add up to exactly MaxKeys.
	base, extra := maxKeys/n, maxKeys%n
	for i := range s.shards {
		c := base
		if i < extra {
			c++
		}
		s.shards[i].init(c, rand.Uint64())
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
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// keyHash returns the two seeded hashes of a Key.
func (s *Store) keyHash(key string) (uint64, uint64) {
	return maphash.String(s.key1, key), maphash.String(s.key2, key)
}

// ident returns the identity of the counter for (name, w) of the Key whose
// keyHash is k1, k2: each half XORs the Key's hash with a different mix of
// a seeded hash of name and of w, one-to-one in w, so that one Name's
// windows never share an identity.
func (s *Store) ident(k1, k2 uint64, name string, w int64) ident {
	n := maphash.String(s.name, name)
	return ident{
		h1: k1 ^ (n + uint64(w)*0x9e3779b97f4a7c15),
		h2: k2 ^ mix64(n^uint64(w)*0xc2b2ae3d27d4eb4f),
	}
}

// mix64 is the finaliser of splitmix64, a bijection.
func mix64(z uint64) uint64 {
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return z ^ z>>31
}

// shardOf returns the shard of the Key whose second hash is k2.
func (s *Store) shardOf(k2 uint64) uint32 {
	return uint32(k2 >> s.shardShift) // 0 with one shard: the shift is 64
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
// unknown keys use no memory, nor roll an existing one forward. A counter
// keeps a hash of its Name, Window and Key, never the Key itself. Two
// charges naming the same counter are each decided against the counter as
// it was before the request, and both costs are counted if it is admitted.
//
// Take allocates nothing for up to 8 charges on existing counters, except
// once when a counter's count first reaches 2^32-1.
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
		lockBuf  [inlineCharges]uint32
		works    []work
		states   []window.State
		locks    []uint32
	)
	if n := len(charges); n <= inlineCharges {
		works, states, locks = workBuf[:n], stateBuf[:n], lockBuf[:0]
	} else {
		works, states, locks = make([]work, n), make([]window.State, n), make([]uint32, 0, n)
	}
	// Name each counter, find its shard, and spot charges that repeat a
	// counter, all before taking any lock.
	dup := false
	var k1, k2 uint64
	for i := range charges {
		c, w := &charges[i], &works[i]
		if i == 0 || c.Key != charges[i-1].Key {
			k1, k2 = s.keyHash(c.Key)
		}
		w.id = s.ident(k1, k2, c.Name, c.Limit.Window.Milliseconds())
		w.shard = s.shardOf(k2)
		w.first, w.cost, w.rec = i, int64(c.Cost), -1
		for j := range i {
			if works[j].first == j && works[j].id == w.id {
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
		states[i] = window.State{}
		if r := sh.lookup(w.id); r >= 0 {
			sh.touch(r)
			if st, until := sh.state(r); ms < until {
				states[i] = st
			} // else it can no longer tell anything
			w.rec = r
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
		s.charge(works, states, charges, ms)
	}
	for _, si := range locks {
		s.shards[si].mu.Unlock()
	}
	return allowed, nil
}

// work is Take's scratch space for one charge.
type work struct {
	id    ident
	rec   int   // the number of the existing record in its shard, or -1
	first int   // index of the first charge naming the same counter
	cost  int64 // the cost of every charge on the counter, if first == i
	shard uint32
}

// until returns when a counter written at now with state st and windows of
// w ms expires: now plus window.Expiry, rounded up to the millisecond.
func until(st window.State, now, w int64) int64 {
	d := window.Expiry(st.Start, now, w)
	if d <= 0 {
		return now
	}
	return now + int64((d+time.Millisecond-1)/time.Millisecond)
}

// charge writes back the counters of an admitted request: each counter that
// one of its charges costs something is set to its rolled state plus every
// cost charged to it, and created if new. Reads leave counters as they
// were, unrolled, as denials do. The shards of works must be locked.
func (s *Store) charge(works []work, states []window.State, charges []window.Charge, now int64) {
	// Update existing counters before inserting new ones: an insertion may
	// evict or move records, which would invalidate the numbers in works.
	inserts := false
	for i := range works {
		w := &works[i]
		if w.first != i || w.cost == 0 {
			continue
		}
		// window.Take added charge i's cost; add those of the charges that
		// repeat its counter.
		states[i].Curr += w.cost - int64(charges[i].Cost)
		if w.rec >= 0 {
			s.shards[w.shard].set(w.rec, states[i], until(states[i], now, charges[i].Limit.Window.Milliseconds()))
		} else {
			inserts = true
		}
	}
	if !inserts {
		return
	}
	for i := range works {
		if w := &works[i]; w.first == i && w.cost > 0 && w.rec < 0 {
			s.shards[w.shard].insert(w.id, states[i], until(states[i], now, charges[i].Limit.Window.Milliseconds()), now)
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
