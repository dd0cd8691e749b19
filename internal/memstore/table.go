package memstore

import (
	"maps"
	"math/bits"
	"sync"

	"github.com/sluicehq/sluice/internal/window"
)

// The layout of a shard, and why each part is the size it is, is described
// in the package doc under "Layout". In short: counters are 40-byte records
// packed in chunks, found through an open-addressing index of uint32 slots.

const (
	// chunkShift sets the records per chunk: 256, so a full chunk is
	// 10,240 bytes, one of the allocator's size classes.
	chunkShift = 8
	chunkSize  = 1 << chunkShift
	chunkMask  = chunkSize - 1
	// firstChunk is the capacity of a shard's first chunk, which then
	// doubles up to chunkSize: a store with few counters stays small.
	firstChunk = 8
	// minSlots is the smallest index; it must be a power of two.
	minSlots = 8
	// maxShardKeys bounds a shard's capacity, so that a record number
	// (plus one) fits in a uint32 slot.
	maxShardKeys = 1<<32 - 1
	// samples is how many counters an eviction looks at (as Redis's
	// maxmemory-samples); a shard with at most this many counters is
	// searched exhaustively, which makes eviction exact LRU there.
	samples = 8
	// handSteps is how many counters each insertion examines for expiry.
	handSteps = 2
	// special is the first value of a record's counts field that does not
	// hold counts: the high 32 bits are all ones, which a narrow count
	// (below narrowMax) or a narrow token-bucket level (below special)
	// never has. wideCounts is one such value; the others are logs.
	special = uint64(1<<32-1) << 32
	// wideCounts marks a record whose state lives in its shard's wide map.
	wideCounts = ^uint64(0)
	// logCounts marks a sliding log: the record's state lives in the
	// shard's log table, at the slot held in the low 32 bits of counts
	// (never 1<<32 - 1, which would read as wideCounts).
	logCounts = special
	// narrowMax is the first count that makes a record wide.
	narrowMax = 1<<32 - 1
	// inSeconds is set in a life code given in whole seconds rather than
	// milliseconds.
	inSeconds = 1 << 31
	// maxAge is what sweep clamps a counter's age to, so that the 32-bit
	// access clock can wrap without making old counters look young.
	maxAge = 1 << 31
)

// ident is a counter's identity: a 128-bit seeded hash of (Name,
// Limit.Series, Key). See Store.ident.
type ident struct{ h1, h2 uint64 }

// record is one counter, 40 bytes. What start and counts hold depends on
// the algorithm of the counter, which the record does not know: the
// charges that name it do (Series, part of its identity, includes the
// algorithm).
//
//   - Sliding and fixed windows: start is State.Start, counts holds
//     State.Prev in its low and State.Curr in its high 32 bits.
//   - Token or leaky bucket counted in ticks of 1 ms (State.Prev == 1):
//     start is State.Start and counts is the level, State.Curr (below
//     special).
//   - Sliding log: counts is logCounts | slot, the slot of the log in the
//     shard's log table, start is the instant the counter expires, and
//     the low 32 bits of meta, instead of a life code, hold the offset of
//     the log in the slot's buffer.
//   - Anything else (counts of 2^32-1 or more, a bucket in coarser ticks,
//     a life beyond 68 years): counts is wideCounts and the state lives in
//     the shard's wide map.
type record struct {
	id ident
	// start is State.Start, or the expiry of a log.
	start int64
	// counts holds the counts as above, wideCounts or logCounts | slot.
	counts uint64
	// meta holds the life code (a log's offset) in its low 32 bits and
	// the access stamp in its high 32.
	meta uint64
}

func (r *record) isLog() bool { return r.counts >= special && r.counts != wideCounts }

func (r *record) access() uint32     { return uint32(r.meta >> 32) }
func (r *record) setAccess(a uint32) { r.meta = r.meta&(1<<32-1) | uint64(a)<<32 }

// wideState is the state of a record whose counts or life do not fit its
// narrow encoding.
type wideState struct {
	s     window.State
	until int64
}

// lifeCode encodes how long after start a counter expires: in
// milliseconds below 2^31 ms (24.8 days), else in seconds rounded up, which
// only keeps a counter a little longer than needed. ok is false when it
// does not fit 31 bits of seconds (68 years).
func lifeCode(life int64) (code uint32, ok bool) {
	switch {
	case life <= 0:
		return 0, true // expired when written: "expires at start" is later
	case life < inSeconds:
		return uint32(life), true
	}
	sec := (life + 999) / 1000
	if sec >= inSeconds {
		return 0, false
	}
	return inSeconds | uint32(sec), true
}

