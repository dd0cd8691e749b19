package redispipe

import (
	"context"
	"testing"
	"time"
)

// TestDirectContext checks the context that bounds the dials of direct
// calls: its deadline lies between 9/10 of the bound and the bound after
// the call, one context serves the calls of a tenth of the bound, and
// closing the Pipeliner ends it.
func TestDirectContext(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	d := &dest{p: &Pipeliner{ctx: ctx, cancel: cancel}}
	const bound = 100 * time.Millisecond
	t0 := time.Now()
	first, dl := d.directContext(t0, bound)
	if want := t0.Add(bound); !dl.Equal(want) {
		t.Fatalf("deadline %s after the call, want %s", dl.Sub(t0), bound)
	}
	if got, ok := first.Deadline(); !ok || !got.Equal(dl) {
		t.Fatalf("the context's deadline is %v (%v), want %v", got, ok, dl)
	}
	for _, tc := range []struct {
		after time.Duration
		same  bool
	}{
		{0, true},
		{5 * time.Millisecond, true},
		{bound / 10, true},
		{bound/10 + time.Millisecond, false},
		{-time.Millisecond, false}, // a clock that went back: the deadline would lie beyond the bound
	} {
		now := t0.Add(tc.after)
		c, dl := d.directContext(now, bound)
		if left := dl.Sub(now); left < bound-bound/10 || left > bound {
			t.Errorf("at %s: deadline %s after the call, want within [%s, %s]", tc.after, left, bound-bound/10, bound)
		}
		if (c == first) != tc.same {
			t.Errorf("at %s: context shared %v, want %v", tc.after, c == first, tc.same)
		}
		// Back to the first context for the next case.
		d.bound.Store(&boundContext{ctx: first, deadline: t0.Add(bound)})
	}
	cancel()
	select {
	case <-first.Done():
	case <-time.After(time.Second):
		t.Fatal("closing the Pipeliner did not end the direct calls' context")
	}
}
