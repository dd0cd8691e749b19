package hitters

import (
	"runtime"
	"strings"
	"sync/atomic"
)

// Kind says whether an event's units were charged or denied.
type Kind uint8

// The kinds of event.
const (
	Charged Kind = iota
	Denied
	numKinds
)

// String returns "charged" or "denied".
func (k Kind) String() string {
	if k == Denied {
		return "denied"
	}
	return "charged"
}

const (
	// slotsPerShard is the capacity of each shard of the ring.
	slotsPerShard = 512
	// wakeEvery: a producer wakes the drainer each time it fills this
	// many slots of a shard, so that a shard is drained long before it is
	// full.
	wakeEvery = slotsPerShard / 4
	// inlineKey is the longest key a slot holds in place; a longer one is
	// copied to the heap (one allocation).
	inlineKey = 66
	// maxShards bounds the shards, whatever GOMAXPROCS says.
	maxShards = 16
)

// slot is one run of like events in the ring (one rule, kind and key),
// 128 bytes.
type slot struct {
	// seq is the slot's turn: pos when free for the producer at pos,
	// pos+1 once that producer filled it (Vyukov's bounded queue), with
	// held set while a producer adds to it or the consumer takes it.
	seq    atomic.Uint64
	rule   string
	units  int64
	reqs   uint64 // the requests the events stand for (sampled, each may stand for many)
	long   string // the key, when longer than inlineKey
	events uint32 // how many events the slot adds up
	n      uint8  // the key's length, when inline
	kind   Kind
	key    [inlineKey]byte
}

// held marks a slot's seq while one goroutine reads or changes it.
const held = 1 << 63

// shard is one ring of slots with its producers' and consumer's positions,
// on cache lines of their own.
type shard struct {
	tail atomic.Uint64 // the producers' next position
	// last is the position of the slot filled last, which a like event
	// adds to while it is not drained, and lastSig the signature of its
	// event (see sig), so that an event unlike it is told at a glance.
	last    atomic.Uint64
	lastSig atomic.Uint64
	_       [40]byte
	slots   atomic.Pointer[[slotsPerShard]slot]
	head    atomic.Uint64 // the consumer's next position
	_       [48]byte
}

// Ring carries events from the requests that make them to the one
// goroutine that drains them: a bounded lock-free queue per shard
// (multi-producer, one consumer), each producer sticking to the shard it
// was given so that its cache lines stay on its core. Putting an event
// copies its key into the slot and allocates nothing (but for keys longer
// than 74 bytes). When a shard is full (the drainer is short of CPU), the
// producer asks Help to drain it, which must not wait; if Help cannot (the
// drainer is at it), the producer yields once and tries again, and if the
// shard is still full, the event is dropped and counted.
type Ring struct {
	shards []shard
	mask   uint32
	next   atomic.Uint32
	// wake has a value when the drainer should run now.
	wake chan struct{}
	// dropped counts the events and units dropped on full shards.
	dropped, droppedUnits atomic.Uint64
	// Help, if set, is asked to drain a full shard (one consumer at a
	// time: it drains only if no one else does) and reports whether it
	// did. Set it before the first Put.
	Help func(shard uint32) bool
}

// NewRing returns a ring of up to 16 shards (twice GOMAXPROCS), whose
// memory (64 KiB a shard) is allocated when a shard is first used.
func NewRing() *Ring {
	n := 1
	for n < 2*runtime.GOMAXPROCS(0) && n < maxShards {
		n *= 2
	}
	return &Ring{shards: make([]shard, n), mask: uint32(n - 1), wake: make(chan struct{}, 1)}
}

// Shard returns the shard a producer should use, from 1: producers are
// spread over the shards in turn. A producer keeps it (a per-P scratch
// buffer does) so that each shard has few producers.
func (r *Ring) Shard() uint32 { return r.next.Add(1)&r.mask + 1 }

// Wake is signalled when a shard has filled a quarter more of its slots.
func (r *Ring) Wake() <-chan struct{} { return r.wake }

// Put adds an event of one request to the shard (as Shard returned it):
// PutN with reqs 1.
func (r *Ring) Put(shard uint32, rule, key string, units int64, kind Kind) {
	r.PutN(shard, rule, key, units, 1, kind)
}

