package middleware

import (
	"math/rand/v2"
	"runtime"
)

// yieldEvery is how many requests answered without blocking (deny cache
// hits), on average, give the processor up once.
const yieldEvery = 64

// yieldSometimes gives the processor up, once in yieldEvery calls on
// average, to goroutines waiting to run.
//
// A request the deny cache answers never blocks, so goroutines that
// call Decide in a loop (a CPU-bound caller under a flood) run until the
// scheduler preempts them, every 10 ms. Go runs a goroutine woken by the
// network (a Redis store's worker whose reply arrived) after those
// already queued, so under such callers the replies of the store's other
// decisions could wait hundreds of milliseconds to be read, past their
// deadlines: the decisions would fail although Redis answered at once.
// Yielding now and then, at some 2 ns a call on average, bounds that wait
// to the callers' turns of a few microseconds each.
func yieldSometimes() {
	if rand.Uint32()%yieldEvery == 0 {
		runtime.Gosched()
	}
}
