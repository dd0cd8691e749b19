package redispipe

import (
	"sort"
	"time"
)

// ServerState is the health of one destination, as Servers reports it.
type ServerState struct {
	// Server is the destination's address ("FailoverClient" for a
	// Sentinel client).
	Server string
	// Up reports whether calls are sent to it; Slow, that it is not up
	// because its server answers too late (see Config.Bound); Cause is
	// why it is down or slow.
	Up, Slow bool
	Cause    error
	// OutOfMemory reports that the server refused a call for want of
	// memory (an OOM reply) in the last 10 s; Memory is what it said of
	// its memory when last asked (see Config.MemoryEvery).
	OutOfMemory bool
	Memory      Memory
}

// Servers returns the health of every destination the Pipeliner has sent
// to, by address.
func (p *Pipeliner) Servers() []ServerState {
	p.mu.Lock()
	dests := make([]*dest, 0, len(p.byName))
	for _, d := range p.byName {
		dests = append(dests, d)
	}
	p.mu.Unlock()
	if p.single != nil && !containsDest(dests, p.single) {
		dests = append(dests, p.single)
	}
	out := make([]ServerState, len(dests))
	now := time.Now()
	for i, d := range dests {
		d.mu.Lock()
		out[i] = ServerState{Server: d.name, Up: d.state == up, Slow: d.state == slow, Cause: d.downErr}
		d.mu.Unlock()
		out[i].Memory, out[i].OutOfMemory = d.memoryState(now)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Server < out[j].Server })
	return out
}

func containsDest(ds []*dest, d *dest) bool {
	for _, x := range ds {
		if x == d {
			return true
		}
	}
	return false
}
