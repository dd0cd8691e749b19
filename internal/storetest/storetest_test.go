package storetest

import "testing"

// TestModel runs the suite against the reference store, which checks the
// hand-worked tables against package window.
func TestModel(t *testing.T) {
	t.Parallel()
	Run(t, func(*testing.T) Store { return new(Model) })
}
