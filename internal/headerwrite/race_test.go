//go:build race

package headerwrite

const raceEnabled = true