func lifeOf(code uint32) int64 {
	if code&inSeconds != 0 {
		return int64(code&^inSeconds) * 1000
	}
	return int64(code)
}

// shard is one lock's worth of counters.
//
// Records 0..n-1 are packed in chunks: record i is chunks[i>>chunkShift]
// [i&chunkMask]. Removing record i moves the last record into its place,
// so the records stay dense and the last chunks can be freed.
//
// slots is a linear-probing hash index over the records, with no
// tombstones (removal shifts the following slots back). A slot is 0 when
// empty, else tag<<idxBits | (record number + 1), where tag is the top
// 32-idxBits bits of id.h1, so that most probes that miss are told apart
// without reading the record. A record's home slot is id.h1 & (len-1).
type shard struct {
	mu      sync.Mutex
	slots   []uint32
	chunks  [][]record
	wide    map[ident]wideState // records with counts == wideCounts; nil if none
	logs    *logTable           // the logs of records that are sliding logs; nil if none
	n       int                 // records held
	cap     int                 // most records held
	hand    int                 // next record the insertions check for expiry
	rng     uint64              // state of the sampling generator
	clock   uint32              // access clock, ticks at every touch
	idxBits uint32              // bits of a slot that hold the record number
	evicted uint64              // counters evicted to make room
	_       [4]byte             // pads shard to 128 bytes, two cache lines
}

func (sh *shard) init(capacity int, seed uint64) {
	sh.cap = capacity
	sh.idxBits = uint32(bits.Len64(uint64(capacity)))
	sh.rng = seed
	sh.slots = make([]uint32, minSlots)
}

func (sh *shard) rec(i int) *record {
	return &sh.chunks[i>>chunkShift][i&chunkMask]
}

func (sh *shard) tag(h1 uint64) uint32 {
	return uint32(h1 >> (32 + sh.idxBits)) // 0 when idxBits is 32
}

func (sh *shard) slotValue(h1 uint64, i int) uint32 {
	return sh.tag(h1)<<sh.idxBits | uint32(i+1)
}

func (sh *shard) numberOf(v uint32) int {
	return int(uint64(v)&(1<<sh.idxBits-1)) - 1
}

// lookup returns the number of the record for id, or -1.
func (sh *shard) lookup(id ident) int {
	mask := uint64(len(sh.slots) - 1)
	tag := sh.tag(id.h1)
	for p := id.h1 & mask; ; p = (p + 1) & mask {
		v := sh.slots[p]
		if v == 0 {
			return -1
		}
		if v>>sh.idxBits == tag { // both 0 when idxBits is 32
			i := sh.numberOf(v)
			if sh.rec(i).id == id {
				return i
			}
		}
	}
}

// slotOf returns the position in slots of record i, whose h1 is given.
func (sh *shard) slotOf(h1 uint64, i int) uint64 {
	mask := uint64(len(sh.slots) - 1)
	for p := h1 & mask; ; p = (p + 1) & mask {
		if v := sh.slots[p]; v != 0 && sh.numberOf(v) == i {
			return p
		}
	}
}

// place adds record i, whose h1 is given, to the index.
func (sh *shard) place(h1 uint64, i int) {
	mask := uint64(len(sh.slots) - 1)
	p := h1 & mask
	for sh.slots[p] != 0 {
		p = (p + 1) & mask
	}
	sh.slots[p] = sh.slotValue(h1, i)
}

// unplace empties slot p and shifts back the slots that follow it in its
// cluster (Knuth's algorithm R), so that no tombstone is left.
func (sh *shard) unplace(p uint64) {
	mask := uint64(len(sh.slots) - 1)
	for {
		sh.slots[p] = 0
		q := p
		for {
			q = (q + 1) & mask
			v := sh.slots[q]
			if v == 0 {
				return
			}
			home := sh.rec(sh.numberOf(v)).id.h1 & mask
			// v may move to p unless its home lies cyclically in (p, q].
			if (p < q && (home <= p || home > q)) || (p > q && home <= p && home > q) {
				sh.slots[p] = v
				p = q
				break
			}
		}
	}
}

// resize rebuilds the index with size slots, a power of two.
func (sh *shard) resize(size int) {
	sh.slots = make([]uint32, size)
	for i := range sh.n {
		sh.place(sh.rec(i).id.h1, i)
	}
}

