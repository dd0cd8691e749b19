package redispipe

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// memoryEvents records the reports of Config.OnMemory.
type memoryEvents struct {
	mu     sync.Mutex
	events []MemoryEvent
}

func (m *memoryEvents) on(_ string, e MemoryEvent) {
	m.mu.Lock()
	m.events = append(m.events, e)
	m.mu.Unlock()
}

// wait waits up to 5 s for a report that ok accepts.
func (m *memoryEvents) wait(t *testing.T, what string, ok func(MemoryEvent) bool) MemoryEvent {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		m.mu.Lock()
		for _, e := range m.events {
			if ok(e) {
				m.mu.Unlock()
				return e
			}
		}
		events := append([]MemoryEvent(nil), m.events...)
		m.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("no report of %s after 5 s; reports: %+v", what, events)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// fill writes n values of size bytes under prefix.
func fill(t *testing.T, c *redis.Client, prefix string, n, size int) {
	t.Helper()
	v := strings.Repeat("x", size)
	for i := range n {
		if err := c.Set(context.Background(), prefix+strconv.Itoa(i), v, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestMemoryEviction: a server whose maxmemory-policy may evict is
// reported at the first reading of its figures, and its evictions at the
// next reading after them.
func TestMemoryEviction(t *testing.T) {
	t.Parallel()
	srv := redistest.StandaloneWith(t, "--maxmemory", "3mb", "--maxmemory-policy", "allkeys-lru")
	c := srv.Client(t, nil)
	var ev memoryEvents
	p := newPipeliner(t, c, Config{StallThreshold: testStall, MemoryEvery: 50 * time.Millisecond, OnMemory: ev.on})
	first := ev.wait(t, "the first reading", func(e MemoryEvent) bool { return e.First })
	if m := first.Memory; m.Policy != "allkeys-lru" || m.MaxMemory != 3<<20 || !m.MayEvict() || m.Evicted != 0 || m.Used == 0 {
		t.Errorf("first reading %+v, want allkeys-lru, 3 MiB, may evict, nothing evicted yet", m)
	}
	fill(t, c, redistest.Prefix(t), 60, 100_000)
	e := ev.wait(t, "evictions", func(e MemoryEvent) bool { return e.EvictedSince > 0 })
	t.Logf("evictions reported: %+v", e)
	if st := p.Servers(); len(st) != 1 || st[0].Memory.Evicted == 0 {
		t.Errorf("Servers() = %+v, want the server's evicted keys", st)
	}
}

// TestOutOfMemory: with noeviction and its maxmemory reached, the server
// answers every call that writes OOM; each call fails at once with that
// reply, sent once (no retry), the server stays up, and is reported out
// of memory.
func TestOutOfMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	fill(t, c, prefix+"filler:", 20, 100_000)
	used := redistest.InfoMemory(t, c)["used_memory"]
	if err := c.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used-100_000, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	var ev memoryEvents
	p := newPipeliner(t, c, Config{StallThreshold: testStall, Bound: 100 * time.Millisecond, OnMemory: ev.on})
	before := redistest.ErrorStats(t, c)["OOM"]
	const calls = 200
	var wg sync.WaitGroup
	var mu sync.Mutex
	oom, worst := 0, time.Duration(0)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := p.RunBy(ctx, start.Add(100*time.Millisecond), decide, []string{prefix + strconv.Itoa(i)}, decideArgs...)
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			worst = max(worst, took)
			if IsOutOfMemory(err) {
				oom++
			} else {
				t.Errorf("call %d: %v, want an OOM reply", i, err)
			}
		}()
	}
	wg.Wait()
	sent := redistest.ErrorStats(t, c)["OOM"] - before
	t.Logf("%d calls: %d OOM, the server sent %d OOM replies; the slowest call took %v", calls, oom, sent, worst)
	if sent > calls {
		t.Errorf("the server sent %d OOM replies to %d calls: calls were sent again", sent, calls)
	}
	st := p.Servers()
	if len(st) != 1 || !st[0].Up || !st[0].OutOfMemory {
		t.Errorf("Servers() = %+v, want the server up and out of memory", st)
	}
	ev.wait(t, "out of memory", func(e MemoryEvent) bool { return e.OutOfMemory })
	// Memory freed: the next calls are decided.
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := runDecide(ctx, p, prefix+"after"); err != nil {
		t.Errorf("with memory freed: %v", err)
	}
}

// TestMemoryFallback: where INFO is refused (an ACL without it, as some
// managed services have), the policy is read with CONFIG GET; where both
// are, the reading says why.
func TestMemoryFallback(t *testing.T) {
	t.Parallel()
	srv := redistest.StandaloneWith(t, "--maxmemory", "64mb", "--maxmemory-policy", "volatile-lru")
	admin := srv.Client(t, nil)
	ctx := context.Background()
	for _, tt := range []struct {
		user, acl  string
		wantPolicy string
		wantErr    bool
	}{
		{"noinfo", "-info", "volatile-lru", false},
		{"neither", "-info -config", "", true},
	} {
		args := []any{"ACL", "SETUSER", tt.user, "on", ">pw", "~*", "&*", "+@all"}
		for _, a := range strings.Fields(tt.acl) {
			args = append(args, a)
		}
		if err := admin.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
		c := srv.Client(t, &redis.Options{Username: tt.user, Password: "pw"})
		m, ok := readMemory(ctx, c)
		if !ok || m.Policy != tt.wantPolicy || (m.Err != nil) != tt.wantErr || m.Evicted != -1 {
			t.Errorf("%s: %+v, %v; want policy %q, an error %v, evictions unknown", tt.user, m, ok, tt.wantPolicy, tt.wantErr)
		}
		if tt.wantPolicy != "" && (m.MaxMemory != 64<<20 || !m.MayEvict()) {
			t.Errorf("%s: %+v, want 64 MiB and may evict", tt.user, m)
		}
	}
}
