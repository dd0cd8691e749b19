package schedlag

import (
	"runtime"
	"sync"
	"testing"
	"time"
)

// TestWorst checks which recorded oversleeps a window sees: those whose
// sleep overlapped it, and no others.
func TestWorst(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	l := &Log{samples: []sample{
		{t0.Add(10 * ms), 3 * ms},  // slept over [6 ms, 10 ms]
		{t0.Add(50 * ms), 20 * ms}, // slept over [29 ms, 50 ms]
		{t0.Add(100 * ms), 5 * ms}, // slept over [94 ms, 100 ms]
	}}
	for _, tt := range []struct {
		from, to time.Duration
		want     time.Duration
	}{
		{0, 5 * ms, 0},
		{0, 6 * ms, 3 * ms},
		{11 * ms, 28 * ms, 0},
		{11 * ms, 29 * ms, 20 * ms},
		{40 * ms, 45 * ms, 20 * ms},
		{50 * ms, 200 * ms, 20 * ms},
		{51 * ms, 200 * ms, 5 * ms},
		{101 * ms, 200 * ms, 0},
		{0, time.Second, 20 * ms},
	} {
		if got := l.Worst(t0.Add(tt.from), t0.Add(tt.to)); got != tt.want {
			t.Errorf("Worst(%v, %v) = %v, want %v", tt.from, tt.to, got, tt.want)
		}
	}
}

// TestStartStop keeps every P busy for a while, so that the sampler's
// sleeps end late, and checks that the lag is recorded and that Stop
// stops the sampler.
func TestStartStop(t *testing.T) {
	l := Start(t)
	time.Sleep(5 * time.Millisecond)
	var wg sync.WaitGroup
	end := time.Now().Add(60 * time.Millisecond)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
			}
		}()
	}
	wg.Wait()
	time.Sleep(5 * time.Millisecond)
	if w := l.Max(); w < 2*time.Millisecond {
		t.Errorf("Max = %v after 60 ms with every P busy, want at least 2ms", w)
	}
	if w := l.Worst(end.Add(-60*time.Millisecond), end); w != l.Max() {
		t.Errorf("Worst over the busy time = %v, want Max %v", w, l.Max())
	}
	l.Stop()
	l.Stop() // a second Stop returns at once
	l.mu.Lock()
	n := len(l.samples)
	l.mu.Unlock()
	time.Sleep(10 * time.Millisecond)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) != n {
		t.Errorf("the sampler kept recording after Stop")
	}
}
