// Package denycache remembers the denials of a rate-limit store, so that a
// client that keeps knocking while it is limited is turned away locally,
// without a round trip to the store. It sits in front of the store seam and
// serves every store and algorithm whose decisions have the shape of
// window.Decision.
//
// # What is remembered
//
// After the store denied a request, Record keeps, for every charge whose
// Decision is a denial with RetryAfter > 0, the fact
//
//	counter C admits no request of cost >= c before now + RetryAfter
//
// where C is the counter named by the charge's Key, Name and Limit (its
// Series, Requests and Burst), c is the charge's Cost and now the instant
// passed to Record, together with the Decision the store gave.
// Limit.Requests and Limit.Burst are part of the identity because a counter
// read under a larger limit (a plan that changed) admits sooner: each limit
// has its own entries. The reasoning below holds for every algorithm.
//
// Lookup denies a request if any of its charges names a counter that has a
// live entry and costs at least the entry's cost. It returns the index of
// the first such charge and the entry's Decision aged by the time that
// passed since Record: RetryAfter, ResetAfter and NextAfter are reduced by
// the elapsed time but never below 1 ms while the entry lives (values that
// were 0, or -1ns for never, are returned as they were), Remaining is
// returned as stored and Allowed is false. A request of larger cost than
// the entry's would wait at least as long, so for it RetryAfter is a lower
// bound. The request's other charges are not decided: the cache looked no
// further than the first match, so the caller builds the all-or-nothing
// denial from that one Decision and fills the others as it sees fit (for
// example as not allowed with no figures of their own), and must not
// present them as the store's answers.
//
// # Guarantees
//
// The cache never admits anything: Lookup either denies or says it does
// not know, and the caller then asks the store.
//
// The cache never denies a request that the store would admit, except
// during the time between the store's decision and Record. RetryAfter is
// computed as if no further request arrived, and further requests can only
// make the counter stricter: a denied request counts nothing, an admitted
// one only adds to the counts, and a larger cost never fits sooner than a
// smaller one. So "no cost >= c before now + RetryAfter" stays true until
// the entry expires, whatever happens meanwhile. The entry starts at the
// instant given to Record rather than at the store's own instant; passing
// the instant read just before the store was asked (the now given to
// Store.Take) makes the gap at most the store's rounding of that instant
// down to its millisecond, and an instant read after the answer adds at
// most one round trip. A request of cost smaller than the entry's cost does
// not match and goes to the store.
//
// That reasoning assumes the store does not lose counts. If it does (an
// in-memory store that evicted the counter to stay within its bounds, a
// Redis that lost data, an administrator's reset) the store may admit
// earlier than the cache expects. So may a counter whose admitted charges
// are later taken back (a rule that counts by outcome, a usage that came
// in under its estimate): package middleware records no denial of a
// request with such charges. Forget drops a Key's entries after a
// reset, and Config.MaxTTL bounds how long any one entry can outlive such
// a loss.
//
// A charge whose cost exceeds its limit never fits, and the store answers
// it with RetryAfter -1ns. Record keeps it for a short fixed time,
// NeverTTL, so that a misconfigured rule does not send every request to the
// store, but only if no live entry of that counter exists: a live entry
// already denies every such charge, since Lookup answers a charge of cost
// greater than the limit's capacity (Limit.Capacity: Requests, or a token
// bucket's Burst) from any live entry of its counter, with RetryAfter
// -1ns. This is exact (cost > capacity never fits, whatever the counts), and the short life only keeps the Decision's other figures from
// growing stale.
//
// When Record meets a live entry of the same counter it keeps the old one
// only if it denies at least as much for at least as long (its cost is not
// larger and it lives no shorter); otherwise the new denial replaces it.
// Both are true facts, so either choice is safe; the rule keeps the more
// useful one when one is plainly better, and the fresher one otherwise.
//
// # Identity and collisions
//
// Keys come from requests and may be hostile, so the cache keeps no Key:
// an entry holds a 128-bit digest of the Key (two maphash values with
// independent random seeds) and a 64-bit digest of (Name, Series,
// Requests, Burst) (a third seed), and a counter matches an entry only if all
// three words are equal. For keys the attacker does not choose, the chance
// that two live counters of different Keys share an entry is about 2^-128
// per pair; an attacker who wants their key to land on a victim's must
// find a 128-bit collision under seeds they never see, and learns nothing
// from misses. The rule digest does not depend on the Key, and the Name
// and the limit come from configuration, not from requests: two
// configured limits collide with probability 2^-64 per pair and process,
// and then only for one Key's own counters. And a collision could only
// deny the other counter's requests until that one entry expires (one
// RetryAfter, at most Config.MaxTTL), never admit anything.
//
// # Bounds and eviction
//
// The cache holds at most Config.MaxEntries entries, whatever keys it is
// shown. Entries live in buckets of 8 (fewer when MaxEntries is below 8);
// all the entries of one Key share the bucket chosen by its digest, so a
// request's charges on one Key are looked up in one place and Forget finds
// them at once. Expired entries are dropped when Lookup meets them and by
// any Record into their bucket. A Record into a full bucket first drops the
// expired entries, then, if none expired, evicts the entry that expires
// soonest (the one whose loss costs the fewest store calls). A Key that has
// more than 8 live denials at once therefore evicts its own, and keys
// that hash to the same bucket compete for its 8 places; an eviction only
// ever sends requests to the store.
//
// # Concurrency and memory layout
//
// A bucket is a sequence lock, the 8 entries' first Key words (tags, one
// cache line, so that a miss reads one line) and the 8 entries, 72 bytes
// each: the rest of the identity, the cost, the instants of recording and
// expiry, and the four figures of the Decision. Every field is read and
// written with sync/atomic. Lookup takes no lock and writes nothing (except
// to drop an expired entry): it scans the tags, and on a match reads the
// entry and checks that the sequence did not change meanwhile, retrying a
// few times and otherwise reporting a miss, which is always safe. Readers
// of one hot Key therefore share its cache lines read-only and do not
// serialize. Writers take the bucket's sequence lock with a
// compare-and-swap; Record gives up after a few failed attempts (a dropped
// record only costs a store call, and the writer holding the bucket is
// most likely recording the same denial), Forget waits.
//
// Buckets are allocated on first use; the table of bucket pointers costs
// 1 byte per entry of MaxEntries up front, and a full cache 88 bytes per
// entry (a 648-byte bucket per 8 entries, in the 704-byte size class):
// 5.8 MB for the default 65,536 entries, whatever the keys' lengths.
//
// # Measured
//
// On a shared 2-vCPU AMD EPYC (thread CPU time, with the default size and
// instants without monotonic readings): a miss costs about 3.5 ns when the
// cache is empty and 27 ns when it is full (one maphash of the Key and one
// likely cache miss on its bucket); a hit, or a miss on a Key that has
// entries, costs 50 to 55 ns (three maphash values, the conversion of now
// and the read of the entry); Record 130 to 220 ns. Nothing allocates but
// the first Record into a bucket. See bench_test.go:
//
//	go test -run '^$' -bench . ./internal/denycache/
//
// # Time
//
// Lookup and Record take the current instant from the caller, who passes
// time.Now() or a fake clock. Instants are converted to offsets from an
// instant read when the Cache was made, with time.Time.Sub, which uses
// monotonic clock readings when both instants carry one; a caller should
// pass instants from one clock throughout. The zero time, and instants more
// than about 146 years away from when the Cache was made, are not used:
// Lookup reports a miss and Record records nothing.
package denycache

