package denycache

import (
	"hash/maphash"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// The layout and the locking are described in the package doc under
// "Concurrency and memory layout".

// ident is an entry's identity: the two words of the Key's digest and the
// rule's (Name, Window, Requests).
type ident struct{ k1, k2, g uint64 }

// fact is what Record keeps about one denied charge.
type fact struct {
	d         window.Decision
	cost      int64 // the least cost denied
	at, until int64 // offsets of the recording and of the expiry
	never     bool  // the charge's cost exceeds its limit
}

// bucket holds up to 8 entries, guarded by a sequence lock: seq is odd
// while a writer changes the bucket.
type bucket struct {
	seq  atomic.Uint64
	tags [ways]atomic.Uint64 // ident.k1 of each entry; 0 when empty
	ents [ways]entry
}

// entry is one remembered denial, 72 bytes; its tag is in its bucket's
// tags.
type entry struct {
	k2, g     atomic.Uint64
	cost      atomic.Int64
	at, until atomic.Int64
	remaining atomic.Int64
	reset     atomic.Int64
	retry     atomic.Int64
	next      atomic.Int64
}

// tryLock locks b if no writer holds it, returning the odd sequence
// number to pass to unlock.
func (b *bucket) tryLock() (uint64, bool) {
	s := b.seq.Load()
	if s&1 == 0 && b.seq.CompareAndSwap(s, s+1) {
		return s + 1, true
	}
	return 0, false
}

// lock locks b, waiting for the writer that holds it.
func (b *bucket) lock() uint64 {
	for {
		if s, ok := b.tryLock(); ok {
			return s
		}
		runtime.Gosched()
	}
}

func (b *bucket) unlock(s uint64) { b.seq.Store(s + 1) }

// match reads entry j of b and returns its Decision aged to t if it is a
// live entry of id that denies ch. b need not be locked.
func (c *Cache) match(b *bucket, j int, id ident, ch *window.Charge, t int64) (window.Decision, bool) {
	e := &b.ents[j]
	for range readTries {
		s := b.seq.Load()
		if s&1 != 0 {
			continue
		}
		k1, k2, g := b.tags[j].Load(), e.k2.Load(), e.g.Load()
		cost, at, until := e.cost.Load(), e.at.Load(), e.until.Load()
		rem, reset, retry, next := e.remaining.Load(), e.reset.Load(), e.retry.Load(), e.next.Load()
		if b.seq.Load() != s {
			continue
		}
		if (ident{k1, k2, g}) != id {
			return window.Decision{}, false
		}
		if t >= until {
			c.dropExpired(b, j, id, t)
			return window.Decision{}, false
		}
		never := int64(ch.Cost) > int64(ch.Limit.Capacity())
		if int64(ch.Cost) < cost && !never {
			return window.Decision{}, false
		}
		elapsed := max(t-at, 0)
		d := window.Decision{
			Remaining:  int(rem),
			ResetAfter: age(reset, elapsed),
			RetryAfter: age(retry, elapsed),
			NextAfter:  age(next, elapsed),
		}
		if never {
			d.RetryAfter = -1
		}
		return d, true
	}
	return window.Decision{}, false
}

// dropExpired drops entry j of b if it still is an entry of id that has
// expired at t, unless a writer holds b.
func (c *Cache) dropExpired(b *bucket, j int, id ident, t int64) {
	s, ok := b.tryLock()
	if !ok {
		return
	}
	if c.idOf(b, j) == id && b.ents[j].until.Load() <= t {
		c.clear(b, j)
	}
	b.unlock(s)
}

// idOf returns the identity of entry j of b, which must be locked.
func (c *Cache) idOf(b *bucket, j int) ident {
	e := &b.ents[j]
	return ident{b.tags[j].Load(), e.k2.Load(), e.g.Load()}
}

// clear empties entry j of b, which must be locked and hold an entry.
func (c *Cache) clear(b *bucket, j int) {
	b.tags[j].Store(0)
	e := &b.ents[j]
	e.k2.Store(0)
	e.g.Store(0)
	c.n.Add(-1)
}

// bucketOf returns the bucket of the Key whose tag is k1, allocating it on
// first use.
func (c *Cache) bucketOf(k1 uint64) *bucket {
	p := &c.buckets[c.index(k1)]
	if b := p.Load(); b != nil {
		return b
	}
	b := new(bucket)
	if p.CompareAndSwap(nil, b) {
		return b
	}
	return p.Load()
}

// put records f for ch's counter.
func (c *Cache) put(ch *window.Charge, f *fact) {
	k1 := c.tag(ch.Key)
	id := ident{k1, maphash.String(c.key2, ch.Key), c.rule(ch)}
	b := c.bucketOf(k1)
	var s uint64
	for try := 0; ; try++ {
		var ok bool
		if s, ok = b.tryLock(); ok {
			break
		}
		if try == lockTries-1 {
			return
		}
		runtime.Gosched()
	}
	defer b.unlock(s)

	free, same, victim := -1, -1, -1
	var victimUntil int64
	for j := range c.ways {
		if b.tags[j].Load() == 0 {
			if free < 0 {
				free = j
			}
			continue
		}
		until := b.ents[j].until.Load()
		if until <= f.at {
			c.clear(b, j)
			if free < 0 {
				free = j
			}
			continue
		}
		if c.idOf(b, j) == id {
			same = j
		}
		if victim < 0 || until < victimUntil {
			victim, victimUntil = j, until
		}
	}
	switch {
	case same >= 0:
		e := &b.ents[same]
		if f.never || e.cost.Load() <= f.cost && e.until.Load() >= f.until {
			return // the live entry denies at least as much
		}
		c.write(b, same, id, f)
	case free >= 0:
		c.write(b, free, id, f)
		c.n.Add(1)
	default:
		c.write(b, victim, id, f)
	}
}

// write stores f with identity id as entry j of b, which must be locked.
func (c *Cache) write(b *bucket, j int, id ident, f *fact) {
	e := &b.ents[j]
	e.k2.Store(id.k2)
	e.g.Store(id.g)
	e.cost.Store(f.cost)
	e.at.Store(f.at)
	e.until.Store(f.until)
	e.remaining.Store(int64(f.d.Remaining))
	e.reset.Store(clamp(f.d.ResetAfter))
	e.retry.Store(clamp(f.d.RetryAfter))
	e.next.Store(clamp(f.d.NextAfter))
	b.tags[j].Store(id.k1)
}

// clamp bounds a stored duration so that ageing it cannot overflow.
func clamp(d time.Duration) int64 {
	return int64(min(max(d, -maxOffset), maxOffset))
}
