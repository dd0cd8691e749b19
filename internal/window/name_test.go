package window

import (
	"testing"
	"time"
)

// TestWindowName: one name per window, as rules files spell windows and as
// the rate-limit headers name the policies of a rule with several limits.
func TestWindowName(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		l    Limit
		want string
	}{
		{Limit{Window: time.Millisecond}, "1ms"},
		{Limit{Window: 1500 * time.Millisecond}, "1.5s"},
		{Limit{Window: time.Second}, "1s"},
		{Limit{Window: 90 * time.Second}, "1m30s"},
		{Limit{Window: time.Minute}, "1m"},
		{Limit{Window: time.Hour}, "1h"},
		{Limit{Window: 90 * time.Minute}, "1h30m"},
		{Limit{Window: time.Hour + time.Second}, "1h0m1s"},
		{Limit{Window: 36 * time.Hour}, "36h"},
		{Limit{Window: 24 * time.Hour}, "1d"},
		{Limit{Window: 48 * time.Hour}, "2d"},
		{Limit{Window: 7 * 24 * time.Hour}, "1w"},
		{Limit{Window: 14 * 24 * time.Hour}, "2w"},
		{Limit{Window: 10 * 24 * time.Hour}, "10d"},
		{Limit{Window: MaxWindow}, "3660d"},
		{Limit{Window: MaxWindow + time.Millisecond}, "87840h0m0.001s"},
		{Limit{Period: CalendarDay, Algorithm: FixedWindow}, "calendar_day"},
		{Limit{Period: CalendarWeek, Algorithm: FixedWindow, Window: 7 * 24 * time.Hour}, "calendar_week"},
		{Limit{Period: CalendarMonth, Algorithm: FixedWindow}, "calendar_month"},
	} {
		if got := tt.l.WindowName(); got != tt.want {
			t.Errorf("%v: WindowName() = %q, want %q", tt.l, got, tt.want)
		}
	}
}