// PutN adds an event to the shard (as Shard returned it) that stands for
// units and reqs requests (a sampled event stands for many). rule must be
// a string that is never changed (a rule's name); key is copied. An event
// like the one filled last in the shard (the same rule, kind and key: a
// client's burst), while that one is not drained, is added to it rather
// than given a slot.
func (r *Ring) PutN(shard uint32, rule, key string, units int64, reqs uint64, kind Kind) {
	sh := &r.shards[(shard-1)&r.mask]
	slots := sh.slots.Load()
	if slots == nil {
		slots = sh.alloc()
	}
	sg := sig(key, kind)
	if last := sh.last.Load(); last > 0 && sh.lastSig.Load() == sg {
		s := &slots[(last-1)%slotsPerShard]
		if s.seq.CompareAndSwap(last, last|held) {
			like := s.rule == rule && s.kind == kind && s.events < 1<<31 && s.long == "" &&
				int(s.n) == len(key) && string(s.key[:s.n]) == key
			if like {
				s.units += units
				s.reqs += reqs
				s.events++
			}
			s.seq.Store(last)
			if like {
				return
			}
		}
	}
	pos := sh.tail.Load()
	helped := false
	for {
		s := &slots[pos%slotsPerShard]
		seq := s.seq.Load()
		switch {
		case seq == pos:
			if !sh.tail.CompareAndSwap(pos, pos+1) {
				pos = sh.tail.Load()
				continue
			}
			s.rule, s.units, s.reqs, s.kind, s.events = rule, units, reqs, kind, 1
			if len(key) <= inlineKey {
				s.n = uint8(copy(s.key[:], key))
			} else {
				s.long = strings.Clone(key)
			}
			s.seq.Store(pos + 1)
			sh.last.Store(pos + 1)
			sh.lastSig.Store(sg)
			if (pos+1)%wakeEvery == 0 {
				r.wakeUp(sh, pos+1)
			}
			return
		case seq < pos:
			// The slot of the previous lap is not drained yet (seq is
			// below pos even while it is held): full.
			if !helped && r.Help != nil {
				// Drain it if no one does; if someone does, the slot is
				// freed in a moment: yield once to them, and try again.
				if !r.Help(shard) {
					runtime.Gosched()
				}
				helped = true
				pos = sh.tail.Load()
				continue
			}
			r.dropped.Add(1)
			r.droppedUnits.Add(uint64(max(units, 0)))
			return
		default:
			pos = sh.tail.Load() // another producer took pos
		}
	}
}

// sig is a signature of an event: its kind, its key's length and last
// six bytes (where keys of addresses and users differ most). Events whose
// signatures differ are unlike; events with the same one are compared in
// full.
func sig(key string, kind Kind) uint64 {
	v := uint64(len(key))<<1 | uint64(kind)
	for i := 1; i <= 6 && i <= len(key); i++ {
		v = v<<8 | uint64(key[len(key)-i])
	}
	return v
}

// wakeUp wakes the drainer and, if the shard is more than half full (the
// drainer is falling behind: on a busy server it waits for a processor),
// yields this goroutine's processor so that it runs now rather than after
// the scheduler's time slice, by which time the shard would overflow.
func (r *Ring) wakeUp(sh *shard, filled uint64) {
	select {
	case r.wake <- struct{}{}:
	default:
	}
	if filled-sh.head.Load() > slotsPerShard/2 {
		runtime.Gosched()
	}
}

// alloc makes the shard's slots, once.
func (sh *shard) alloc() *[slotsPerShard]slot {
	s := new([slotsPerShard]slot)
	for i := range s {
		s[i].seq.Store(uint64(i))
	}
	if !sh.slots.CompareAndSwap(nil, s) {
		return sh.slots.Load()
	}
	return s
}

// DrainFunc is handed a slot's events: their rule, key, units and the
// requests they stand for, how many events the slot added up, and their
// kind. key is valid only during the call.
type DrainFunc func(rule string, key []byte, units int64, reqs uint64, events uint32, kind Kind)

// Drain hands every event in the ring to fn, oldest first within each
// shard, and returns how many it handed. key is valid only during the
// call. Only one goroutine may drain at a time.
func (r *Ring) Drain(fn DrainFunc) int {
	n := 0
	for i := range r.shards {
		n += r.shards[i].drain(fn)
	}
	return n
}

// DrainShard is Drain for one shard (as Shard returned it).
func (r *Ring) DrainShard(shard uint32, fn DrainFunc) int {
	return r.shards[(shard-1)&r.mask].drain(fn)
}

func (sh *shard) drain(fn DrainFunc) int {
	slots := sh.slots.Load()
	if slots == nil {
		return 0
	}
	var buf [inlineKey]byte
	n := 0
	head := sh.head.Load()
	for {
		s := &slots[head%slotsPerShard]
		switch seq := s.seq.Load(); {
		case seq == (head+1)|held:
			// A producer adds to it: a few instructions.
			runtime.Gosched()
			continue
		case seq != head+1:
			return n
		}
		if !s.seq.CompareAndSwap(head+1, (head+1)|held) {
			continue
		}
		rule, units, reqs, events, kind := s.rule, s.units, s.reqs, s.events, s.kind
		var key []byte
		if s.long != "" {
			key = []byte(s.long)
		} else {
			key = buf[:copy(buf[:], s.key[:s.n])]
		}
		s.rule, s.long, s.n = "", "", 0
		s.seq.Store(head + slotsPerShard)
		head++
		sh.head.Store(head)
		fn(rule, key, units, reqs, events, kind)
		n++
	}
}

// Dropped returns the events and units dropped so far on full shards.
func (r *Ring) Dropped() (events, units uint64) {
	return r.dropped.Load(), r.droppedUnits.Load()
}
