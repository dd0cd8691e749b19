package fleet

import (
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// ApplyCase is one row of the table that Apply and its Lua twin
// (fleet.lua) are both checked against.
type ApplyCase struct {
	Name   string
	Limit  window.Limit
	Stored window.State
	Delta  Delta
	Now    int64
	Want   window.State
}

// GrantCase is one row of the table that Grant and its Lua twin are both
// checked against.
type GrantCase struct {
	Name                  string
	Limit                 window.Limit
	Stored                window.State
	Now, Want, Give, From int64
	Servers               int64
	WantState             window.State
	Granted               int64
}

func calendarDay() window.Limit {
	return window.Limit{Requests: 10, Algorithm: window.FixedWindow, Period: window.CalendarDay}
}

// ApplyCases returns the shared table of Apply.
func ApplyCases() []ApplyCase {
	s := window.Limit{Requests: 10, Window: time.Second}
	f := window.Limit{Requests: 10, Window: time.Second, Algorithm: window.FixedWindow}
	tb := window.Limit{Requests: 10, Window: time.Second, Algorithm: window.TokenBucket}
	day := calendarDay()
	const d0 = 1_700_006_400_000 // a UTC midnight
	return []ApplyCase{
		{"sliding empty takes the delta's windows", s, window.State{}, Delta{Start: 1000, Curr: 3}, 1500, window.State{Start: 1000, Curr: 3}},
		{"sliding empty, delta one window old", s, window.State{}, Delta{Start: 1000, Prev: 2, Curr: 3}, 2500, window.State{Start: 2000, Prev: 3}},
		{"sliding empty, delta too old", s, window.State{}, Delta{Start: 1000, Curr: 3}, 3000, window.State{Start: 3000}},
		{"sliding same window", s, window.State{Start: 1000, Prev: 1, Curr: 4}, Delta{Start: 1000, Prev: 2, Curr: 3}, 1500, window.State{Start: 1000, Prev: 3, Curr: 7}},
		{"sliding other anchor, later", s, window.State{Start: 1200, Curr: 4}, Delta{Start: 1000, Curr: 3}, 1500, window.State{Start: 1200, Curr: 7}},
		{"sliding other anchor, earlier", s, window.State{Start: 1200, Prev: 1, Curr: 4}, Delta{Start: 1600, Prev: 2, Curr: 3}, 1700, window.State{Start: 1200, Prev: 1, Curr: 9}},
		{"sliding delta lands in prev after roll", s, window.State{Start: 1000, Curr: 4}, Delta{Start: 1000, Curr: 3}, 2100, window.State{Start: 2000, Prev: 7}},
		{"sliding delta prev dropped", s, window.State{Start: 3000, Curr: 4}, Delta{Start: 2000, Prev: 5, Curr: 3}, 3100, window.State{Start: 3000, Prev: 3, Curr: 4}},
		{"sliding clock behind the delta", s, window.State{}, Delta{Start: 5000, Curr: 2}, 4990, window.State{Start: 5000, Curr: 2}},
		{"fixed same window", f, window.State{Start: 1000, Curr: 4}, Delta{Start: 1000, Curr: 3}, 1500, window.State{Start: 1000, Curr: 7}},
		{"fixed empty", f, window.State{}, Delta{Start: 1000, Curr: 3}, 1500, window.State{Start: 1000, Curr: 3}},
		{"fixed ended window dropped", f, window.State{Start: 1000, Curr: 4}, Delta{Start: 1000, Curr: 3}, 2100, window.State{Start: 2000}},
		{"calendar day", day, window.State{Start: d0, Curr: 4}, Delta{Start: d0, Curr: 3}, d0 + 3_600_000, window.State{Start: d0, Curr: 7}},
		{"calendar day ended", day, window.State{Start: d0, Curr: 4}, Delta{Start: d0, Curr: 3}, d0 + 86_400_000 + 5, window.State{Start: d0 + 86_400_000}},
		{"token adds tokens", tb, window.State{Start: 1000, Prev: 1, Curr: 2000}, Delta{Curr: 3}, 1000, window.State{Start: 1000, Prev: 1, Curr: 5000}},
		{"token refills first", tb, window.State{Start: 1000, Prev: 1, Curr: 2000}, Delta{Curr: 1}, 1100, window.State{Start: 1100, Prev: 1, Curr: 2000}},
		{"token empty", tb, window.State{}, Delta{Curr: 4}, 1000, window.State{Start: 1000, Prev: 1, Curr: 4000}},
	}
}

// GrantCases returns the shared table of Grant.
func GrantCases() []GrantCase {
	s := window.Limit{Requests: 100, Window: time.Second}
	f := window.Limit{Requests: 100, Window: time.Second, Algorithm: window.FixedWindow}
	tb := window.Limit{Requests: 100, Window: time.Second, Algorithm: window.TokenBucket}
	day := calendarDay()
	day.Requests = 100
	const d0 = 1_700_006_400_000
	return []GrantCase{
		{"sliding fresh", s, window.State{}, 1000, 20, 0, 0, 1, window.State{Start: 1000, Curr: 20}, 20},
		{"sliding shares among servers", s, window.State{Start: 1000, Curr: 60}, 1500, 20, 0, 0, 4, window.State{Start: 1000, Curr: 65}, 5},
		{"sliding near the limit", s, window.State{Start: 1000, Curr: 99}, 1500, 20, 0, 0, 4, window.State{Start: 1000, Curr: 100}, 1},
		{"sliding full", s, window.State{Start: 1000, Curr: 100}, 1500, 20, 0, 0, 4, window.State{Start: 1000, Curr: 100}, 0},
		{"sliding previous window weighs", s, window.State{Start: 1000, Prev: 0, Curr: 80}, 2500, 50, 0, 0, 1, window.State{Start: 2000, Prev: 80, Curr: 30}, 30},
		{"sliding give back in the window", s, window.State{Start: 1000, Curr: 100}, 1500, 10, 30, 1000, 1, window.State{Start: 1000, Curr: 80}, 10},
		{"sliding give back to prev", s, window.State{Start: 1000, Curr: 100}, 2000, 0, 30, 1000, 1, window.State{Start: 2000, Prev: 70}, 0},
		{"sliding give back of an ended window", s, window.State{Start: 1000, Curr: 100}, 3500, 0, 30, 1000, 1, window.State{Start: 3500}, 0},
		{"fixed", f, window.State{Start: 1000, Curr: 90}, 1500, 20, 0, 0, 1, window.State{Start: 1000, Curr: 95}, 5},
		{"fixed give back", f, window.State{Start: 1000, Curr: 90}, 1500, 0, 40, 1000, 1, window.State{Start: 1000, Curr: 50}, 0},
		{"fixed give back of another window", f, window.State{Start: 1000, Curr: 90}, 2500, 0, 40, 1000, 1, window.State{Start: 2000}, 0},
		{"calendar", day, window.State{Start: d0, Curr: 10}, d0 + 1000, 200, 0, 0, 2, window.State{Start: d0, Curr: 32}, 22},
		{"token", tb, window.State{}, 1000, 30, 0, 0, 1, window.State{Start: 1000, Prev: 1, Curr: 30000}, 30},
		{"token give back", tb, window.State{Start: 1000, Prev: 1, Curr: 30000}, 1000, 0, 10, 0, 1, window.State{Start: 1000, Prev: 1, Curr: 20000}, 0},
		{"token nearly empty", tb, window.State{Start: 1000, Prev: 1, Curr: 99000}, 1000, 30, 0, 0, 3, window.State{Start: 1000, Prev: 1, Curr: 100000}, 1},
		// Debts that settles left: nothing is leased while they weigh.
		{"sliding previous window in debt", s, window.State{Start: 1000, Curr: 500}, 2500, 20, 0, 0, 1, window.State{Start: 2000, Prev: 500}, 0},
		{"sliding debt decayed late in the window", s, window.State{Start: 1000, Curr: 500}, 2900, 20, 0, 0, 1, window.State{Start: 2000, Prev: 500, Curr: 20}, 20},
		{"sliding current window in debt", s, window.State{Start: 1000, Curr: 130}, 1500, 20, 0, 0, 1, window.State{Start: 1000, Curr: 130}, 0},
		{"token in debt, owes its burst and a token at most", tb, window.State{Start: 1000, Prev: 1, Curr: 250000}, 1000, 30, 0, 0, 1, window.State{Start: 1000, Prev: 1, Curr: 202000}, 0},
	}
}
