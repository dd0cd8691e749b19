// Package schedlag measures how late a test process's goroutines get to
// run, for tests whose time bounds must allow for a busy machine: the
// test binaries of a suite share a few cores, and a timer that fires
// 30 ms late says nothing of the code under test.
//
// A Log sleeps 1 ms at a time and records each oversleep of more than
// 1 ms, with when it ended.
package schedlag

import (
	"sync"
	"testing"
	"time"
)

// Log is the record of one sampler. Its methods are safe for concurrent
// use.
type Log struct {
	mu      sync.Mutex
	samples []sample
	worst   time.Duration

	done, stopped chan struct{}
	once          sync.Once
}

type sample struct {
	woke time.Time
	lag  time.Duration
}

// Start starts a sampler that runs until Stop is called or tb ends.
func Start(tb testing.TB) *Log {
	l := &Log{done: make(chan struct{}), stopped: make(chan struct{})}
	go l.run()
	tb.Cleanup(l.Stop)
	return l
}

func (l *Log) run() {
	defer close(l.stopped)
	for {
		select {
		case <-l.done:
			return
		default:
		}
		t0 := time.Now()
		time.Sleep(time.Millisecond)
		woke := time.Now()
		if lag := woke.Sub(t0) - time.Millisecond; lag > time.Millisecond {
			l.mu.Lock()
			l.samples = append(l.samples, sample{woke, lag})
			l.worst = max(l.worst, lag)
			l.mu.Unlock()
		}
	}
}

// Stop stops the sampler and waits for it; it may be called more than
// once.
func (l *Log) Stop() {
	l.once.Do(func() {
		close(l.done)
		<-l.stopped
	})
}

// Max returns the longest lag recorded so far.
func (l *Log) Max() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.worst
}

// Worst returns the longest lag of a sleep that overlapped [from, to].
func (l *Log) Worst(from, to time.Time) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var w time.Duration
	for _, s := range l.samples {
		if !s.woke.Before(from) && !s.woke.Add(-s.lag-time.Millisecond).After(to) {
			w = max(w, s.lag)
		}
	}
	return w
}
