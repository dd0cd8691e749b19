package memstore

import (
	"slices"

	"github.com/sluicehq/sluice/internal/window"
)

// The sliding logs of a shard. A record that is a sliding log holds, in
// its counts field, the number of a slot of its shard's log table; the
// slot holds the log's entries, in a buffer of its own, and their sum.
//
// window.Take works on the buffer itself, without a copy: rolling the log
// drops entries from its front by reslicing, and charging it merges into
// its last entry or appends one, in place when the buffer has room. Take
// writes nothing to a log unless it charges it, so a denied request or a
// read leaves the stored log as it was, even when Take rolled its copy of
// the slice. When Take has charged a log, store finds where the rolled log
// now lies, and keeps the buffer to the log's measure:
//
//   - Growing: a log that fills its buffer from the front is left so. The
//     next charge, if one comes, appends through Go's append, which moves
//     the log to a buffer twice as large (1.25 times beyond 256 entries);
//     store then cuts that down to the limit's Requests plus a 64th and
//     one, if it is larger. A client that sent one request costs one
//     entry.
//   - Steady: a log with room after its end is appended to in place. When
//     its end reaches the end of the buffer after entries left its front,
//     it moves back to the front if at least a 64th of its n entries
//     left (each move of n entries follows n/64 that left: at most 64
//     entries moved per entry dropped, a kilobyte), or else to a buffer
//     of Requests plus a 64th and one. A log never holds more entries than
//     its limit admits, as entries merge per millisecond and each costs at
//     least 1, so a log at its limit settles in its buffer.
//   - Shrinking: a buffer more than four times (plus 16 entries) larger
//     than its log is replaced by one that fits, so a log that shrank
//     gives its memory back at its next charge. A log nobody charges
//     expires one window after its newest entry, and is dropped whole.
//
// Buffers are sized to the allocator's size classes (slices.Grow), so that
// the rounding is room the log may use.

// logSlot is one sliding log: its entries, buf[off:] where off is kept in
// the low 32 bits of the record's meta, and their sum. buf's capacity is
// the whole buffer, the room left after the log included. A free slot has
// a nil buf.
type logSlot struct {
	buf  []window.Entry
	curr int64
}

// logTable holds the logs of one shard.
type logTable struct {
	slots  []logSlot
	unused []uint32 // the free slots, in no order
}

// alloc returns a free slot.
func (t *logTable) alloc() uint32 {
	if k := len(t.unused); k > 0 {
		s := t.unused[k-1]
		t.unused = t.unused[:k-1]
		return s
	}
	t.slots = append(t.slots, logSlot{})
	return uint32(len(t.slots) - 1)
}

// free releases slot s and its buffer.
func (t *logTable) free(s uint32) {
	t.slots[s] = logSlot{}
	t.unused = append(t.unused, s)
}

// state returns the log of slot s, at offset off in its buffer, as a
// State; its Log is the slot's buffer, with the room left after it.
func (t *logTable) state(s, off uint32) window.State {
	sl := &t.slots[s]
	return window.State{Curr: sl.curr, Log: sl.buf[off:]}
}

// store keeps st, a sliding log charged by window.Take, in slot s, and
// returns its offset in the slot's buffer. st.Log is the slot's buffer,
// rolled and charged in place, or a new array Take allocated for it;
// requests is the limit that charged it last.
func (t *logTable) store(s uint32, st *window.State, requests int64) uint32 {
	sl := &t.slots[s]
	log := st.Log
	n := len(log)
	buf := sl.buf[:cap(sl.buf)]
	off := 0
	if k := len(buf) - cap(log); n > 0 && k >= 0 && k < len(buf) && &buf[k] == &log[0] {
		off = k
	} else {
		buf = log[:cap(log)] // new, or grown by Take
		if most := logRoom(n, requests); len(buf) > most+most/8 {
			buf = resized(log, most) // more than append's growth should give
		}
	}
	switch c := len(buf); {
	case c > 4*n+16:
		buf, off = resized(log, logRoom(n, int64(n))), 0
	case off+n < c || off == 0:
		// Room for the next entry; or none, with the log at the front
		// already: the next charge grows the buffer, if there is one.
	case off >= n/64:
		copy(buf, log)
		off = 0
	default:
		buf, off = resized(log, logRoom(n, requests)), 0
	}
	sl.buf, sl.curr = buf[:off+n], st.Curr
	return uint32(off)
}

// resized returns a new buffer of at least size entries, rounded up to
// the allocator's size class, that starts with a copy of log.
func resized(log []window.Entry, size int) []window.Entry {
	buf := slices.Grow([]window.Entry(nil), size)
	buf = buf[:cap(buf)]
	copy(buf, log)
	return buf
}

// logRoom is the size of the buffer for a log of n entries that may grow
// to requests: requests (or n, if it holds more) plus a 64th and one, the
// room that keeps moving the entries to the front cheap.
func logRoom(n int, requests int64) int {
	most := int64(n)
	if requests > most {
		most = min(requests, 1<<31)
	}
	return int(most + most/64 + 1)
}

// renumberLogs rebuilds the log table of a shard that holds live logs in
// far more slots, renumbering its log records, so that the slots of logs
// long dropped are given back.
func (sh *shard) renumberLogs(live int) {
	old := sh.logs
	t := &logTable{slots: make([]logSlot, 0, live)}
	for i := range sh.n {
		if r := sh.rec(i); r.isLog() {
			t.slots = append(t.slots, old.slots[uint32(r.counts)])
			r.counts = logCounts | uint64(len(t.slots)-1)
		}
	}
	sh.logs = t
}
