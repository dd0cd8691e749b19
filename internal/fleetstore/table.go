package fleetstore

import (
	"math/bits"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/window"
)

// ident is a counter's identity in process: a 128-bit seeded hash of its
// Key, Name and Limit.Series, as in the memory store. The counter's name
// in the shared store (fleet.ID) is computed once, when it enters the
// table.
type ident struct{ h1, h2 uint64 }

// entrySize is the size of an entry in bytes.
const entrySize = int(unsafe.Sizeof(entry{}))

// chunkSize is the number of entries of a full chunk of a shard: entries
// never move when a shard grows, and a shard costs little more than its
// entries. A chunk takes a power of two of bytes (32 KiB when full), which
// the allocator gives without rounding up, and holds as many entries as
// fit: 256 entries of 112 bytes would take a 32 KiB block all the same,
// 16 bytes more per entry.
const chunkSize = 32 << 10 / entrySize

// grown returns the capacity of a chunk after one of n entries: the
// entries that twice its bytes, rounded up to a power of two, hold, up to
// chunkSize; 1 KiB's worth for a new chunk (n = 0).
func grown(n int) int {
	b := 1 << 10
	for b/entrySize <= n {
		b *= 2
	}
	return min(b/entrySize, chunkSize)
}

// Entry flags.
const (
	// listed: the entry is in its shard's list of entries the syncer
	// visits (unsynced counts, a lease, or a recent use).
	listed = 1 << iota
	// granting: a lease call for the entry is on its way, or, in
	// write-back mode, a push that requests wait for.
	granting
	// full: the last lease call granted nothing; until up, requests that
	// the slice left does not cover are denied without asking again.
	full
	// later: a listed write-back entry whose counts wait (see pushDue) is
	// in its shard's later list, which the syncer visits every laterEvery
	// ticks, rather than in its list.
	later
	// seen: the syncer kept the entry in its later list in the visit
	// under way.
	seen
)

// entry is one counter in process, 112 bytes. Its fields hold, by mode:
//
//   - write-back: C is fleet.View.C; up and uc are U's Prev and Curr (U is
//     in C's windows: its Start is C's); us holds the fleet.Blind of the
//     counter; inflight is what pushes on their way carry.
//   - lease: C is the counter as the last lease call returned it; uc is
//     the units of the slice left, up the instant (Unix ms, local clock)
//     the slice ends and us the start of the window it was counted in;
//     inflight is the size to ask for next (see nextWant).
type entry struct {
	id       ident
	fid      fleet.ID
	flags    uint8
	b        *binding
	cs, cp   int64
	cc       int64
	us, up   int64
	uc       int64
	inflight int64
	// used is the instant of the entry's last decision, and synced that
	// of its last answer from the shared store (Unix ms, local clock).
	used, synced int64
}

// view returns the entry's write-back view.
func (e *entry) view() fleet.View {
	return fleet.View{C: window.State{Start: e.cs, Prev: e.cp, Curr: e.cc}, U: window.State{Start: e.cs, Prev: e.up, Curr: e.uc}}
}

// setView stores v in the entry. fleet.View keeps U in C's windows, so
// U.Start is C.Start, which the entry keeps once.
func (e *entry) setView(v *fleet.View) {
	e.cs, e.cp, e.cc = v.C.Start, v.C.Prev, v.C.Curr
	e.up, e.uc = v.U.Prev, v.U.Curr
}

// blind returns a write-back entry's fleet.Blind.
func (e *entry) blind() fleet.Blind { return fleet.Blind(e.us) }

// setBlind stores a write-back entry's fleet.Blind.
func (e *entry) setBlind(b fleet.Blind) { e.us = int64(b) }

// state returns C.
func (e *entry) state() window.State { return window.State{Start: e.cs, Prev: e.cp, Curr: e.cc} }

// setState stores C.
func (e *entry) setState(s window.State) { e.cs, e.cp, e.cc = s.Start, s.Prev, s.Curr }