// fits reports whether the index can take n records: at most 3/4 full, so
// that probe sequences stay short and always end.
func fits(n, slots int) bool { return 4*n <= 3*slots }

// slotsFor returns the smallest index size that fits n records.
func slotsFor(n int) int {
	size := minSlots
	for !fits(n, size) {
		size <<= 1
	}
	return size
}

// touch marks record i as just used.
func (sh *shard) touch(i int) {
	sh.clock++
	sh.rec(i).setAccess(sh.clock)
}

// state returns record i's state, read as a counter of algorithm a, and
// the instant it expires at. The Log of a sliding log is the log table's
// own memory, which window.Take may append to in place: a caller that
// does not write the state back with set may still let Take use it, as
// Take writes to a log only when it charges it.
func (sh *shard) state(i int, a window.Algorithm) (window.State, int64) {
	r := sh.rec(i)
	switch {
	case r.counts < special:
		until := r.start + lifeOf(uint32(r.meta))
		if a == window.TokenBucket || a == window.LeakyBucket {
			return window.State{Start: r.start, Prev: 1, Curr: int64(r.counts)}, until
		}
		return window.State{Start: r.start, Prev: int64(r.counts & (1<<32 - 1)), Curr: int64(r.counts >> 32)}, until
	case r.counts == wideCounts:
		w := sh.wide[r.id]
		return w.s, w.until
	}
	return sh.logs.state(uint32(r.counts), uint32(r.meta)), r.start
}

// until returns the instant record i expires at.
func (sh *shard) until(i int) int64 {
	switch r := sh.rec(i); {
	case r.counts < special:
		return r.start + lifeOf(uint32(r.meta))
	case r.counts == wideCounts:
		return sh.wide[r.id].until
	default:
		return r.start // a log
	}
}

// expired reports whether record i can no longer affect a decision at now.
func (sh *shard) expired(i int, now int64) bool {
	return now >= sh.until(i)
}

// set stores s, a state of l's algorithm, and its expiry instant in
// record i. It allocates only when the record first needs the wide
// encoding, and when a log needs more room (see logTable.store).
func (sh *shard) set(i int, s *window.State, until int64, l *window.Limit) {
	r := sh.rec(i)
	var counts uint64
	var narrow bool
	switch l.Algorithm {
	case window.SlidingLog:
		sh.setLog(r, s, until, int64(l.Requests))
		return
	case window.TokenBucket, window.LeakyBucket:
		counts, narrow = uint64(s.Curr), s.Prev == 1 && uint64(s.Curr) < special
	default:
		counts, narrow = uint64(s.Prev)|uint64(s.Curr)<<32, uint64(s.Prev) < narrowMax && uint64(s.Curr) < narrowMax
	}
	code, ok := lifeCode(until - s.Start)
	narrow = narrow && ok
	if narrow && r.counts < special { // narrow before and after: the usual case
		r.start = s.Start
		r.counts = counts
		r.meta = r.meta&^(1<<32-1) | uint64(code)
		return
	}
	switch {
	case r.counts == wideCounts:
		if narrow {
			delete(sh.wide, r.id)
		}
	case r.isLog():
		sh.logs.free(uint32(r.counts)) // not a log any more: only on a collision
	}
	if narrow {
		r.start = s.Start
		r.counts = counts
		r.meta = r.meta&^(1<<32-1) | uint64(code)
		return
	}
	if sh.wide == nil {
		sh.wide = make(map[ident]wideState)
	}
	sh.wide[r.id] = wideState{s: *s, until: until}
	r.counts = wideCounts
}

// setLog stores the sliding log s in record r, which expires at until.
// requests is the limit it was last charged under, which bounds how many
// entries it may come to hold.
func (sh *shard) setLog(r *record, s *window.State, until, requests int64) {
	if !r.isLog() {
		if r.counts == wideCounts {
			delete(sh.wide, r.id) // was not a log: only on a collision
		}
		if sh.logs == nil {
			sh.logs = new(logTable)
		}
		r.counts = logCounts | uint64(sh.logs.alloc())
	}
	off := sh.logs.store(uint32(r.counts), s, requests)
	r.start = until
	r.meta = r.meta&^(1<<32-1) | uint64(off)
}

// push appends a record for id and returns its number. It does not index
// it.
func (sh *shard) push(id ident) int {
	i := sh.n
	c := i >> chunkShift
	if c == len(sh.chunks) {
		size := chunkSize
		if c == 0 {
			size = firstChunk
		}
		sh.chunks = append(sh.chunks, make([]record, 0, size))
	}
	ch := &sh.chunks[c]
	if len(*ch) == cap(*ch) { // only the first chunk starts short
		grown := make([]record, len(*ch), min(2*cap(*ch), chunkSize))
		copy(grown, *ch)
		*ch = grown
	}
	*ch = append(*ch, record{id: id})
	sh.n++
	return i
}

