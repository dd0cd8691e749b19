package topk

// Window summarises two sliding periods of a stream at once: a short one
// of Buckets fine buckets of Span ms, each a Summary, and a long one of
// Buckets coarse buckets of Span·Ratio ms, each a View into which every
// fine bucket is merged once it is complete. Each event updates one
// Summary, whatever the periods; a view of the short period merges the
// fine buckets, and one of the long period the coarse buckets and the
// fine bucket not merged into them yet. Each period keeps its Buckets
// completed buckets and its current one, so that a view covers between
// Buckets and Buckets+1 bucket lengths. Time is explicit (Unix ms), for
// tests.
type Window struct {
	k      int
	span   int64 // of a fine bucket
	ratio  int64 // fine buckets to a coarse one
	fine   []fineBucket
	coarse []coarseBucket
	cur    int64 // the start of the fine bucket of the last Add or View
	// at and last are the instant of the last Add and its bucket.
	at   int64
	last *fineBucket
}

type fineBucket struct {
	start  int64 // -1 when unused
	s      *Summary
	merged bool // into its coarse bucket
}

type coarseBucket struct {
	start int64 // -1 when unused
	v     View
}

// NewWindow returns a Window of k counters per summary, with buckets
// fine buckets of span ms and buckets coarse buckets of span·ratio ms.
func NewWindow(k, buckets int, span, ratio int64) *Window {
	if buckets < 1 || span < 1 || ratio < 1 {
		panic("topk: NewWindow needs buckets, span and ratio >= 1")
	}
	w := &Window{k: k, span: span, ratio: ratio, fine: make([]fineBucket, buckets+1), coarse: make([]coarseBucket, buckets+1), cur: -1}
	for i := range w.fine {
		w.fine[i].start, w.coarse[i].start = -1, -1
	}
	return w
}

// Add counts units for key at now.
func (w *Window) Add(key []byte, units uint64, now int64) {
	if b := w.last; b != nil && now == w.at && b.start == w.cur {
		b.s.Add(key, units, now)
		return
	}
	w.last = nil
	start := now - now%w.span
	if start < w.cur {
		start, now = w.cur, w.cur // a clock gone back: counted as of the latest bucket
	} else if start != w.cur {
		w.advance(start)
	}
	b := &w.fine[int(start/w.span)%len(w.fine)]
	if b.start != start {
		if start < b.start {
			return // older than the bucket's current period: out of the window
		}
		if b.s == nil {
			b.s = NewSummary(w.k)
		} else {
			b.s.Reset()
		}
		b.start, b.merged = start, false
	}
	if start == w.cur {
		w.at, w.last = now, b
	}
	b.s.Add(key, units, now)
}

// advance merges every complete fine bucket (before the one starting at
// cur) into its coarse bucket, once.
func (w *Window) advance(cur int64) {
	if cur < w.cur {
		return
	}
	w.cur = cur
	for i := range w.fine {
		b := &w.fine[i]
		if b.s == nil || b.merged || b.start >= cur {
			continue
		}
		b.merged = true
		cs := b.start - b.start%(w.span*w.ratio)
		c := &w.coarse[int(cs/(w.span*w.ratio))%len(w.coarse)]
		switch {
		case c.start == cs:
			c.v = Merge(w.k, c.v, b.s.View())
		case c.start < cs:
			c.start, c.v = cs, b.s.View()
		}
	}
}

// View returns the view of the short period (long false) or of the long
// one at now.
func (w *Window) View(now int64, long bool) View {
	cur := now - now%w.span
	w.advance(cur)
	var views []View
	if !long {
		for i := range w.fine {
			if b := &w.fine[i]; b.s != nil && w.inFine(b.start, cur) {
				views = append(views, b.s.View())
			}
		}
		return Merge(w.k, views...)
	}
	cs := cur - cur%(w.span*w.ratio)
	for i := range w.coarse {
		if c := &w.coarse[i]; w.inCoarse(c.start, cs) {
			views = append(views, c.v)
		}
	}
	for i := range w.fine {
		if b := &w.fine[i]; b.s != nil && !b.merged && w.inFine(b.start, cur) {
			views = append(views, b.s.View())
		}
	}
	return Merge(w.k, views...)
}

func (w *Window) inFine(start, cur int64) bool {
	return start >= 0 && start <= cur && start > cur-int64(len(w.fine))*w.span
}

func (w *Window) inCoarse(start, cs int64) bool {
	return start >= 0 && start <= cs && start > cs-int64(len(w.coarse))*w.span*w.ratio
}

// Len returns how many keys the window's buckets hold in all (for the
// memory bound): at most (Buckets+1)·k fine and (Buckets+1)·(k−1) coarse.
func (w *Window) Len() int {
	n := 0
	for i := range w.fine {
		if b := &w.fine[i]; b.s != nil {
			n += b.s.Len()
		}
		n += len(w.coarse[i].v.Entries)
	}
	return n
}

// Trim frees the buckets that are out of the window at now, so that a
// stream gone quiet holds no memory.
func (w *Window) Trim(now int64) {
	cur := now - now%w.span
	w.advance(cur)
	cs := cur - cur%(w.span*w.ratio)
	for i := range w.fine {
		if b := &w.fine[i]; b.s != nil && b.merged && !w.inFine(b.start, cur) {
			b.s, b.start = nil, -1
			if w.last == b {
				w.last = nil
			}
		}
		if c := &w.coarse[i]; c.start >= 0 && !w.inCoarse(c.start, cs) {
			c.start, c.v = -1, View{}
		}
	}
}