// shard is a part of the table, with its own lock: entries in chunks,
// found through an open-addressing index of uint32 slots (linear probing,
// at most seven eighths full), as in the memory store.
type shard struct {
	mu     sync.Mutex
	slots  []uint32 // 0: empty; else an entry number + 1
	chunks [][]entry
	n      int
	max    int
	// list holds the entries the syncer visits at every tick, and later
	// those it visits every laterEvery ticks (flag later): an id may stay
	// in later after its entry left it, and is dropped when visited.
	list, later []ident
	// waits holds, for entries with a lease call or a push on its way,
	// what the requests that need it wait on.
	waits map[ident]chan struct{}
	// seq draws the entries an eviction samples.
	seq uint64
	// evicted is the instant (Unix ms) of the shard's last eviction.
	evicted int64
}

func (sh *shard) at(i int) *entry { return &sh.chunks[i/chunkSize][i%chunkSize] }

// A slot holds the number of its entry plus one in its low bits, as many
// as the shard's capacity needs (idxBits), and in the others a tag of the
// entry's identity, so that find reads only the entries whose tags match:
// at seven eighths full, linear probing passes a few slots before it finds
// an entry, and reading each of their entries would cost a cache miss.

// idxBits is how many low bits of a slot hold its entry's number.
func (sh *shard) idxBits() uint { return uint(bits.Len(uint(sh.max))) }

// slotOf returns the slot value of entry number i, of identity id.
func (sh *shard) slotOf(i int, id ident) uint32 {
	return uint32(i+1) | uint32(id.h1>>32)<<sh.idxBits()
}

// entryOf returns the number of the entry of slot value v (not 0).
func (sh *shard) entryOf(v uint32) int { return int(v&(uint32(1)<<sh.idxBits()-1)) - 1 }

// find returns the slot of id, or of the empty slot where it would go.
func (sh *shard) find(id ident) int {
	mask := len(sh.slots) - 1
	b := sh.idxBits()
	tag := uint32(id.h1>>32) << b >> b
	for p := int(id.h1) & mask; ; p = (p + 1) & mask {
		v := sh.slots[p]
		if v == 0 || v>>b == tag && sh.at(sh.entryOf(v)).id == id {
			return p
		}
	}
}

// lookup returns the entry of id, or nil.
func (sh *shard) lookup(id ident) (*entry, int) {
	if sh.n == 0 {
		return nil, -1
	}
	v := sh.slots[sh.find(id)]
	if v == 0 {
		return nil, -1
	}
	i := sh.entryOf(v)
	return sh.at(i), i
}

// insert adds a zero entry for id, which must not be in the shard, and
// returns it, evicting first if the shard is full: evicted is the entry
// that made room (copied), if any.
func (sh *shard) insert(id ident) (e *entry, evicted entry, did bool) {
	if sh.n >= sh.max {
		evicted, did = sh.evict(), true
	}
	if 8*(sh.n+1) > 7*len(sh.slots) {
		sh.grow()
	}
	i := sh.n
	if i/chunkSize == len(sh.chunks) {
		// Chunks start small and double up to chunkSize, so that a shard
		// wastes at most about half of its last chunk.
		sh.chunks = append(sh.chunks, make([]entry, grown(0)))
	} else if c := &sh.chunks[i/chunkSize]; i%chunkSize == len(*c) {
		// Grown by copying: no pointer into a shard's entries outlives
		// its lock.
		n := grown(len(*c))
		*c = append(make([]entry, 0, n), *c...)[:n]
	}
	sh.n++
	e = sh.at(i)
	*e = entry{id: id}
	sh.slots[sh.find(id)] = sh.slotOf(i, id)
	return e, evicted, did
}

// grow doubles the index and places every entry again.
func (sh *shard) grow() {
	sh.slots = make([]uint32, max(2*len(sh.slots), 16))
	for i := 0; i < sh.n; i++ {
		id := sh.at(i).id
		sh.slots[sh.find(id)] = sh.slotOf(i, id)
	}
}