// remove drops record i, moving the last record into its place.
func (sh *shard) remove(i int) {
	r := sh.rec(i)
	sh.unplace(sh.slotOf(r.id.h1, i))
	switch {
	case r.counts == wideCounts:
		delete(sh.wide, r.id)
	case r.isLog():
		sh.logs.free(uint32(r.counts))
	}
	last := sh.n - 1
	if i != last {
		l := sh.rec(last)
		p := sh.slotOf(l.id.h1, last)
		sh.slots[p] = sh.slotValue(l.id.h1, i)
		*r = *l
	}
	c := last >> chunkShift
	sh.chunks[c] = sh.chunks[c][:last&chunkMask]
	sh.n--
	// Keep at most one empty chunk as a spare, so that a shard that
	// evicts and inserts at a chunk boundary does not allocate each time.
	if k := len(sh.chunks); k >= 2 && len(sh.chunks[k-2]) == 0 {
		sh.chunks[k-1] = nil
		sh.chunks = sh.chunks[:k-1]
	}
}

// insert adds a counter for id with state s of l's algorithm, which
// expires at until, and returns its number. First it checks the next
// handSteps records for expiry, dropping those expired, then, if the shard
// is still full, it evicts one. sh.mu must be held.
func (sh *shard) insert(id ident, s *window.State, until, now int64, l *window.Limit) int {
	for range handSteps {
		if sh.n == 0 {
			break
		}
		if sh.hand >= sh.n {
			sh.hand = 0
		}
		if sh.expired(sh.hand, now) {
			sh.remove(sh.hand) // the last record moves here: check it next
		} else {
			sh.hand++
		}
	}
	if sh.n >= sh.cap {
		sh.evict(now)
		sh.evicted++
	}
	if !fits(sh.n+1, len(sh.slots)) {
		sh.resize(2 * len(sh.slots))
	}
	i := sh.push(id)
	sh.set(i, s, until, l)
	sh.touch(i)
	sh.place(id.h1, i)
	return i
}

// evict drops one counter: the first expired one among a sample of
// samples records, or else the least recently used of the sample. A shard
// of at most samples records is searched whole.
func (sh *shard) evict(now int64) {
	best, bestAge := -1, uint32(0)
	consider := func(i int) bool {
		if sh.expired(i, now) {
			best = i
			return true
		}
		if age := sh.clock - sh.rec(i).access(); best < 0 || age > bestAge {
			best, bestAge = i, age
		}
		return false
	}
	if sh.n <= samples {
		for i := range sh.n {
			if consider(i) {
				break
			}
		}
	} else {
		for range samples {
			if consider(sh.random(sh.n)) {
				break
			}
		}
	}
	sh.remove(best)
}

// random returns a pseudo-random number in [0, n) (splitmix64 and
// Lemire's multiply-shift reduction).
func (sh *shard) random(n int) int {
	sh.rng += 0x9e3779b97f4a7c15
	hi, _ := bits.Mul64(mix64(sh.rng), uint64(n))
	return int(hi)
}

// compact gives back the memory a shard no longer needs: empty chunks, an
// index more than four times larger than its records need, a wide map
// that lost most of its entries and a log table that did. It runs after
// each sweep.
func (sh *shard) compact(wideBefore int) {
	switch used := (sh.n + chunkMask) >> chunkShift; {
	case used == 0:
		sh.chunks = nil
	case cap(sh.chunks) > 2*used+4:
		sh.chunks = append([][]record(nil), sh.chunks[:used]...)
	case used < len(sh.chunks):
		clear(sh.chunks[used:])
		sh.chunks = sh.chunks[:used]
	}
	if size := slotsFor(sh.n); size <= len(sh.slots)/4 {
		sh.resize(size)
	}
	switch {
	case len(sh.wide) == 0:
		sh.wide = nil
	case len(sh.wide) < wideBefore/2:
		sh.wide = maps.Clone(sh.wide) // a map never shrinks; a copy is sized to fit
	}
	if t := sh.logs; t != nil {
		switch live := len(t.slots) - len(t.unused); {
		case live == 0:
			sh.logs = nil
		case len(t.slots) > 2*live+16:
			sh.renumberLogs(live)
		}
	}
}
