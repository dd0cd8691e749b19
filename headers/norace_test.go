//go:build !race

package headers

const raceEnabled = false
