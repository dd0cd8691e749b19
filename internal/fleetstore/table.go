package fleetstore

import (
	"sync"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/window"
)

// ident is a counter's identity in process: a 128-bit seeded hash of its
// Key, Name and Limit.Series, as in the memory store. The counter's name
// in the shared store (fleet.ID) is computed once, when it enters the
// table.
type ident struct{ h1, h2 uint64 }

// chunkSize is the number of entries per chunk of a shard: entries never
// move when a shard grows, and a shard costs no more than its entries.
const chunkSize = 256

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
)

// entry is one counter in process, 96 bytes. Its fields hold, by mode:
//
//   - write-back: C is fleet.View.C; us, up and uc are U's Start, Prev and
//     Curr; inflight is what pushes on their way carry.
//   - lease: C is the counter as the last lease call returned it; uc is
//     the units of the slice left, up the instant (Unix ms, local clock)
//     the slice ends and us the start of the window it was counted in;
//     inflight is the size to ask for next (see nextWant).
type entry struct {
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
	return fleet.View{C: window.State{Start: e.cs, Prev: e.cp, Curr: e.cc}, U: window.State{Start: e.us, Prev: e.up, Curr: e.uc}}
}

// setView stores v in the entry.
func (e *entry) setView(v *fleet.View) {
	e.cs, e.cp, e.cc = v.C.Start, v.C.Prev, v.C.Curr
	e.us, e.up, e.uc = v.U.Start, v.U.Prev, v.U.Curr
}

// state returns C.
func (e *entry) state() window.State { return window.State{Start: e.cs, Prev: e.cp, Curr: e.cc} }

// setState stores C.
func (e *entry) setState(s window.State) { e.cs, e.cp, e.cc = s.Start, s.Prev, s.Curr }

// shard is a part of the table, with its own lock.
type shard struct {
	mu     sync.Mutex
	index  map[ident]uint32 // entry numbers
	chunks [][]entry
	ids    []ident // ids[i] is the identity of entry i
	n      int
	max    int
	// list holds the entries the syncer visits.
	list []ident
	// waits holds, for entries with a lease call on its way, what the
	// requests that need it wait on.
	waits map[ident]chan struct{}
	// seq draws the entries an eviction samples.
	seq uint64
}

func (sh *shard) at(i int) *entry { return &sh.chunks[i/chunkSize][i%chunkSize] }

// lookup returns the entry of id, or nil.
func (sh *shard) lookup(id ident) (*entry, int) {
	i, ok := sh.index[id]
	if !ok {
		return nil, -1
	}
	return sh.at(int(i)), int(i)
}

// insert adds a zero entry for id and returns it, evicting first if the
// shard is full: evicted is the entry that made room (copied), if any.
func (sh *shard) insert(id ident) (e *entry, evicted entry, did bool) {
	if sh.n >= sh.max {
		evicted, did = sh.evict(), true
	}
	if sh.index == nil {
		sh.index = map[ident]uint32{}
	}
	i := sh.n
	if i/chunkSize == len(sh.chunks) {
		sh.chunks = append(sh.chunks, make([]entry, chunkSize))
	}
	sh.n++
	sh.index[id] = uint32(i)
	if i == len(sh.ids) {
		sh.ids = append(sh.ids, id)
	} else {
		sh.ids[i] = id
	}
	e = sh.at(i)
	*e = entry{}
	return e, evicted, did
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
	id := sh.ids[i]
	delete(sh.index, id)
	last := sh.n - 1
	if i != last {
		*sh.at(i) = *sh.at(last)
		sh.ids[i] = sh.ids[last]
		sh.index[sh.ids[i]] = uint32(i)
	}
	*sh.at(last) = entry{}
	sh.n--
}

// list adds entry e of id to the entries the syncer visits.
func (sh *shard) enlist(id ident, e *entry) {
	if e.flags&listed == 0 {
		e.flags |= listed
		sh.list = append(sh.list, id)
	}
}
