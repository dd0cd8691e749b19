package memstore_test

import (
	"testing"

	"github.com/sluicehq/sluice/internal/memstore"
	"github.com/sluicehq/sluice/internal/storetest"
)

// TestConformance runs the suite that every store passes, so that the
// memory store answers exactly as the Redis store does.
func TestConformance(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Store {
		s, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestRefund checks Refund against window.Refund on the suite's table.
func TestRefund(t *testing.T) {
	t.Parallel()
	storetest.RunRefund(t, func(t *testing.T) storetest.Refunder {
		s, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}

// TestSettle checks Settle against window.SettleAll on the suite's table.
func TestSettle(t *testing.T) {
	t.Parallel()
	storetest.RunSettle(t, func(t *testing.T) storetest.Settler {
		s, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
