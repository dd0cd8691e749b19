//go:build race

package memstore

// memScale divides the memory tests' keys under the race detector (see
// memKeys).
const memScale = 4
