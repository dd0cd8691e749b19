package outbound

import "sync"

// The queues in which requests wait for their turn, one per binding rule
// and key, so that the requests of one key go out in the order they began
// waiting: only the oldest asks the Limiter again, when its wait is over;
// the others wait behind it. A request that comes while requests of one
// of its keys wait joins their queue before it asks the Limiter at all,
// so that it cannot take the unit that frees up for the oldest. A queue
// lives while requests wait in it.

// queueID names a queue: the rule and key of the limit that made its
// requests wait.
type queueID struct{ rule, key string }

// place is a request's place in a queue; turn is closed when it is first.
type place struct {
	id         queueID
	turn       chan struct{}
	prev, next *place
	in         bool // still in its queue
}

// queue is a list of places, first to last.
type queue struct{ first, last *place }

// queues holds the queues of a Transport and bounds how many requests
// wait in them at once.
type queues struct {
	mu      sync.Mutex
	m       map[queueID]*queue
	waiting int
	max     int
	// freed is closed, and replaced, when a request of the Transport
	// ends: the requests a concurrency limit holds back may go.
	freed chan struct{}
}

// has reports whether requests wait in queue id.
func (qs *queues) has(id queueID) bool {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.m[id] != nil
}

// join gives a request the last place of queue id, or nil when max
// requests wait already.
func (qs *queues) join(id queueID) *place {
	p := &place{id: id, turn: make(chan struct{}), in: true}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.waiting >= qs.max {
		return nil
	}
	qs.waiting++
	if qs.m == nil {
		qs.m = map[queueID]*queue{}
	}
	q := qs.m[id]
	if q == nil {
		q = &queue{}
		qs.m[id] = q
	}
	if q.last == nil {
		q.first, q.last = p, p
		close(p.turn)
	} else {
		p.prev, q.last.next, q.last = q.last, p, p
	}
	return p
}

// leave takes p out of its queue; when p was first, the next place's
// turn comes. Leaving twice, or a nil place, does nothing.
func (qs *queues) leave(p *place) {
	if p == nil {
		return
	}
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if !p.in {
		return
	}
	p.in = false
	qs.waiting--
	q := qs.m[p.id]
	if p.prev == nil {
		q.first = p.next
		if q.first != nil {
			close(q.first.turn)
		}
	} else {
		p.prev.next = p.next
	}
	if p.next == nil {
		q.last = p.prev
	} else {
		p.next.prev = p.prev
	}
	if q.first == nil {
		delete(qs.m, p.id)
	}
	p.prev, p.next = nil, nil
}

// slotFreed tells the requests that wait for a concurrency slot that one
// may be free.
func (qs *queues) slotFreed() {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.freed != nil {
		close(qs.freed)
		qs.freed = nil
	}
}

// whenFreed returns a channel closed when a request of the Transport next
// ends.
func (qs *queues) whenFreed() <-chan struct{} {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	if qs.freed == nil {
		qs.freed = make(chan struct{})
	}
	return qs.freed
}

// len returns how many requests wait.
func (qs *queues) len() int {
	qs.mu.Lock()
	defer qs.mu.Unlock()
	return qs.waiting
}
