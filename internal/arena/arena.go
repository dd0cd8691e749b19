// Package arena hands out short strings and one-element string slices
// carved from shared chunks, so that a hot path that must produce a few
// short strings per request (a rate-limit key, header values) makes one
// allocation per many requests instead of one per string.
//
// Memory is never reused: a chunk is garbage once nothing refers to any
// string or slice carved from it, so what an Arena returns is an ordinary,
// immutable Go string or an ordinary slice that no one else writes to. The
// cost is that one string kept for long keeps its whole chunk (at most
// ChunkBytes) alive.
package arena

import (
	"sync"
	"unsafe"
)

const (
	// ChunkBytes is the size of the chunks strings are carved from.
	ChunkBytes = 4096
	// maxCarved is the longest string carved from a chunk; longer ones are
	// allocated on their own.
	maxCarved = 256
	// chunkSlots is how many one-element slices a slot chunk holds.
	chunkSlots = 128
)

// Arena carves strings and slices from its current chunks. It is not safe
// for concurrent use; Get and Put share Arenas between goroutines.
type Arena struct {
	buf   []byte
	slots []string
}

var pool = sync.Pool{New: func() any { return new(Arena) }}

// Holder is implemented by what carries an Arena for its user: a request
// view of package middleware's, whose key functions (package keyfunc) then
// carve their keys from the request's Arena rather than from one of the
// pool's.
type Holder interface {
	Arena() *Arena
}

// Get returns an Arena from a shared pool. Return it with Put.
func Get() *Arena { return pool.Get().(*Arena) }

// Put returns a to the pool. a must not be used afterwards; what it
// returned stays valid.
func Put(a *Arena) { pool.Put(a) }

// String returns a string holding a copy of b.
func (a *Arena) String(b []byte) string {
	switch {
	case len(b) == 0:
		return ""
	case len(b) > maxCarved:
		return string(b)
	}
	if cap(a.buf)-len(a.buf) < len(b) {
		a.buf = make([]byte, 0, ChunkBytes)
	}
	start := len(a.buf)
	a.buf = append(a.buf, b...)
	return unsafe.String(&a.buf[start], len(b))
}

// One returns a slice of length and capacity 1 holding s, as an
// http.Header value: an append to it copies rather than writing past it.
func (a *Arena) One(s string) []string {
	if len(a.slots) == cap(a.slots) {
		a.slots = make([]string, 0, chunkSlots)
	}
	a.slots = append(a.slots, s)
	n := len(a.slots)
	return a.slots[n-1 : n : n]
}

// Slots returns n empty strings carved from one chunk, for a
// caller that needs several one-element slices at once: it fills each
// and hands it out as s[i:i+1:i+1], which is what One returns.
func (a *Arena) Slots(n int) []string {
	if cap(a.slots)-len(a.slots) < n {
		a.slots = make([]string, 0, max(chunkSlots, n))
	}
	start := len(a.slots)
	a.slots = a.slots[:start+n]
	return a.slots[start : start+n : start+n]
}
