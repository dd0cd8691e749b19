package middleware

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/redispipe"
)

// ServerMemory is what a Redis server said of its memory when the store
// last asked (RedisConfig.MemoryCheck): INFO memory and stats, or CONFIG
// GET where INFO is refused.
type ServerMemory struct {
	// Policy is the server's maxmemory-policy ("noeviction",
	// "allkeys-lru", ...), "" if it could not be read.
	Policy string
	// MaxMemory is its maxmemory in bytes (0: no limit); Used, its
	// used_memory (0 if INFO was refused).
	MaxMemory, Used int64
	// Evicted is the number of keys the server evicted since it started
	// (evicted_keys), or -1 if INFO was refused.
	Evicted int64
	// CheckedAt is when the figures were read (the zero time if they have
	// not been yet); Err why neither INFO nor CONFIG GET could read them.
	CheckedAt time.Time
	Err       error
}

// MayEvict reports whether the server may evict rate-limit counters when
// its memory is full: it has a maxmemory and a maxmemory-policy other
// than noeviction. Every key the store writes has an expiry, so
// volatile-* policies may evict counters as allkeys-* policies do
// (volatile-ttl the soonest to expire, which counters often are), and a
// client whose counter is evicted starts afresh: the limit is quietly not
// enforced. With noeviction, a full Redis refuses writes instead (OOM),
// which the failure policy answers, and which Health and the metrics
// report. See docs/redis.md, "Memory".
func (m ServerMemory) MayEvict() bool {
	return m.MaxMemory > 0 && m.Policy != "" && m.Policy != "noeviction"
}

// MemoryReport is a report on a Redis server's memory, carried by a
// HealthEvent.
type MemoryReport struct {
	// Memory is what the server said of its memory when last asked.
	Memory ServerMemory
	// OutOfMemory reports that the server refused a write for want of
	// memory (an OOM reply): the requests that would write are answered
	// by the failure policy until memory is freed.
	OutOfMemory bool
	// EvictedSince is how many keys the server evicted since it was last
	// asked: rate-limit counters may have been among them.
	EvictedSince int64
}

// memoryOf converts the pipeliner's figures.
func memoryOf(m redispipe.Memory) ServerMemory {
	return ServerMemory{Policy: m.Policy, MaxMemory: m.MaxMemory, Used: m.Used, Evicted: m.Evicted, CheckedAt: m.At, Err: m.Err}
}

// memory passes a report on a server's memory to the observers, as a
// HealthEvent: a warning, with what to do in its Cause, when the server
// may evict counters (at the first reading, and when that changes), when
// it evicted keys, and when it refuses writes for want of memory; an
// event with no Cause when a server that may evict no longer does. The
// warning that a server may evict is kept and given to observers added
// later (a Limiter made after the store's first reading).
func (r *RedisStore) memory(server string, e redispipe.MemoryEvent) {
	m := memoryOf(e.Memory)
	rep := &MemoryReport{Memory: m, OutOfMemory: e.OutOfMemory, EvictedSince: e.EvictedSince}
	ev := HealthEvent{Server: server, Up: true, Memory: rep}
	switch {
	case e.OutOfMemory:
		ev.Cause = fmt.Errorf("%w: it refuses writes (OOM, maxmemory %s, maxmemory-policy %s): requests that would write go to the failure policy; free memory or raise maxmemory (docs/redis.md, Memory)",
			ErrOutOfMemory, bytesOf(m.MaxMemory), memoryPolicy(m.Policy))
	case e.EvictedSince > 0:
		ev.Cause = fmt.Errorf("%w: it evicted %d keys since it was last asked (maxmemory %s, maxmemory-policy %s), which may have been rate-limit counters, whose clients then start afresh; set maxmemory-policy noeviction and size maxmemory for the counters (docs/redis.md, Memory)",
			ErrMayEvict, e.EvictedSince, bytesOf(m.MaxMemory), m.Policy)
	case m.MayEvict():
		ev.Cause = fmt.Errorf("%w: maxmemory-policy %s with maxmemory %s lets it evict rate-limit counters when it is full, whose clients then start afresh; set maxmemory-policy noeviction and size maxmemory for the counters (docs/redis.md, Memory)",
			ErrMayEvict, m.Policy, bytesOf(m.MaxMemory))
	case e.First:
		return // nothing to say
	}
	r.mu.Lock()
	if r.evicting == nil {
		r.evicting = make(map[string]HealthEvent)
	}
	if m.MayEvict() {
		if !e.OutOfMemory {
			r.evicting[server] = ev
		}
	} else {
		delete(r.evicting, server)
	}
	r.mu.Unlock()
	for _, o := range r.obs.load() {
		o.StoreHealth(ev)
	}
}

