// Package topk finds the heaviest keys of a stream of weighted events
// (clients and the units they were charged or denied) in bounded memory,
// with a stated error, and merges the summaries of several periods or
// servers without losing that bound.
//
// A Summary is the Space-Saving algorithm (Metwally, Agrawal and El Abbadi,
// "Efficient computation of frequent and top-k elements in data streams",
// 2005) with weighted updates: k counters, each a key with an
// overestimate of its units and the most that estimate can be over. A key
// that is not counted takes the counter with the smallest count, starting
// from that count. With N units in the stream:
//
//   - every key's count is at least its true units, and count − error at
//     most;
//   - every error is at most the smallest count, which is at most N/k;
//   - every key whose true units exceed N/k holds a counter.
//
// A View is a summary in the form of Misra and Gries, which merges
// (Agarwal, Cormode, Huang, Phillips, Wei and Yi, "Mergeable summaries",
// 2012): at most k−1 keys, each with a lower bound G, and one Bound such
// that every key's true units are within [G, G+Bound], a key not listed
// having G = 0. Merge adds views and, to keep k−1 keys, subtracts the k-th
// largest G from every key and adds it to Bound; Bound stays at most N/k
// for the N units of all the views merged, however many there are and in
// whatever order they are merged. Entries also carry the tighter bounds the
// summaries knew, Lo ≤ true ≤ Hi, which is what they show.
//
// A Window is a sliding period made of buckets, each a Summary; its View
// merges the buckets of the period.
//
// Memory: a Summary holds at most k keys, a View at most k−1 and a
// Window at most (buckets+1)·k; each key costs its length plus about 100
// bytes (a counter of 40 bytes, a map entry and its share of the map).
// Nothing in this package is safe for concurrent use.
//
// AppendView and ReadView encode a View for the servers of a fleet to
// share. Package hitters keeps the summaries of a Limiter's rules; the
// top clients they serve, and their bound, are in docs/operations.md.
package topk

import (
	"slices"
	"strings"
	"unsafe"
)

// Summary is a Space-Saving summary with at most k counters. The zero
// value is not usable; make one with NewSummary.
type Summary struct {
	k int
	// heap is a 4-ary min-heap of the counters by count, the counts in
	// the heap itself so that sifting reads no counter; idx maps each key
	// to its counter. The counters live in nodes, made once.
	heap  []item
	idx   map[string]*counter
	nodes []counter
	// n is the units added since the last Reset.
	n uint64
}

// item is a counter's place in the heap: its count (at least the key's
// true units) and the counter.
type item struct {
	count uint64
	c     *counter
}

type counter struct {
	// key is the key, its bytes those of buf, which the counter reuses
	// for the next key that takes it: a replacement allocates nothing
	// once buf is long enough. Views copy it.
	key   string
	buf   []byte
	err   uint64 // count − err is at most the key's true units
	first int64  // when the key took this counter (Unix ms)
	pos   int    // in heap
}

// NewSummary returns an empty Summary of k counters; k must be at least 2.
func NewSummary(k int) *Summary {
	if k < 2 {
		panic("topk: NewSummary needs k >= 2")
	}
	return &Summary{k: k}
}

// K returns the number of counters.
func (s *Summary) K() int { return s.k }

// N returns the units added since the summary was made or Reset.
func (s *Summary) N() uint64 { return s.n }

// Len returns how many keys the summary holds, at most K.
func (s *Summary) Len() int { return len(s.heap) }

// Reset empties the summary, keeping its memory for reuse.
func (s *Summary) Reset() {
	clear(s.heap)
	s.heap = s.heap[:0]
	s.nodes = s.nodes[:0] // their buffers are reused
	clear(s.idx)
	s.n = 0
}

// Add counts units for key at now (Unix ms, kept as the key's first sight
// when it takes a counter). key is copied only when it takes a counter,
// so it may be a buffer the caller reuses.
func (s *Summary) Add(key []byte, units uint64, now int64) {
	if units == 0 {
		return
	}
	s.n += units
	if c, ok := s.idx[string(key)]; ok {
		s.heap[c.pos].count += units
		s.down(c.pos)
		return
	}
	if s.idx == nil {
		s.idx = make(map[string]*counter, s.k)
		s.nodes = make([]counter, 0, s.k)
		s.heap = make([]item, 0, s.k)
	}
	if len(s.heap) < s.k {
		var c *counter
		if len(s.nodes) < cap(s.nodes) {
			// A node of before a Reset: its buffer is reused.
			s.nodes = s.nodes[:len(s.nodes)+1]
			c = &s.nodes[len(s.nodes)-1]
			c.err, c.first = 0, now
		} else {
			s.nodes = append(s.nodes, counter{first: now})
			c = &s.nodes[len(s.nodes)-1]
		}
		c.setKey(key)
		c.pos = len(s.heap)
		s.heap = append(s.heap, item{count: units, c: c})
		s.idx[c.key] = c
		s.up(c.pos)
		return
	}
	// Full: the key takes the smallest counter, which keeps its count as
	// the new key's possible overestimate.
	m := &s.heap[0]
	c := m.c
	delete(s.idx, c.key)
	c.setKey(key)
	c.err, c.first = m.count, now
	m.count += units
	s.idx[c.key] = c
	s.down(0)
}

