//go:build !race

package denycache

// raceScale divides the records of TestBounded under the race detector.
const raceScale = 1
