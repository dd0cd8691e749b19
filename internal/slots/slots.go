// Package slots counts the requests in flight per key for a single
// process: the in-memory side of concurrency limits.
//
// A Table holds, for each (Name, Key) with requests in flight, how many
// slots are held. It keeps a 128-bit seeded hash of (Name, Key), never the
// Key, and forgets a counter as soon as its last slot is released, so its
// memory is bounded by the number of requests in flight, whatever keys
// clients invent. In a single process no holder can die without its
// release running (the middleware releases in a deferred call), so slots
// here have no lease; Renew does nothing. The Redis store keeps a fleet's
// slots, with leases (slots.lua); docs/algorithms.md describes concurrency
// limits for users.
package slots

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

const shards = 64

// Table counts slots held per (Name, Key). The zero value is not usable;
// call New.
type Table struct {
	seed1, seed2 maphash.Seed
	shards       [shards]shard
}

type shard struct {
	mu sync.Mutex
	n  map[[2]uint64]int
	_  [40]byte // keeps shards on separate cache lines
}

// New returns an empty Table.
func New() *Table {
	t := &Table{seed1: maphash.MakeSeed(), seed2: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].n = make(map[[2]uint64]int)
	}
	return t
}

func (t *Table) id(s *window.Slot) [2]uint64 {
	var h1, h2 maphash.Hash
	h1.SetSeed(t.seed1)
	h2.SetSeed(t.seed2)
	for _, h := range []*maphash.Hash{&h1, &h2} {
		h.WriteString(s.Name)
		h.WriteByte(0)
		h.WriteString(s.Key)
	}
	return [2]uint64{h1.Sum64(), h2.Sum64()}
}

// Acquire takes one of s.Limit slots of (s.Name, s.Key), if one is free.
// It reports whether it did and how many slots are held afterwards (or, if
// none was free, how many are held).
func (t *Table) Acquire(ctx context.Context, now time.Time, s *window.Slot) (bool, int, error) {
	if err := ctx.Err(); err != nil {
		return false, 0, err
	}
	id := t.id(s)
	sh := &t.shards[id[0]%shards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := sh.n[id]
	if n >= s.Limit {
		return false, n, nil
	}
	sh.n[id] = n + 1
	return true, n + 1, nil
}

// Release gives back a slot that Acquire took. Releasing a slot that is
// not held does nothing.
func (t *Table) Release(_ context.Context, s *window.Slot) error {
	id := t.id(s)
	sh := &t.shards[id[0]%shards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	switch n := sh.n[id]; {
	case n > 1:
		sh.n[id] = n - 1
	case n == 1:
		delete(sh.n, id)
	}
	return nil
}

// Renew does nothing: slots in one process need no lease.
func (t *Table) Renew(context.Context, time.Time, []*window.Slot) error { return nil }

// Held returns how many slots of (name, key) are held.
func (t *Table) Held(name, key string) int {
	s := window.Slot{Name: name, Key: key}
	id := t.id(&s)
	sh := &t.shards[id[0]%shards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.n[id]
}

// Len returns the number of (Name, Key) with slots held.
func (t *Table) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.n)
		sh.mu.Unlock()
	}
	return n
}
