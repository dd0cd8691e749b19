// Package memstore is the in-memory store: a counter per (Name, Key,
// Limit.Series) of any algorithm (sliding window, fixed window, token
// bucket, leaky bucket, sliding log), kept in sharded hash tables with a
// bounded number of counters. It decides with window.Take, so it answers
// exactly as every other store does (docs/algorithms.md).
//
// Beyond Take, it does to its counters what the Redis store does to its
// own, with the arithmetic of package window: Settle charges a usage known
// once the request has run, whatever fits (docs/usage.md); TakeAt and
// Refund take an admitted charge back (docs/logins.md); GiveBack frees a
// queued request's place; Reset drops a client's counters (the admin
// handler's reset, docs/operations.md).
//
// A Key's counters, whatever their Name and limit, live in one shard,
// chosen by a seeded hash of the Key, so that a request's charges on one Key
// take one lock. Charges on keys in different shards lock those shards in
// ascending order.
//
// # Identity
//
// A counter is identified by a 128-bit hash of (Name, Series, Key), not by
// the Key's bytes, which the store never keeps. Series is Limit.Series: the
// window in ms for a sliding window, with the algorithm, the calendar
// period and its time zone mixed in for the others, so that a limit whose
// algorithm changes starts afresh, and one whose Requests change (plans)
// does not. Each 64-bit half is a maphash of the Key under a seed of its
// own, XORed with a mix of a seeded hash of the Name and of the Series
// that differs between the halves and is one-to-one in the Series; the
// three seeds are drawn at random by New. Counters of two different Keys
// share a record only if both halves collide: for keys nobody chose to
// collide, the chance that any two of n live counters do is about
// n²/2^129, 2^-89 (1.6e-27) for a million counters. An attacker who wants
// their key to land on a victim's counter must find a 128-bit collision
// under seeds they never see, and learns nothing from a miss. Two Names of
// the configuration collide, merging their counters of equal Series, only
// if their 64-bit hashes do: 2^-64 per pair of names, drawn once per
// Store, and not something a request can influence.
//
// # Layout
//
// A counter is a 40-byte record: the two halves of its identity (16
// bytes), 16 bytes of state, and 8 bytes holding when it expires
// (milliseconds after the state's start below 2^31 ms, about 24.8 days,
// and whole seconds rounded up beyond, which only keeps a long-lived
// counter up to a second longer) and the access stamp used for eviction.
// The record does not know its algorithm: the charges that name it do,
// since the Series in its identity includes it. The 16 bytes of state
// hold, by algorithm:
//
//   - sliding window: the start of the current window (8 bytes) and the
//     previous and current counts as two uint32;
//   - fixed window: the start of the window and its count, the same way;
//   - token or leaky bucket counted in 1 ms ticks (window.Limit.Tick,
//     which is 1 ms unless 3 * (max(Requests, Burst) + 1) * window-in-ms
//     exceeds 2^53): the instant of the level and the level itself, a
//     uint64 below 2^53 however long the window (a token is window-in-ms
//     drops, so a month's bucket of 10 holds 2.6e10);
//   - sliding log: the instant it expires, and the number of its slot in
//     a per-shard log table (see Sliding logs).
//
// A count of 2^32-1 or more, a bucket counted in coarser ticks, or an
// expiry more than 68 years away moves the record's state to a small
// per-shard map of full 64-bit states (a "wide" record), so decisions stay
// exact whatever the counts. The value of the counts field tells the
// encodings apart: a narrow count or level never has its high 32 bits all
// ones, which mark a wide record (all 64 bits ones) or a log.
//
// Records are packed in chunks of 256 (10,240 bytes, an allocator size
// class); removing a record moves the shard's last record into its place,
// so the chunks stay full and the last ones can be freed. They are found
// through an open-addressing index of uint32 slots with linear probing, at
// most 3/4 full: a slot holds the record's number and as many bits of its
// hash as are left over, so that probes that miss rarely read a record.
//
// # Sliding logs
//
// A sliding log's entries live in a slot of its shard's log table: a
// buffer of window.Entry (16 bytes: the instant and the count of the
// requests admitted in one millisecond) and their sum, 32 bytes; the
// offset of the log in its buffer is kept in the record. window.Take rolls
// and charges the buffer in place, without a copy, and writes to it only
// when it charges it, so reads and denied requests leave a log exactly as
// it was. After a charge the store keeps the buffer to the log's measure
// (see log.go): a log moves back to the front of its buffer as entries
// leave it, grows as append grows a slice but never beyond Requests +
// Requests/64 + 1 entries of the limit that charged it (rounded up to the
// allocator's size class), and gives its buffer back when it shrinks to a
// quarter. A log holds at most Requests entries (the largest Requests it
// was charged under in the last window, if plans changed), since entries
// merge per millisecond and each costs at least 1, and Requests of a
// sliding log is at most max(MaxLog, 1000) by window.Limit.Validate:
// memory stays bounded by MaxKeys logs of that size whatever keys clients
// invent. A log dropped by eviction or a sweep
// frees its slot and its buffer at once; a sweep that leaves a table
// mostly free rebuilds it to fit. Two charges of one request on the same
// log (a repeated counter) allocate a copy of it.
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
// # Expiry
//
// A counter expires when it can no longer affect a decision, as
// window.ExpiryOf says under the limit that charged it last: two windows
// after the start of its current one for a sliding window, at the end of
// its window for a fixed window, when the bucket is full (the queue
// empty) again for a token (leaky) bucket, and one window after its newest
// entry for a sliding log. From then on it is taken as absent, as every
// store takes it, even before a sweep drops it. For the windows and the
// log, that is what rolling it would give. A bucket's refill depends on
// its Requests, which plans may change: a bucket charged under a faster
// plan and read, after it was full again, under a slower one is full,
// where rolling its old level at the slower rate would not be.
//
// # Giving memory back
//
// One background sweeper per Store drops every counter that has expired,
// then frees the chunks left empty and rebuilds any index that has become
// four times larger than its counters need (a Go map would never shrink),
// and the wide map and log table likewise. Sliding-window counters written
// at t with windows of w are therefore all released by the first sweep at
// or after t + 2w. A sweep costs about 50 ns per counter it drops and
// releases the shard's lock every 256 counters; rebuilding an index,
// smaller after a sweep or twice as large when a shard grows, holds the
// lock for about 10 ns per counter (0.1 to 0.2 ms for a full shard at the
// defaults).
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
// 54 bytes per live counter.
//
// Per algorithm, with the same keys and a 10 s window, a million requests
// each (bytes of heap per key, after GC):
//
//	sliding window    1,000,000 keys, 1 request each        48.8
//	fixed window      1,000,000 keys, 1 request each        48.8
//	token bucket      1,000,000 keys, 1 request each        48.8
//	leaky bucket      1,000,000 keys, 1 request each        48.8
//	sliding log       1,000,000 keys, 1 entry each         102.6
//	sliding log of 10   100,000 keys, full: 10 entries     272
//	sliding log of 100   10,000 keys, full: 100 entries   1,917
//	sliding log of 1000   1,000 keys, full: 1000 entries 16,510
//
// A log costs the record, its 32-byte slot (up to twice that as the table
// grows by doubling) and its buffer: 16 bytes per entry, with the room of
// Requests/64 + 1 entries rounded up to a size class (11 entries for 10,
// 112 for 100, 1024 for 1000). A store full of logs of 1000 entries at the
// default MaxKeys would hold 17 GB: MaxKeys, or MaxLog, should be chosen
// for the logs a deployment keeps. Measured by
//
//	go test -run 'TestBytesPerKey|TestBytesPerAlgorithm|TestMemoryReleased|TestLogMemoryReleased' -v ./internal/memstore/
package memstore

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/bits"
	"math/rand/v2"
	"runtime"
	"slices"
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