// evict removes the least recently used of a few entries drawn at random
// and returns a copy of it.
func (sh *shard) evict() entry {
	best := -1
	for k := 0; k < 8 && k < sh.n; k++ {
		sh.seq = sh.seq*6364136223846793005 + 1442695040888963407
		i := int((sh.seq >> 33) % uint64(sh.n))
		if best < 0 || sh.at(i).used < sh.at(best).used {
			best = i
		}
	}
	old := *sh.at(best)
	sh.remove(best)
	return old
}

// remove deletes entry i, moving the last entry into its place.
func (sh *shard) remove(i int) {
	sh.unplace(sh.find(sh.at(i).id))
	last := sh.n - 1
	if i != last {
		*sh.at(i) = *sh.at(last)
		id := sh.at(i).id
		sh.slots[sh.find(id)] = sh.slotOf(i, id)
	}
	*sh.at(last) = entry{}
	sh.n--
}

// unplace empties slot p and shifts back the entries after it that
// linear probing placed past it, so that every entry stays reachable.
func (sh *shard) unplace(p int) {
	mask := len(sh.slots) - 1
	sh.slots[p] = 0
	for q := (p + 1) & mask; sh.slots[q] != 0; q = (q + 1) & mask {
		home := int(sh.at(sh.entryOf(sh.slots[q])).id.h1) & mask
		// The entry at q may move to p unless its home lies cyclically in
		// (p, q].
		if (q > p && (home <= p || home > q)) || (q < p && home <= p && home > q) {
			sh.slots[p], sh.slots[q] = sh.slots[q], 0
			p = q
		}
	}
}

// enlist adds entry e of id to the entries the syncer visits at every
// tick, and takes it out of its later list if it was there.
func (sh *shard) enlist(id ident, e *entry) {
	if e.flags&listed == 0 || e.flags&later != 0 {
		e.flags = e.flags&^later | listed
		sh.list = append(sh.list, id)
	}
}

// postpone moves listed entry e of id to the syncer's later list; the
// caller drops id from the list.
func (sh *shard) postpone(id ident, e *entry) {
	e.flags |= later
	sh.later = append(sh.later, id)
}

// uses remembers when lease counters were last used, in a fixed array of
// slots indexed by a hash of their identity, each holding a tag of the
// identity and the instant (Unix ms, 40 bits): a counter whose slot has
// its tag knows its last use without a lookup in the table; one whose slot
// another counter took is unknown. Made on first use.
type uses struct {
	once  sync.Once
	slots []atomic.Uint64
}

const (
	usesSlots = 1 << 16
	usesBits  = 40
	usesMask  = 1<<usesBits - 1
)

// The state of a counter's last use (uses.note).
const (
	useUnknown = iota
	useRecent
	useStale
)

// note records that counter id is used at ms, and returns whether its
// previous use was within within ms (useRecent), before it (useStale), or
// is unknown. A use within a quarter of within after the one recorded is
// not recorded.
func (u *uses) note(id ident, ms, within int64) int {
	u.once.Do(func() { u.slots = make([]atomic.Uint64, usesSlots) })
	slot := &u.slots[id.h2>>32%usesSlots]
	tag := id.h1 >> usesBits
	old := slot.Load()
	if old>>usesBits == tag && (uint64(ms)-old)&usesMask <= uint64(within/4) {
		// Used a moment ago: the slot is left as it is, so that the
		// decisions of a hot counter only read it (a write would move
		// its cache line between processors at each one).
		return useRecent
	}
	old = slot.Swap(tag<<usesBits | uint64(ms)&usesMask)
	switch {
	case old == 0 || old>>usesBits != tag:
		return useUnknown
	case (uint64(ms)-old)&usesMask <= uint64(within):
		return useRecent
	}
	return useStale
}
