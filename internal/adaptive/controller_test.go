package adaptive

import (
	"testing"
	"time"
)

func TestControllerAdmit(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	cpuReads := 0
	c := NewController(Config{Min: 2, Max: 4}, func() float64 { cpuReads++; return 0.1 }, t0)
	// Normal requests are admitted up to the limit (Min, before samples).
	for i := range 2 {
		a := c.Admit(t0, Normal, false)
		if !a.Admitted || a.Refused || a.InFlight != i || a.Threshold != 2 {
			t.Fatalf("request %d: %+v, want admitted with %d in flight below a threshold of 2", i, a, i)
		}
		if i == 0 && !a.Changed {
			t.Fatal("the first admission reported no change: observers would never hear of the limit")
		}
	}
	a := c.Admit(t0, Normal, false)
	if a.Admitted || !a.Refused || a.Threshold != 2 || a.InFlight != 2 {
		t.Fatalf("a third normal request: %+v, want refused at 2 in flight", a)
	}
	// A request that only reports is admitted all the same, and counted.
	if a := c.Admit(t0, Normal, true); !a.Admitted || !a.Refused {
		t.Fatalf("a forced request: %+v, want admitted and refused", a)
	}
	if f := c.Figures(t0); f.InFlight != 3 || f.Limit != 2 {
		t.Fatalf("Figures = %+v, want 3 in flight, limit 2", f)
	}
	// Critical requests go up to Max, whatever the lower priorities' hold.
	if a := c.Admit(t0, Critical, false); !a.Admitted || a.Threshold != 4 {
		t.Fatalf("a critical request: %+v, want admitted below the hard limit of 4", a)
	}
	if a := c.Admit(t0, Critical, false); a.Admitted {
		t.Fatalf("a critical request at the hard limit: %+v, want refused", a)
	}
	for range 4 {
		c.End(t0.Add(time.Millisecond), time.Millisecond, true)
	}
	if f := c.Figures(t0.Add(time.Millisecond)); f.InFlight != 0 {
		t.Fatalf("after every End: %d in flight, want 0", f.InFlight)
	}
	if cpuReads != 1 {
		t.Fatalf("the CPU was read %d times within 1 ms, want once (at most every 100 ms)", cpuReads)
	}
	c.Figures(t0.Add(cpuEvery + time.Millisecond))
	if cpuReads != 2 {
		t.Fatalf("the CPU was read %d times, want twice after 100 ms", cpuReads)
	}
}

func TestControllerStart(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1000, 0)
	c := NewController(Config{Min: 1, Max: 1}, nil, t0)
	// Start counts a request without asking the shedder.
	for range 3 {
		c.Start(t0)
	}
	if f := c.Figures(t0); f.InFlight != 3 {
		t.Fatalf("%d in flight, want 3: Start does not shed", f.InFlight)
	}
	// Over its limit nothing is spare: the figures no longer move, and
	// are not reported again.
	if f, changed := c.Start(t0); changed || f.Spare != 0 {
		t.Fatalf("Start at 4 in flight over a limit of 1: %+v, changed %v; want spare 0, unchanged", f, changed)
	}
}
