package middleware_test

import (
	"bufio"
	"net"
	"sync"
	"testing"
	"time"
)

// redisLag measures how late redis-servers answer a PING, every 10 ms on
// a connection of its own to each, until the test ends: the servers
// share the machine's cores with the tests, and a server not scheduled
// for 50 ms holds every request it serves that long, which this process's
// scheduling lag (schedlag) does not show. Timing goals allow for both
// (see timingGate).
type redisLag struct {
	mu      sync.Mutex
	worst   time.Duration
	samples []lagSample
	stop    chan struct{}
	wg      sync.WaitGroup
}

// startRedisLag starts pinging the servers at addrs.
func startRedisLag(t *testing.T, addrs ...string) *redisLag {
	l := &redisLag{stop: make(chan struct{})}
	for _, addr := range addrs {
		l.wg.Add(1)
		go l.ping(addr)
	}
	t.Cleanup(l.Stop)
	return l
}

func (l *redisLag) ping(addr string) {
	defer l.wg.Done()
	var conn net.Conn
	var rd *bufio.Reader
	defer func() {
		if conn != nil {
			conn.Close()
		}
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
		}
		if conn == nil {
			c, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				continue // a server killed or not started yet
			}
			conn, rd = c, bufio.NewReader(c)
		}
		start := time.Now()
		_ = conn.SetDeadline(start.Add(time.Second))
		_, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n"))
		if err == nil {
			_, err = rd.ReadString('\n')
		}
		if err != nil {
			conn.Close()
			conn = nil
			continue
		}
		took := time.Since(start)
		l.mu.Lock()
		l.worst = max(l.worst, took)
		l.samples = append(l.samples, lagSample{start, took})
		l.mu.Unlock()
	}
}

// lagSample is a PING sent at at that took took.
type lagSample struct {
	at   time.Time
	took time.Duration
}

// WorstIn returns the longest a PING sent in [from, to) took.
func (l *redisLag) WorstIn(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var w time.Duration
	for _, s := range l.samples {
		if !s.at.Before(from) && s.at.Before(to) {
			w = max(w, s.took)
		}
	}
	return w
}

// Worst returns the longest a PING took so far.
func (l *redisLag) Worst() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.worst
}

// Stop stops the pings; it may be called more than once.
func (l *redisLag) Stop() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// busyGate is timingGate for a test that also measured how late the
// redis-servers answered (redisLag): a missed timing goal only logs if
// this process went unscheduled, or a server answered a PING late, for
// more than grayBusyLag.
func busyGate(t *testing.T, lag, redis time.Duration) func(format string, args ...any) {
	return busyGateAt(t, lag, redis, grayBusyLag)
}

// busyGateAt is busyGate for goals whose margin is redisLimit: a server
// that answered a PING later than that only logs a missed goal.
func busyGateAt(t *testing.T, lag, redis, redisLimit time.Duration) func(format string, args ...any) {
	return func(format string, args ...any) {
		t.Helper()
		if lag > grayBusyLag || redis > redisLimit {
			t.Logf("NOT FAILED, the machine was too busy (this process went unscheduled for up to %v, the redis-servers answered PINGs within %v): "+format,
				append([]any{lag.Round(time.Millisecond), redis.Round(time.Millisecond)}, args...)...)
			return
		}
		t.Errorf(format, args...)
	}
}