// Store is an in-memory store of counters of every algorithm. It is safe for
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

// Evictions returns how many counters were dropped to make room for new
// ones since the store was made (counters that had expired included, when
// the sample found one).
func (s *Store) Evictions() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.evicted
		sh.mu.Unlock()
	}
	return n
}

// keyHash returns the two seeded hashes of a Key.
func (s *Store) keyHash(key string) (uint64, uint64) {
	return maphash.String(s.key1, key), maphash.String(s.key2, key)
}

// ident returns the identity of the counter for (name, series) of the Key
// whose keyHash is k1, k2, series being a Limit.Series: each half XORs the
// Key's hash with a different mix of a seeded hash of name and of series,
// one-to-one in series, so that one Name's series (windows, algorithms,
// periods) never share an identity.
func (s *Store) ident(k1, k2 uint64, name string, series uint64) ident {
	n := maphash.String(s.name, name)
	return ident{
		h1: k1 ^ (n + series*0x9e3779b97f4a7c15),
		h2: k2 ^ mix64(n^series*0xc2b2ae3d27d4eb4f),
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

// checkCharge returns an error naming charge i if its Limit is invalid or
// its Cost negative: what Take, GiveBack and Refund check before they
// count anything.
func checkCharge(i int, c *window.Charge) error {
	if err := c.Limit.Validate(); err != nil {
		return fmt.Errorf("memstore: charge %d (%q): %w", i, c.Name, err)
	}
	if c.Cost < 0 {
		return fmt.Errorf("memstore: charge %d (%q): cost %d must not be negative", i, c.Name, c.Cost)
	}
	return nil
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
// unknown keys use no memory, nor roll an existing one forward (a sliding
// log keeps even the entries that have left its window). A counter keeps a
// hash of its Name, Series and Key, never the Key itself. Two charges
// naming the same counter are each decided against the counter as it was
// before the request, and both costs are counted if it is admitted: the
// second one's after rolling the counter again under its own limit, as
// window.Add's callers do.
//
// Take allocates nothing for up to 8 charges on existing counters, except
// once when a counter first needs a wide record, when a sliding log grows
// or shrinks its buffer, and when one request charges a sliding log twice.
func (s *Store) Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
	if len(out) != len(charges) {
		return false, fmt.Errorf("memstore: %d decisions for %d charges, want as many", len(out), len(charges))
	}
	for i := range charges {
		if err := checkCharge(i, &charges[i]); err != nil {
			return false, err
		}
	}
	return s.TakeValid(ctx, now, charges, out)
}

// TakeValid is Take for charges known to be valid: each Limit passed
// window.Limit.Validate and no Cost is negative, and out is as long as
// charges (the middleware checks its rules' limits once, when it compiles
// them). It skips those checks; it still returns ctx's error when ctx is
// done.
func (s *Store) TakeValid(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
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
	if len(charges) == 1 {
		return s.takeOne(ms, &charges[0], &out[0]), nil
	}
	return s.decide(ms, charges, out, false), nil
}

// Settle charges the costs of charges at now whether they fit or not
// (window.SettleAll): the usage of admitted requests, settled once they
// have run. A counter it takes past its limit is in debt, which the
// decisions written to out report (Decision.Debt), with the counter as a
// read would find it after the charge. Charges of cost 0 change nothing
// and create no counter. The zero now means the Store's clock. Settle
// returns an error, and charges nothing, for the inputs that Take
// refuses.
func (s *Store) Settle(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) error {
	if len(out) != len(charges) {
		return fmt.Errorf("memstore: %d decisions for %d charges, want as many", len(out), len(charges))
	}
	for i := range charges {
		if err := checkCharge(i, &charges[i]); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	if len(charges) == 0 {
		return nil
	}
	if now.IsZero() {
		now = s.now()
	}
	s.decide(now.UnixMilli(), charges, out, true)
	return nil
}

// decide is Take at ms (settle false), or Settle (true), for checked
// charges.
func (s *Store) decide(ms int64, charges []window.Charge, out []window.Decision, settle bool) bool {
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
		w.id = s.ident(k1, k2, c.Name, series(&c.Limit))
		w.shard = s.shardOf(k2)
		w.first, w.rep, w.cost, w.rec = int32(i), int32(i), int64(c.Cost), -1
		for j := range i {
			if f := &works[j]; f.first == int32(j) && f.id == w.id {
				w.first, dup = int32(j), true
				f.cost += w.cost
				if charges[f.rep].Cost == 0 {
					f.rep = int32(i)
				}
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
		if w.first != int32(i) {
			continue
		}
		sh := &s.shards[w.shard]
		states[i] = window.State{}
		if r := sh.lookup(w.id); r >= 0 {
			sh.touch(r)
			st, until := sh.state(r, charges[i].Limit.Algorithm)
			if ms < until {
				states[i] = st
			} else {
				// It can no longer tell anything; a log's buffer may
				// serve again.
				states[i].Log = st.Log[:0]
			}
			w.rec = r
		}
	}
	if dup {
		spread(works, states, charges)
	}

	allowed := true
	if settle {
		window.SettleAll(states, ms, charges, out)
	} else {
		allowed = window.Take(states, ms, charges, out)
	}

	if allowed {
		s.charge(works, states, charges, ms, dup, settle)
	}
	for _, si := range locks {
		s.shards[si].mu.Unlock()
	}
	return allowed
}

// takeOne is Take for a single charge, decided as the general case
// decides it (window.Take, then charge; window.TakeOne and DescribeTo are
// window.Take for one charge), with less bookkeeping and a
// shorter hold of the lock: the Decision of a counter whose state is a
// copy (every algorithm but the sliding log, whose log is the shard's own
// memory) is described after the lock is released.
func (s *Store) takeOne(ms int64, c *window.Charge, out *window.Decision) bool {
	k1, k2 := s.keyHash(c.Key)
	id := s.ident(k1, k2, c.Name, series(&c.Limit))
	sh := &s.shards[s.shardOf(k2)]
	l, cost := &c.Limit, int64(c.Cost)
	var st window.State
	sh.mu.Lock()
	r := sh.lookup(id)
	if r >= 0 {
		sh.touch(r)
		cur, until := sh.state(r, l.Algorithm)
		if ms < until {
			st = cur
		} else {
			// It can no longer tell anything; a log's buffer may serve
			// again.
			st.Log = cur.Log[:0]
		}
	}
	at, allowed := window.TakeOne(&st, ms, l, cost)
	if l.Algorithm == window.SlidingLog {
		// Described before the log is stored, which may move it.
		window.DescribeTo(out, &st, at, l, cost, allowed)
	}
	if allowed && cost > 0 {
		if r >= 0 {
			sh.set(r, &st, until(l, &st, ms), l)
		} else {
			sh.insert(id, &st, until(l, &st, ms), ms, l)
		}
	}
	sh.mu.Unlock()
	if l.Algorithm != window.SlidingLog {
		window.DescribeTo(out, &st, at, l, cost, allowed)
	}
	return allowed
}

// GiveBack gives back the places of charges admitted with a Delay by a
// LeakyBucket, or the tokens of a TokenBucket's: it takes each charge's
// cost off its counter's level, never below empty (window.GiveBack), so
// that the requests after it do not wait for it. now is the instant the
// charges were decided at; the zero time means the Store's clock. Charges
// of other algorithms, and counters that no longer exist or have expired,
// are left as they are: GiveBack never creates a counter. It returns an
// error, and gives nothing back, if a charge has an invalid Limit or a
// negative Cost, or if ctx is already done. It implements
// middleware.Returner.
func (s *Store) GiveBack(ctx context.Context, now time.Time, charges []window.Charge) error {
	for i := range charges {
		if err := checkCharge(i, &charges[i]); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("memstore: %w", err)
	}
	if now.IsZero() {
		now = s.now()
	}
	ms := now.UnixMilli()
	for i := range charges {
		c := &charges[i]
		if a := c.Limit.Algorithm; c.Cost == 0 || a != window.TokenBucket && a != window.LeakyBucket {
			continue
		}
		k1, k2 := s.keyHash(c.Key)
		id, sh := s.ident(k1, k2, c.Name, series(&c.Limit)), &s.shards[s.shardOf(k2)]
		sh.mu.Lock()
		if r := sh.lookup(id); r >= 0 {
			if st, exp := sh.state(r, c.Limit.Algorithm); ms < exp {
				st, _ = c.Limit.Roll(st, ms)
				window.GiveBack(&st, c.Limit, int64(c.Cost))
				sh.set(r, &st, until(&c.Limit, &st, ms), &c.Limit)
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// work is Take's scratch space for one charge.
type work struct {
	id   ident
	rec  int   // the number of the existing record in its shard, or -1
	cost int64 // the cost of every charge on the counter, if first == i
	// first is the index of the first charge naming the same counter. On
	// the first, rep is the first charge on the counter that costs
	// something (if none does, the last one): the one whose state
	// window.Take charges in the counter's own memory; and charge sets
	// last to the last one, whose limit says when the counter expires.
	first, rep, last int32
	shard            uint32
}

// spread gives each charge that repeats a counter the counter's state, as
// read for the first charge naming it. The log of a sliding log is given
// to the group's rep only: window.Take charges logs in place, so every
// other charge gets a copy, lest its cost be charged to the rep's log or
// the rep's to its own.
func spread(works []work, states []window.State, charges []window.Charge) {
	for i := range works {
		f := works[i].first
		if f == int32(i) {
			continue
		}
		states[i] = states[f]
		if states[i].Log != nil {
			states[i].Log = slices.Clone(states[i].Log)
		}
	}
	for i := range works {
		w := &works[i]
		if w.first == int32(i) && w.rep != int32(i) && charges[w.rep].Cost > 0 && states[i].Log != nil {
			states[w.rep].Log, states[i].Log = states[i].Log, states[w.rep].Log
		}
	}
}

// series returns l.Series() without a call for the sliding window, whose
// Series is its window in milliseconds.
func series(l *window.Limit) uint64 {
	if l.Algorithm == window.SlidingWindow {
		return uint64(l.Window.Milliseconds())
	}
	return l.Series()
}

// until returns when a counter of l written at now with state st expires:
// now plus window.ExpiryOf, rounded up to the millisecond. That of a
// sliding window is window.Expiry, inlined.
func until(l *window.Limit, st *window.State, now int64) int64 {
	var d time.Duration
	if l.Algorithm == window.SlidingWindow {
		d = window.Expiry(st.Start, now, l.Window.Milliseconds())
	} else {
		d = window.ExpiryOf(*l, *st, now)
	}
	if d <= 0 {
		return now
	}
	return now + int64((d+time.Millisecond-1)/time.Millisecond)
}

// charge writes back the counters of an admitted request: each counter that
// one of its charges costs something is set to its rolled state plus every
// cost charged to it, and created if new. Reads leave counters as they
// were, unrolled, as denials do. dup says whether charges repeat a
// counter. The shards of works must be locked.
//
// window.Take charged the first charge that costs something on each
// counter, its rep; the costs of the charges that repeat it are added as
// though each came in turn, rolling the state under its own limit
// (window.Add, or window.Settle for a settle), and the counter expires as
// the limit of the last one says.
func (s *Store) charge(works []work, states []window.State, charges []window.Charge, now int64, dup, settle bool) {
	// Update existing counters before inserting new ones: an insertion may
	// evict or move records, which would invalidate the numbers in works.
	inserts := false
	for i := range works {
		w := &works[i]
		if w.first != int32(i) || w.cost == 0 {
			continue
		}
		st, last := &states[w.rep], w.rep
		if dup && w.cost != int64(charges[last].Cost) {
			for j := int(w.rep) + 1; j < len(works); j++ {
				if works[j].first == int32(i) && charges[j].Cost > 0 {
					last = int32(j)
					l := &charges[j].Limit
					var at int64
					*st, at = l.Roll(*st, now)
					if settle {
						window.Settle(st, at, *l, int64(charges[j].Cost))
					} else {
						window.Add(st, at, *l, int64(charges[j].Cost))
					}
				}
			}
		}
		w.last = last
		l := &charges[last].Limit
		if w.rec >= 0 {
			s.shards[w.shard].set(w.rec, st, until(l, st, now), l)
		} else {
			inserts = true
		}
	}
	if !inserts {
		return
	}
	for i := range works {
		if w := &works[i]; w.first == int32(i) && w.cost > 0 && w.rec < 0 {
			st, l := &states[w.rep], &charges[w.last].Limit
			s.shards[w.shard].insert(w.id, st, until(l, st, now), now, l)
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