// memoryWarnings returns the warnings that servers may evict counters.
func (r *RedisStore) memoryWarnings() []HealthEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]HealthEvent, 0, len(r.evicting))
	for _, ev := range r.evicting {
		out = append(out, ev)
	}
	return out
}

// ErrOutOfMemory is wrapped by the Cause of a HealthEvent that reports a
// Redis server refusing writes for want of memory (OOM).
var ErrOutOfMemory = errors.New("sluice: Redis out of memory")

// ErrMayEvict is wrapped by the Cause of a HealthEvent that reports a
// Redis server that may evict, or evicted, rate-limit counters.
var ErrMayEvict = errors.New("sluice: Redis may evict rate-limit counters")

func memoryPolicy(p string) string {
	if p == "" {
		return "unknown"
	}
	return p
}

// bytesOf formats a maxmemory.
func bytesOf(n int64) string {
	switch {
	case n == 0:
		return "none"
	case n%(1<<30) == 0:
		return fmt.Sprintf("%d GiB", n>>30)
	case n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// ServerMemories returns the memory of the Redis servers of the stores of
// lims, as their Health reports it, for metrics that export a series per
// server (the nested modules middleware/metrics/prometheus and
// middleware/metrics/otel): one ServerHealth per server whose figures were
// read or that answered OOM, sorted by address. A server that several
// limiters' stores share is out of memory, or may evict, if any of them
// says so, with the most evicted keys any of them read. Past max servers,
// the others are folded into one named other.
func ServerMemories(lims []*Limiter, max int, other string) []ServerHealth {
	byServer := map[string]*ServerHealth{}
	var names []string
	for _, lim := range lims {
		for _, s := range lim.Health().Servers {
			if s.Memory.CheckedAt.IsZero() && !s.OutOfMemory {
				continue
			}
			e := byServer[s.Server]
			if e == nil {
				e = &ServerHealth{Server: s.Server, Memory: ServerMemory{Evicted: -1}}
				byServer[s.Server] = e
				names = append(names, s.Server)
			}
			mergeMemory(e, &s)
		}
	}
	slices.Sort(names)
	out := make([]ServerHealth, 0, min(len(names), max+1))
	for i, name := range names {
		if i < max {
			out = append(out, *byServer[name])
			continue
		}
		if i == max {
			out = append(out, ServerHealth{Server: other, Memory: ServerMemory{Evicted: -1}})
		}
		mergeMemory(&out[len(out)-1], byServer[name])
	}
	return out
}

// mergeMemory merges the memory of s into e (see ServerMemories).
func mergeMemory(e, s *ServerHealth) {
	e.OutOfMemory = e.OutOfMemory || s.OutOfMemory
	if s.Memory.CheckedAt.After(e.Memory.CheckedAt) || (s.Memory.MayEvict() && !e.Memory.MayEvict()) {
		evicted := max(e.Memory.Evicted, s.Memory.Evicted)
		e.Memory = s.Memory
		e.Memory.Evicted = evicted
	} else {
		e.Memory.Evicted = max(e.Memory.Evicted, s.Memory.Evicted)
	}
}
