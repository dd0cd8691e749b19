package redispipe

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultMemoryEvery is how often each server's memory figures are read
// when Config.MemoryEvery is zero.
const DefaultMemoryEvery = 30 * time.Second

// outOfMemoryFor is how long after an OOM reply a server counts as out of
// memory (ServerState.OutOfMemory).
const outOfMemoryFor = 10 * time.Second

// memoryReadTimeout bounds a reading of a server's memory figures.
const memoryReadTimeout = time.Second

// Memory is what a server said of its memory when last asked (see
// Config.MemoryEvery).
type Memory struct {
	// Policy is its maxmemory-policy ("noeviction", "allkeys-lru", ...),
	// "" if it could not be read.
	Policy string
	// MaxMemory is its maxmemory in bytes, 0 for no limit; Used its
	// used_memory (0 if INFO was refused).
	MaxMemory, Used int64
	// Evicted is its evicted_keys, the keys it evicted since it started,
	// or -1 if INFO was refused.
	Evicted int64
	// At is when the figures were read, the zero time if never; Err why
	// neither INFO nor CONFIG GET could read them then.
	At  time.Time
	Err error
}

// MayEvict reports whether the server may evict keys when it is full:
// it has a maxmemory and a maxmemory-policy other than noeviction. Every
// policy but noeviction may evict a rate limiter's counters, all of which
// have an expiry: allkeys-* policies evict any key, volatile-* policies
// those with an expiry, volatile-ttl the soonest to expire first.
func (m Memory) MayEvict() bool {
	return m.MaxMemory > 0 && m.Policy != "" && m.Policy != "noeviction"
}

// MemoryEvent is a report of Config.OnMemory.
type MemoryEvent struct {
	// Memory is what the server said of its memory when last asked.
	Memory Memory
	// OutOfMemory reports that the server has just refused a call for
	// want of memory (an OOM reply) after not doing so for a while.
	OutOfMemory bool
	// EvictedSince is how many keys it evicted since the reading before
	// (0 on the first).
	EvictedSince int64
	// First is set on the first reading of the destination's figures.
	First bool
}

// IsOutOfMemory reports whether err is a server's OOM reply: it refused a
// command that could grow its memory, being over its maxmemory with the
// policy noeviction (or with nothing left to evict). Such a reply is
// final: nothing will do better before memory is freed, so the call is
// not sent again.
func IsOutOfMemory(err error) bool {
	return err != nil && isRedisError(err) && redis.HasErrorPrefix(err, "OOM")
}

// memoryWatch reads a destination's memory figures at its creation and
// then every Config.MemoryEvery, and notes its OOM replies.
type memoryWatch struct {
	mu    sync.Mutex
	mem   Memory
	timer *time.Timer
	// oomAt is when the destination last answered OOM; reported is when
	// that was last reported to OnMemory.
	oomAt, reported time.Time
}

// watchMemory starts reading d's memory figures, unless Config.MemoryEvery
// is negative.
func (d *dest) watchMemory() {
	every := d.p.memoryEvery()
	if every < 0 {
		return
	}
	// Armed once the first reading is done.
	t := time.AfterFunc(time.Hour, func() { d.readMemory(false) })
	t.Stop()
	d.memory.mu.Lock()
	d.memory.timer = t
	d.memory.mu.Unlock()
	d.p.wg.Add(1)
	go func() {
		defer d.p.wg.Done()
		d.readMemory(true)
	}()
}

// stopMemory stops the readings of d's memory figures.
func (d *dest) stopMemory() {
	d.memory.mu.Lock()
	t := d.memory.timer
	d.memory.mu.Unlock()
	if t != nil {
		t.Stop()
	}
}

// memoryEvery is how often servers' memory figures are read; negative
// for never.
func (p *Pipeliner) memoryEvery() time.Duration {
	if e := p.cfg.MemoryEvery; e != 0 {
		return e
	}
	return DefaultMemoryEvery
}

// readMemory reads the figures of d's server, reports them to
// Config.OnMemory if they are the first or tell of evictions, and sets
// itself to run again.
func (d *dest) readMemory(first bool) {
	if d.p.ctx.Err() != nil {
		return
	}
	w := &d.memory
	w.mu.Lock()
	timer := w.timer
	w.mu.Unlock()
	defer timer.Reset(d.p.memoryEvery())
	m, ok := readMemory(d.p.ctx, d.client.Load())
	if !ok {
		return // no answer: the destination's health says why
	}
	w.mu.Lock()
	prev := w.mem
	w.mem = m
	w.mu.Unlock()
	ev := MemoryEvent{Memory: m, First: first}
	if !first && prev.Evicted >= 0 && m.Evicted > prev.Evicted {
		ev.EvictedSince = m.Evicted - prev.Evicted
	}
	if fn := d.p.cfg.OnMemory; fn != nil && (first || ev.EvictedSince > 0 || m.MayEvict() != prev.MayEvict()) {
		fn(d.name, ev)
	}
}

// noteOutOfMemory records an OOM reply of d's server, and reports it to
// Config.OnMemory if none came for outOfMemoryFor.
func (d *dest) noteOutOfMemory() {
	now := time.Now()
	w := &d.memory
	w.mu.Lock()
	w.oomAt = now
	report := now.Sub(w.reported) >= outOfMemoryFor
	if report {
		w.reported = now
	}
	m := w.mem
	w.mu.Unlock()
	if fn := d.p.cfg.OnMemory; fn != nil && report {
		d.p.wg.Add(1)
		go func() {
			defer d.p.wg.Done()
			fn(d.name, MemoryEvent{Memory: m, OutOfMemory: true})
		}()
	}
}

// memoryState returns d's memory figures and whether its server answered
// OOM lately.
func (d *dest) memoryState(now time.Time) (Memory, bool) {
	w := &d.memory
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mem, !w.oomAt.IsZero() && now.Sub(w.oomAt) < outOfMemoryFor
}

// readMemory asks the server of c for its memory figures: INFO memory
// and stats, or, where INFO is refused (a managed service may rename or
// forbid it), CONFIG GET maxmemory*. It reports false if the server did
// not answer.
func readMemory(ctx context.Context, c *redis.Client) (Memory, bool) {
	ctx, cancel := context.WithTimeout(ctx, memoryReadTimeout)
	defer cancel()
	// A clone shares the client's pool but none of its hooks: the
	// readings are not the application's commands.
	clone := c.WithTimeout(memoryReadTimeout)
	m := Memory{At: time.Now(), Evicted: -1}
	info, err := clone.Info(ctx, "memory", "stats").Result()
	if err == nil {
		f := infoFields(info)
		m.Policy = f["maxmemory_policy"]
		m.MaxMemory, _ = strconv.ParseInt(f["maxmemory"], 10, 64)
		m.Used, _ = strconv.ParseInt(f["used_memory"], 10, 64)
		if v, err := strconv.ParseInt(f["evicted_keys"], 10, 64); err == nil {
			m.Evicted = v
		}
		return m, true
	}
	if !isRedisError(err) {
		return m, false
	}
	cfg, cerr := clone.ConfigGet(ctx, "maxmemory*").Result()
	if cerr != nil {
		if !isRedisError(cerr) {
			return m, false
		}
		m.Err = cerr
		return m, true
	}
	m.Policy = cfg["maxmemory-policy"]
	m.MaxMemory, _ = strconv.ParseInt(cfg["maxmemory"], 10, 64)
	return m, true
}

// infoFields parses the output of INFO into its name:value pairs.
func infoFields(info string) map[string]string {
	f := make(map[string]string)
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			f[k] = v
		}
	}
	return f
}
