// Package clients holds what a Limiter knows about single clients beyond
// their counters: the bans in force (Bans), the pauses an upstream asked
// the outbound transport for (a second Bans table: a pause is kept as a
// ban is, until an instant), and the per-client overrides of a rule's
// limits (Overrides), each a bounded table keyed by rule and key, safe for
// concurrent use and cheap to consult on every decision (an atomic length
// read first, so that a limiter with none takes no lock). EncodeLimits and
// DecodeLimits write an override's limits as the Redis store keeps them
// for the fleet.
//
// Package middleware keeps the public face (Limiter.Ban, LiftBan,
// SetOverride, Pause, ...), decides what is banned, paused or overridden,
// and shares all three with the fleet through a shared store; the tables
// know nothing of rules' limits, stores or requests. Bans and overrides are
// described in docs/logins.md, pauses in docs/outbound.md.
package clients

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// ID names a client under a rule: the rule's name and the key its key
// function produced.
type ID struct{ Rule, Key string }

// compare orders IDs by rule, then key.
func compare(a, b ID) int {
	if c := cmp.Compare(a.Rule, b.Rule); c != 0 {
		return c
	}
	return cmp.Compare(a.Key, b.Key)
}

// Bans holds bans in memory, at most Max: the bans themselves with the
// memory store, and the bans this process has seen with a shared store, so
// that a banned client's requests do not reach the store again. Instants
// are Unix milliseconds. The zero Bans holds none; set Max before use.
type Bans struct {
	// Max bounds the bans held; beyond it, a new ban pushes out another,
	// an expired one if one of a few is.
	Max int

	mu sync.RWMutex
	n  atomic.Int64 // len(m), read without the lock
	m  map[ID]int64
}

// Ban is a ban in force: ID is refused until Until (Unix ms).
type Ban struct {
	ID
	Until int64
}

// Until returns when the ban of id ends, if one is in force at now.
func (t *Bans) Until(id ID, now int64) (int64, bool) {
	if t.n.Load() == 0 {
		return 0, false
	}
	t.mu.RLock()
	u, ok := t.m[id]
	t.mu.RUnlock()
	return u, ok && u > now
}

// Set records a ban of id ending at until, unless one that ends later is
// there, and returns when the ban ends.
func (t *Bans) Set(id ID, until, now int64) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[ID]int64{}
	}
	if u, ok := t.m[id]; ok && u >= until {
		return u
	}
	if _, ok := t.m[id]; !ok && len(t.m) >= t.Max {
		// Full: drop an expired ban if one of a few is, else any.
		var victim ID
		seen := 0
		for k, u := range t.m {
			victim = k
			if u <= now || seen == 8 {
				break
			}
			seen++
		}
		delete(t.m, victim)
	}
	t.m[id] = until
	t.n.Store(int64(len(t.m)))
	return until
}

// Lift drops the ban of id and reports whether one was in force at now.
func (t *Bans) Lift(id ID, now int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	u, ok := t.m[id]
	delete(t.m, id)
	t.n.Store(int64(len(t.m)))
	return ok && u > now
}

// List returns the bans in force at now, soonest to end first, dropping
// those that ended.
func (t *Bans) List(now int64) []Ban {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []Ban
	for id, u := range t.m {
		if u <= now {
			delete(t.m, id)
			continue
		}
		out = append(out, Ban{ID: id, Until: u})
	}
	t.n.Store(int64(len(t.m)))
	slices.SortFunc(out, func(a, b Ban) int {
		if c := cmp.Compare(a.Until, b.Until); c != 0 {
			return c
		}
		return compare(a.ID, b.ID)
	})
	return out
}

// Clear drops every ban and returns the keys they were on.
func (t *Bans) Clear() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.m))
	for id := range t.m {
		keys = append(keys, id.Key)
	}
	clear(t.m)
	t.n.Store(0)
	return keys
}

// Entry is one override in a table: V, which the caller defines (the
// override as set, and what it compiles to), in force until Until (the
// zero time: until removed).
type Entry[V any] struct {
	ID    ID
	Until time.Time
	V     V
}

// Live reports whether e is in force at now.
func (e *Entry[V]) Live(now time.Time) bool { return e.Until.IsZero() || now.Before(e.Until) }

// Overrides holds the overrides in force, by rule and key. The zero
// Overrides is empty and ready to use.
type Overrides[V any] struct {
	mu sync.RWMutex
	n  atomic.Int64 // len(m), read without the lock
	m  map[ID]*Entry[V]
	// OnEmpty, if set (before the table is used), is called when the
	// table becomes empty (true) or stops being empty (false), with the
	// table's lock held: it must not use the table.
	OnEmpty func(empty bool)
}

// setLen records that the table holds n entries; t.mu is held for
// writing.
func (t *Overrides[V]) setLen(n int) {
	was := t.n.Swap(int64(n))
	if (was == 0) != (n == 0) && t.OnEmpty != nil {
		t.OnEmpty(n == 0)
	}
}

// Len is how many overrides the table holds, ended ones included until
// they are dropped; it takes no lock.
func (t *Overrides[V]) Len() int { return int(t.n.Load()) }

// Get returns the entry of id, nil if there is none; whether it is still
// in force is for the caller to ask (Entry.Live).
func (t *Overrides[V]) Get(id ID) *Entry[V] {
	if t.n.Load() == 0 {
		return nil
	}
	t.mu.RLock()
	e := t.m[id]
	t.mu.RUnlock()
	return e
}

// Put adds or replaces e, unless the table holds max overrides in force
// at now already and e is new: Put then reports false, and changes
// nothing.
func (t *Overrides[V]) Put(e *Entry[V], now time.Time, max int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.m[e.ID]; !ok && len(t.m) >= max {
		t.dropEndedLocked(now)
		if len(t.m) >= max {
			return false
		}
	}
	if t.m == nil {
		t.m = map[ID]*Entry[V]{}
	}
	t.m[e.ID] = e
	t.setLen(len(t.m))
	return true
}

// dropEndedLocked drops the overrides that ended before now; t.mu is held.
func (t *Overrides[V]) dropEndedLocked(now time.Time) {
	for id, e := range t.m {
		if !e.Live(now) {
			delete(t.m, id)
		}
	}
	t.setLen(len(t.m))
}

// Remove removes the override of id and reports whether there was one.
func (t *Overrides[V]) Remove(id ID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, was := t.m[id]
	delete(t.m, id)
	t.setLen(len(t.m))
	return was
}

// List returns the overrides in force at now, by rule and key.
func (t *Overrides[V]) List(now time.Time) []*Entry[V] {
	t.mu.RLock()
	out := make([]*Entry[V], 0, len(t.m))
	for _, e := range t.m {
		if e.Live(now) {
			out = append(out, e)
		}
	}
	t.mu.RUnlock()
	slices.SortFunc(out, func(a, b *Entry[V]) int { return compare(a.ID, b.ID) })
	return out
}

// Replace replaces the whole table with entries (a reload from a shared
// store), unless keep says no once the table's lock is held: then it
// changes nothing and reports false.
func (t *Overrides[V]) Replace(entries []*Entry[V], keep func() bool) bool {
	m := make(map[ID]*Entry[V], len(entries))
	for _, e := range entries {
		m[e.ID] = e
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if keep != nil && !keep() {
		return false
	}
	t.m = m
	t.setLen(len(m))
	return true
}
