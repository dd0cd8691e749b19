package redistest

import (
	"bufio"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// InfoMemory returns the numeric fields of c's INFO memory section, such
// as used_memory and mem_clients_normal.
func InfoMemory(t testing.TB, c redis.Cmdable) map[string]int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil {
			fields[k] = n
		}
	}
	return fields
}

// Usage is what a redis-server has done so far, from INFO commandstats
// and INFO cpu.
type Usage struct {
	// Scripts is how many scripts clients ran (EVALSHA and EVAL).
	Scripts int64
	// Commands is every command run, those that scripts ran included,
	// but for INFO and CONFIG (which tests send to read these figures).
	Commands int64
	// CPU is the server's own CPU time (used_cpu_user + used_cpu_sys).
	CPU time.Duration
}

// Sub returns what the server did between o and u.
func (u Usage) Sub(o Usage) Usage {
	return Usage{Scripts: u.Scripts - o.Scripts, Commands: u.Commands - o.Commands, CPU: u.CPU - o.CPU}
}

// ReadUsage returns the Usage of the server that c talks to.
func ReadUsage(t testing.TB, c *redis.Client) Usage {
	t.Helper()
	s, err := c.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		t.Fatalf("redistest: INFO: %v", err)
	}
	var u Usage
	var cpu float64
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			// cmdstat_hget:calls=2000,usec=440,...
			name, stats, _ := strings.Cut(rest, ":")
			calls, _, _ := strings.Cut(strings.TrimPrefix(stats, "calls="), ",")
			n, err := strconv.ParseInt(calls, 10, 64)
			if err != nil {
				t.Fatalf("redistest: parse %q: %v", line, err)
			}
			switch {
			case name == "info" || strings.HasPrefix(name, "config"):
			case name == "evalsha" || name == "eval":
				u.Scripts += n
				u.Commands += n
			default:
				u.Commands += n
			}
			continue
		}
		k, v, _ := strings.Cut(line, ":")
		if k == "used_cpu_user" || k == "used_cpu_sys" {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("redistest: parse %q: %v", line, err)
			}
			cpu += f
		}
	}
	u.CPU = time.Duration(cpu * float64(time.Second))
	return u
}

// ErrorStats returns how many error replies of each kind (the first word
// of the error: MOVED, ASK, TRYAGAIN, OOM, ...) the server that c talks to
// has sent since it started, from INFO errorstats.
func ErrorStats(t testing.TB, c redis.Cmdable) map[string]int64 {
	t.Helper()
	s, err := c.Info(context.Background(), "errorstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO errorstats: %v", err)
	}
	stats := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		// errorstat_MOVED:count=12
		rest, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "errorstat_")
		if !ok {
			continue
		}
		kind, count, _ := strings.Cut(rest, ":count=")
		n, err := strconv.ParseInt(count, 10, 64)
		if err != nil {
			t.Fatalf("redistest: parse %q: %v", sc.Text(), err)
		}
		stats[kind] = n
	}
	return stats
}
