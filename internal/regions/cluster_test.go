package regions

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestDecideCluster decides a sliding window (two keys, one hash slot) on
// a Redis Cluster.
func TestDecideCluster(t *testing.T) {
	c := redistest.Cluster(t)
	pfx := c.Prefix(t)
	s, err := New(Config{Region: "us", Local: c.Client(t, nil)}, 0)
	if err != nil {
		t.Fatal(err)
	}
	ch := Charge{Counter: pfx + "c", Limit: 3, Window: 1000, Sliding: true, Cost: 1}
	var ok int
	for i := int64(0); i < 5; i++ {
		d, err := s.Decide(context.Background(), 5_000+i*10, ch)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			ok++
		}
	}
	if ok != 3 {
		t.Errorf("%d admitted, want 3", ok)
	}
	// Half a window later the previous window weighs half: 1 more fits.
	d, err := s.Decide(context.Background(), 6_500, ch)
	if err != nil || !d.Allowed || d.Total != 1+3/2 {
		t.Errorf("next window: %+v, %v; want admitted with total 2", d, err)
	}
}
