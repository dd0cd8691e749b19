package outbound

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/ratefields"
	"github.com/sluicehq/sluice/middleware"
)

// TestLower: announced quotas lower the limits they bind, scaled to the
// limit's window, less the margin.
func TestLower(t *testing.T) {
	t.Parallel()
	perSec := func(n int) middleware.Limit { return middleware.PerSecond(n) }
	pol := func(q int64, w time.Duration) ratefields.Policy {
		return ratefields.Policy{Name: "p", Quota: q, Window: w}
	}
	for _, tc := range []struct {
		name   string
		limits []middleware.Limit
		ps     []ratefields.Policy
		want   []int // Requests after
		units  int
	}{
		{"same quota: the margin alone", []middleware.Limit{perSec(100)}, []ratefields.Policy{pol(100, time.Second)}, []int{99}, 1},
		{"half", []middleware.Limit{perSec(100)}, []ratefields.Policy{pol(50, time.Second)}, []int{49}, 51},
		{"higher: nothing", []middleware.Limit{perSec(100)}, []ratefields.Policy{pol(200, time.Second)}, []int{100}, 0},
		{"a shorter window scales up", []middleware.Limit{middleware.PerMinute(1000)}, []ratefields.Policy{pol(10, time.Second)}, []int{594}, 406},
		{"a longer window binds at its quota", []middleware.Limit{perSec(100)}, []ratefields.Policy{pol(30, time.Hour)}, []int{29}, 71},
		{"no window: nothing", []middleware.Limit{perSec(100)}, []ratefields.Policy{pol(5, 0)}, []int{100}, 0},
		{"never below 1", []middleware.Limit{perSec(100)}, []ratefields.Policy{pol(1, time.Second)}, []int{1}, 99},
		{"the lowest binds; each limit on its own", []middleware.Limit{perSec(100), middleware.PerHour(10000)},
			[]ratefields.Policy{pol(80, time.Second), pol(60, time.Second), pol(20000, time.Hour)}, []int{59, 10000}, 41},
		{"a token bucket's burst follows", []middleware.Limit{perSec(100).TokenBucket(200)}, []ratefields.Policy{pol(50, time.Second)}, []int{49}, 51},
	} {
		got, units := lower(tc.limits, tc.ps)
		for i, l := range got {
			if l.Requests != tc.want[i] || tc.limits[i].Burst > 0 && l.Burst != min(tc.limits[i].Burst, l.Requests) {
				t.Errorf("%s: limit %d = %v, want %d requests", tc.name, i, l, tc.want[i])
			}
		}
		if units != tc.units {
			t.Errorf("%s: lowered by %d units, want %d", tc.name, units, tc.units)
		}
	}
}
