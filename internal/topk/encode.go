package topk

import (
	"encoding/binary"
	"errors"
)

// AppendView appends v in a compact binary form to b: K, N, Bound, the
// number of entries, then each entry's key (length first), G, Hi, Lo and
// First, all as varints.
func AppendView(b []byte, v View) []byte {
	b = binary.AppendUvarint(b, uint64(v.K))
	b = binary.AppendUvarint(b, v.N)
	b = binary.AppendUvarint(b, v.Bound)
	b = binary.AppendUvarint(b, uint64(len(v.Entries)))
	for _, e := range v.Entries {
		b = binary.AppendUvarint(b, uint64(len(e.Key)))
		b = append(b, e.Key...)
		b = binary.AppendUvarint(b, e.G)
		b = binary.AppendUvarint(b, e.Hi)
		b = binary.AppendUvarint(b, e.Lo)
		b = binary.AppendVarint(b, e.First)
	}
	return b
}

// ErrCorrupt is returned by ReadView for bytes AppendView did not write.
var ErrCorrupt = errors.New("topk: corrupt view")

// maxEntries bounds the entries ReadView accepts, whatever a corrupt
// length says.
const maxEntries = 1 << 16

// ReadView reads a view AppendView wrote at the start of b and returns it
// with the rest of b.
func ReadView(b []byte) (View, []byte, error) {
	var v View
	r := reader{b: b}
	k := r.uvarint()
	v.N = r.uvarint()
	v.Bound = r.uvarint()
	n := r.uvarint()
	if r.err || k < 2 || k > maxEntries || n >= k || n > uint64(len(r.b)) {
		return View{}, b, ErrCorrupt
	}
	v.K = int(k)
	v.Entries = make([]Entry, n)
	for i := range v.Entries {
		e := &v.Entries[i]
		l := r.uvarint()
		if r.err || l > uint64(len(r.b)) {
			return View{}, b, ErrCorrupt
		}
		e.Key = string(r.b[:l])
		r.b = r.b[l:]
		e.G, e.Hi, e.Lo = r.uvarint(), r.uvarint(), r.uvarint()
		e.First = r.varint()
		if e.Lo > e.Hi || e.G > e.Hi {
			r.err = true
		}
	}
	if r.err {
		return View{}, b, ErrCorrupt
	}
	return v, r.b, nil
}

type reader struct {
	b   []byte
	err bool
}

func (r *reader) uvarint() uint64 {
	x, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[n:]
	return x
}

func (r *reader) varint() int64 {
	x, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = true
		return 0
	}
	r.b = r.b[n:]
	return x
}