import (
	"hash/maphash"
	"math"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

const (
	// DefaultMaxEntries is Config.MaxEntries when it is zero or negative.
	DefaultMaxEntries = 65536
	// NeverTTL is how long Record keeps the denial of a charge whose cost
	// exceeds its limit (RetryAfter -1ns), unless Config.MaxTTL is shorter.
	NeverTTL = time.Second

	// ways is the number of entries in a bucket.
	ways = 8
	// maxOffset bounds the offsets of usable instants from the Cache's
	// base, so that an offset plus a duration clamped to it cannot
	// overflow: 2^62 ns, about 146 years.
	maxOffset = 1 << 62
	// readTries is how many times Lookup reads an entry that a writer is
	// changing before it reports a miss.
	readTries = 4
	// lockTries is how many times Record tries to lock a busy bucket
	// before it drops the record.
	lockTries = 4
)

// Config configures a Cache. The zero value is usable.
type Config struct {
	// MaxEntries bounds the number of entries; DefaultMaxEntries when zero
	// or negative. The capacity is the largest multiple of 8 not above
	// MaxEntries (MaxEntries itself below 8).
	MaxEntries int
	// MaxTTL, when positive, caps how long an entry lives, whatever the
	// store's RetryAfter: it bounds how long the cache can keep denying
	// after the store lost or reset a counter. Zero means no cap.
	MaxTTL time.Duration
}

// Cache remembers store denials. It is safe for concurrent use.
type Cache struct {
	buckets []atomic.Pointer[bucket]
	nb      uint64 // len(buckets)
	ways    int    // entries used per bucket, 1 to 8
	maxTTL  int64  // in ns; 0 means none
	base    time.Time

	key1, key2, name maphash.Seed

	_ [64]byte // keeps the writers' counter off the readers' line
	n atomic.Int64
	_ [56]byte
}

// New returns an empty Cache configured by cfg.
func New(cfg Config) *Cache {
	size := cfg.MaxEntries
	if size <= 0 {
		size = DefaultMaxEntries
	}
	w, nb := ways, size/ways
	if nb == 0 {
		w, nb = size, 1
	}
	c := &Cache{
		buckets: make([]atomic.Pointer[bucket], nb),
		nb:      uint64(nb),
		ways:    w,
		base:    time.Now(),
		key1:    maphash.MakeSeed(),
		key2:    maphash.MakeSeed(),
		name:    maphash.MakeSeed(),
	}
	if cfg.MaxTTL > 0 {
		c.maxTTL = int64(min(cfg.MaxTTL, maxOffset))
	}
	return c
}

// Cap returns the number of entries the Cache can hold: at most
// Config.MaxEntries.
func (c *Cache) Cap() int { return int(c.nb) * c.ways }

// Len returns the number of entries held, expired ones that were not yet
// dropped included. It is at most Cap.
func (c *Cache) Len() int { return int(c.n.Load()) }

// Lookup reports whether a request made of charges is denied by a
// remembered denial at now. If so it returns the index of the first charge
// that matches a live entry (same Key, Name, Limit.Window and
// Limit.Requests, and a Cost at least the entry's) and that entry's
// Decision aged to now; the other charges were not decided. If not it
// returns -1, the zero Decision and false, and the request must go to the
// store. A charge of negative cost never matches.
//
// Lookup allocates nothing and never waits for a lock.
func (c *Cache) Lookup(now time.Time, charges []window.Charge) (idx int, d window.Decision, ok bool) {
	if len(charges) == 0 || c.n.Load() == 0 {
		return -1, window.Decision{}, false
	}
	var (
		b           *bucket
		k1, k2      uint64
		t           int64
		hasK2, hasT bool
	)
	for i := range charges {
		ch := &charges[i]
		if i == 0 || ch.Key != charges[i-1].Key {
			k1, hasK2 = c.tag(ch.Key), false
			b = c.buckets[c.index(k1)].Load()
		}
		if b == nil || ch.Cost < 0 {
			continue
		}
		var g uint64
		hasG := false
		for j := range c.ways {
			if b.tags[j].Load() != k1 {
				continue
			}
			if !hasT {
				// Converting now costs as much as hashing the Key: only
				// when a tag matches.
				if t, hasT = c.offset(now); !hasT {
					return -1, window.Decision{}, false
				}
			}
			if !hasK2 {
				k2, hasK2 = maphash.String(c.key2, ch.Key), true
			}
			if !hasG {
				g = c.rule(ch)
				hasG = true
			}
			if d, ok := c.match(b, j, ident{k1, k2, g}, ch, t); ok {
				return i, d, true
			}
		}
	}
	return -1, window.Decision{}, false
}

// Record remembers the denials in out, the store's decisions for charges
// at now: every charge whose Decision is not Allowed and has RetryAfter >
// 0 (for Decision.RetryAfter after now), or RetryAfter < 0 (for NeverTTL).
// It can be called with any answer of the store; allowed decisions are
// skipped. charges and out must have the same length. now should be the
// instant read just before the store was asked (see the package doc).
//
// Record is best effort: a charge whose bucket stays busy for a few
// attempts in a row is not recorded, which only costs a later store call.
func (c *Cache) Record(now time.Time, charges []window.Charge, out []window.Decision) {
	t, ok := c.offset(now)
	if !ok {
		return
	}
	for i := range min(len(charges), len(out)) {
		d, ch := &out[i], &charges[i]
		if d.Allowed || d.RetryAfter == 0 || ch.Cost < 0 {
			continue
		}
		e := fact{d: *d, cost: int64(ch.Cost), at: t}
		life := int64(min(d.RetryAfter, maxOffset))
		if d.RetryAfter < 0 {
			if ch.Limit.Capacity() < 0 || int64(ch.Limit.Capacity()) == math.MaxInt64 {
				continue
			}
			e.never, e.cost, life = true, int64(ch.Limit.Capacity())+1, int64(NeverTTL)
			e.d.RetryAfter = -1
		}
		if c.maxTTL > 0 {
			life = min(life, c.maxTTL)
		}
		e.until = t + life
		c.put(ch, &e)
	}
}

// Forget drops every entry of key, whatever its Name, Window and Requests,
// so that the key's next requests go to the store: call it after the
// store's counters of key were reset. A store call that was in flight
// during the reset may still record the denial it got; call Forget after
// the reset has taken effect.
func (c *Cache) Forget(key string) {
	k1 := c.tag(key)
	b := c.buckets[c.index(k1)].Load()
	if b == nil {
		return
	}
	k2 := maphash.String(c.key2, key)
	s := b.lock()
	for j := range c.ways {
		if b.tags[j].Load() == k1 && b.ents[j].k2.Load() == k2 {
			c.clear(b, j)
		}
	}
	b.unlock(s)
}

// offset converts now to nanoseconds since c.base, reporting false for
// the zero time and instants too far away to be used safely.
func (c *Cache) offset(now time.Time) (int64, bool) {
	if now.IsZero() {
		return 0, false
	}
	d := now.Sub(c.base)
	if d <= -maxOffset || d >= maxOffset {
		return 0, false
	}
	return int64(d), true
}

// tag returns the first word of key's digest, never 0 (the empty tag).
func (c *Cache) tag(key string) uint64 {
	if h := maphash.String(c.key1, key); h != 0 {
		return h
	}
	return 1
}

// index returns the bucket of the Key whose tag is k1.
func (c *Cache) index(k1 uint64) uint64 {
	hi, _ := bits.Mul64(k1, c.nb)
	return hi
}

// rule returns the digest of ch's Name and limit: a seeded hash of the
// Name, mixed by bijections with the limit's Series (its window, and its
// algorithm, period and time zone if not the sliding window), then with
// Requests and, for a token bucket, Burst, so that two limits of one Name
// collide only through the seeded hash (or, for the token bucket, through
// the mix of Requests and Burst).
func (c *Cache) rule(ch *window.Charge) uint64 {
	w, r := ch.Limit.Series(), uint64(ch.Limit.Requests)
	h := mix64(mix64(maphash.String(c.name, ch.Name)^w) ^ r)
	if b := ch.Limit.Burst; b != 0 {
		h = mix64(h ^ uint64(b))
	}
	return h
}

// mix64 is the finalizer of SplitMix64, a bijection of uint64.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// age returns a duration of the stored Decision, v, elapsed later: reduced
// by elapsed but not below 1 ms if it was positive, as it was otherwise.
func age(v, elapsed int64) time.Duration {
	if v <= 0 {
		return time.Duration(v)
	}
	return time.Duration(max(v-elapsed, int64(time.Millisecond)))
}