// setKey makes key the counter's, in its buffer. The previous key must
// be out of the index: its bytes are overwritten.
func (c *counter) setKey(key []byte) {
	if cap(c.buf) < len(key) {
		c.buf = make([]byte, len(key), max(len(key), 24))
	}
	c.buf = append(c.buf[:0], key...)
	c.key = unsafe.String(unsafe.SliceData(c.buf), len(c.buf))
	if len(key) == 0 {
		c.key = ""
	}
}

// min returns the smallest count if every counter is taken, else 0: an
// upper bound on the units of any key the summary does not hold.
func (s *Summary) min() uint64 {
	if len(s.heap) < s.k {
		return 0
	}
	return s.heap[0].count
}

func (s *Summary) swap(i, j int) {
	s.heap[i], s.heap[j] = s.heap[j], s.heap[i]
	s.heap[i].c.pos, s.heap[j].c.pos = i, j
}

func (s *Summary) up(i int) {
	for i > 0 {
		p := (i - 1) / 4
		if s.heap[i].count >= s.heap[p].count {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *Summary) down(i int) {
	h := s.heap
	for {
		first := 4*i + 1
		if first >= len(h) {
			return
		}
		c := first
		for j := first + 1; j < min(first+4, len(h)); j++ {
			if h[j].count < h[c].count {
				c = j
			}
		}
		if h[c].count >= h[i].count {
			return
		}
		s.swap(i, c)
		i = c
	}
}

// Entry is one key of a View.
type Entry struct {
	Key string
	// G is the Misra–Gries counter: a lower bound on the key's units,
	// such that G+Bound is an upper bound. It is what merges work on.
	G uint64
	// Hi and Lo bound the key's true units: Lo ≤ true ≤ Hi, and
	// Hi − Lo ≤ Bound. Hi is the count shown, Hi − Lo its error.
	Hi, Lo uint64
	// First is when the key was first counted in what the view covers
	// (Unix ms): the earliest sight among the summaries that hold it.
	First int64
}

// View is a mergeable summary: at most K−1 entries, ordered by Hi, most
// first. Every key's true units are at most Bound more than its G, and a
// key not listed has at most Bound units; Bound ≤ N/K.
type View struct {
	K       int
	N       uint64
	Bound   uint64
	Entries []Entry
}

// View returns the summary as a View.
func (s *Summary) View() View {
	m := s.min()
	v := View{K: s.k, N: s.n, Bound: m, Entries: make([]Entry, 0, len(s.heap))}
	for _, it := range s.heap {
		// As a Misra–Gries counter, the smallest count is subtracted from
		// every count: the counter that holds it becomes 0 and goes.
		if it.count <= m {
			continue
		}
		c := it.c
		v.Entries = append(v.Entries, Entry{Key: strings.Clone(c.key), G: it.count - m, Hi: it.count, Lo: it.count - c.err, First: c.first})
	}
	sortEntries(v.Entries)
	return v
}

// sortEntries orders entries by Hi, most first, then by key.
func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		switch {
		case a.Hi > b.Hi:
			return -1
		case a.Hi < b.Hi:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
}

// Merge returns the view of the union of the streams the views summarise,
// with at most k−1 entries (k at least 2; views of a larger K are reduced
// to k). Its Bound is at most N/k for the N units of all the views, if
// each view's Bound was at most its own N/k.
func Merge(k int, views ...View) View {
	if k < 2 {
		panic("topk: Merge needs k >= 2")
	}
	out := View{K: k}
	n := 0
	for _, v := range views {
		out.N += v.N
		out.Bound += v.Bound
		n += len(v.Entries)
	}
	if n == 0 {
		return out
	}
	type acc struct {
		Entry
		hiOwn, boundOwn uint64 // Hi and Bound of the views that list the key
	}
	m := make(map[string]*acc, n)
	order := make([]*acc, 0, n)
	for _, v := range views {
		for _, e := range v.Entries {
			a := m[e.Key]
			if a == nil {
				a = &acc{Entry: Entry{Key: e.Key, First: e.First}}
				m[e.Key] = a
				order = append(order, a)
			}
			a.G += e.G
			a.Lo += e.Lo
			a.hiOwn += e.Hi
			a.boundOwn += v.Bound
			a.First = min(a.First, e.First)
		}
	}
	es := make([]Entry, len(order))
	for i, a := range order {
		// A view that does not list the key bounds its units by its
		// Bound.
		a.Hi = a.hiOwn + out.Bound - a.boundOwn
		es[i] = a.Entry
	}
	if len(es) >= k {
		// Keep k−1 counters: the k-th largest G comes off every counter,
		// and those it empties go (Misra–Gries).
		gs := make([]uint64, len(es))
		for i, e := range es {
			gs[i] = e.G
		}
		slices.SortFunc(gs, func(a, b uint64) int {
			switch {
			case a > b:
				return -1
			case a < b:
				return 1
			}
			return 0
		})
		c := gs[k-1]
		out.Bound += c
		kept := es[:0]
		for _, e := range es {
			if e.G > c {
				e.G -= c
				kept = append(kept, e)
			}
		}
		es = kept
	}
	sortEntries(es)
	out.Entries = es
	return out
}
