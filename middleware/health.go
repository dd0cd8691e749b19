package middleware

import (
	"fmt"
	"time"
)

// Health is the state of a Limiter's store and of what it syncs, as the
// admin handler's operator page shows it.
type Health struct {
	// Store names the store: "memory", "redis", "region" or its Go type.
	Store string
	// BreakerOpen reports that the circuit breaker is open: the store is
	// bypassed and the failure policy decides.
	BreakerOpen bool
	// Servers are the Redis servers the store has sent to, up or down
	// (none for the memory store).
	Servers []ServerHealth
	// Sync is the last run of the coordination layer of rules in lease
	// or write-back mode that had work (nil if none ran).
	Sync *SyncHealth
	// Regions are the peer regions of a RegionStore.
	Regions []RegionHealth
	// TopServer names this app server in the fleet's top-client view;
	// TopPublished is when it last published its summaries and TopErr
	// why the last round failed (zero without a shared store).
	TopServer    string
	TopPublished time.Time
	TopErr       error
}

// ServerHealth is one Redis server of the store.
type ServerHealth struct {
	Server string
	Up     bool
	// Slow reports that it is not up because it answers too late (see
	// RedisConfig.Timeout).
	Slow bool
	// Cause is why it is down or slow.
	Cause error
	// OutOfMemory reports that the server refused a write for want of
	// memory (an OOM reply) in the last 10 s: the requests that would
	// write go to the failure policy.
	OutOfMemory bool
	// Memory is what the server said of its memory when last asked (see
	// RedisConfig.MemoryCheck); Memory.MayEvict reports a server that may
	// evict rate-limit counters.
	Memory ServerMemory
}

// SyncHealth is a run of the coordination layer's syncer.
type SyncHealth struct {
	// At is when it ended, Calls how many calls to Redis it made,
	// Duration how long they took and Err the first error.
	At       time.Time
	Calls    int
	Duration time.Duration
	Err      error
}

// RegionHealth is what the syncer of a RegionStore knows of a peer.
type RegionHealth struct {
	Peer string
	// Reachable is false once syncs to the peer have failed for longer
	// than RegionConfig.Hold (it then counts as its share).
	Reachable bool
	// Failing reports that the last sync failed.
	Failing bool
	// LastSync is when a sync to the peer last succeeded.
	LastSync time.Time
}

// flushed records a run of the syncer.
func (sl *syncLayer) flushed(calls int, d time.Duration, err error) {
	sl.last.Store(&SyncHealth{At: time.Now(), Calls: calls, Duration: d, Err: err})
}

// Health reports the state of the limiter's store: its circuit breaker,
// its Redis servers (up, slow or down, out of memory, and their memory
// figures as last read: see RedisConfig.MemoryCheck), the syncers of
// fleet modes and regions, and the publishing of top-client summaries. It
// makes no call to the store.
func (l *Limiter) Health() Health {
	h := Health{BreakerOpen: l.Stats().BreakerOpen, Sync: l.syncs.last.Load()}
	var redis []*RedisStore
	switch s := l.cfg.store.(type) {
	case *MemoryStore:
		h.Store = "memory"
	case *RedisStore:
		h.Store = "redis"
		redis = append(redis, s)
	case *RegionStore:
		h.Store = "region"
		redis = append(redis, s.local)
		if s.home != s.local {
			redis = append(redis, s.home)
		}
		for _, p := range s.g.Peers() {
			h.Regions = append(h.Regions, RegionHealth{Peer: p.Peer, Reachable: p.Reachable, Failing: p.Failing, LastSync: time.UnixMilli(p.LastOK)})
		}
	default:
		h.Store = fmt.Sprintf("%T", s)
	}
	for _, rs := range redis {
		for _, st := range rs.s.Servers() {
			h.Servers = append(h.Servers, ServerHealth{Server: st.Server, Up: st.Up, Slow: st.Slow, Cause: st.Cause,
				OutOfMemory: st.OutOfMemory, Memory: memoryOf(st.Memory)})
		}
	}
	if t := l.top.t; t != nil {
		h.TopServer = l.cfg.top.Server
		h.TopPublished, h.TopErr = t.PublishState()
	}
	return h
}
