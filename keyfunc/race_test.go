//go:build race

package keyfunc

// raceEnabled reports whether the race detector is on. Under it, sync.Pool
// drops items at random, so allocation counts of pooled code vary.
const raceEnabled = true
