package window

import (
	"fmt"
	"testing"
	"time"
)

// TestFixedWindowTable: 3 per minute, windows aligned to the epoch minute,
// used at the end of one window and the start of the next.
func TestFixedWindowTable(t *testing.T) {
	t.Parallel()
	l := Limit{Requests: 3, Window: time.Minute, Algorithm: FixedWindow}
	m10, m11, m13, m14 := 10*minute, 11*minute, 13*minute, 14*minute
	runSteps(t, l, []step{
		// 10 s before the window [10m, 11m) ends.
		{"first", m10 + 50*sec, 1, true,
			Decision{Allowed: true, Remaining: 2, ResetAfter: 10 * time.Second, NextAfter: 10 * time.Second},
			State{Start: m10, Curr: 1}},
		{"second", m10 + 51*sec, 1, true,
			Decision{Allowed: true, Remaining: 1, ResetAfter: 9 * time.Second, NextAfter: 9 * time.Second},
			State{Start: m10, Curr: 2}},
		// 2 + 2 > 3: retry when the window renews, 8 s on; one unit fits
		// now.
		{"cost 2 denied", m10 + 52*sec, 2, false,
			Decision{Remaining: 1, ResetAfter: 8 * time.Second, RetryAfter: 8 * time.Second},
			State{Start: m10, Curr: 2}},
		{"third", m10 + 52*sec, 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 8 * time.Second, NextAfter: 8 * time.Second},
			State{Start: m10, Curr: 3}},
		{"last ms of the window", m11 - 1, 1, false,
			Decision{ResetAfter: ms, RetryAfter: ms, NextAfter: ms},
			State{Start: m10, Curr: 3}},
		{"cost above the limit", m11 - 1, 4, false,
			Decision{ResetAfter: ms, RetryAfter: -1, NextAfter: ms},
			State{Start: m10, Curr: 3}},
		// The next window: 3 more, 6 within 10.001 s.
		{"renewed", m11, 3, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: time.Minute, NextAfter: time.Minute},
			State{Start: m11, Curr: 3}},
		{"read when full", m11 + 30*sec, 0, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: 30 * time.Second, NextAfter: 30 * time.Second},
			State{Start: m11, Curr: 3}},
		// Two windows on: afresh, in the window of now.
		{"later", m13 + 5*sec, 1, true,
			Decision{Allowed: true, Remaining: 2, ResetAfter: 55 * time.Second, NextAfter: 55 * time.Second},
			State{Start: m13, Curr: 1}},
		{"cost above the limit, one unit fits", m13 + 5*sec, 4, false,
			Decision{Remaining: 2, ResetAfter: 55 * time.Second, RetryAfter: -1},
			State{Start: m13, Curr: 1}},
		{"read of an empty window", m14, 0, true,
			Decision{Allowed: true, Remaining: 3},
			State{Start: m14}},
	})
}

// TestFixedWindowExact checks RetryAfter, NextAfter and ResetAfter to the
// millisecond on random clients of epoch-aligned and calendar limits.
func TestFixedWindowExact(t *testing.T) {
	t.Parallel()
	paris, ny := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/New_York")
	santiago, amman := mustLoad(t, "America/Santiago"), mustLoad(t, "Asia/Amman")
	fixed := func(n int, w time.Duration) Limit { return Limit{Requests: n, Window: w, Algorithm: FixedWindow} }
	checkRandomWalks(t, []Limit{
		fixed(3, time.Minute), fixed(1, 10*time.Millisecond), fixed(7, 300*time.Millisecond), fixed(100, time.Second),
		fixed(2000, time.Second), fixed(5, 2*time.Second), fixed(MaxRequests/4, 3600*time.Millisecond), fixed(3, MaxWindow),
	}, []int64{0, 137, 1_700_000_000_731}, 400)
	// Calendar periods, from a few days before daylight-saving changes.
	calendar := func(p Period, loc *time.Location) Limit {
		return Limit{Requests: 5, Algorithm: FixedWindow, Period: p, Location: loc}
	}
	checkRandomWalks(t, []Limit{
		calendar(CalendarDay, paris), calendar(CalendarWeek, paris), calendar(CalendarMonth, ny), calendar(CalendarDay, ny),
		calendar(CalendarDay, santiago), calendar(CalendarDay, amman), calendar(CalendarMonth, nil),
	}, []int64{
		time.Date(2024, 3, 27, 0, 0, 0, 0, time.UTC).UnixMilli(),
		time.Date(2024, 10, 24, 17, 0, 0, 0, time.UTC).UnixMilli(),
		time.Date(2021, 9, 3, 0, 0, 0, 0, time.UTC).UnixMilli(),
	}, 150)
}

// TestFixedWindowBounds hammers fixed windows with several clients and
// start phases: every window admits at most the limit, and exactly the
// limit for a greedy client; an interval of one window admits at most
// twice the limit, which a greedy client reaches whenever it starts
// anywhere but at a window's start.
func TestFixedWindowBounds(t *testing.T) {
	t.Parallel()
	fixed := func(n int, w time.Duration) Limit { return Limit{Requests: n, Window: w, Algorithm: FixedWindow} }
	for _, l := range []Limit{fixed(3, 100*time.Millisecond), fixed(10, time.Second), fixed(1, 10*time.Millisecond), fixed(7, 300*time.Millisecond), fixed(100, time.Second)} {
		for _, start := range []int64{0, 1, 137, 999_999_999_999, 1_700_000_000_731} {
			t.Run(fmt.Sprintf("%v from %d", l, start), func(t *testing.T) {
				t.Parallel()
				w, n := l.Window.Milliseconds(), int64(l.Requests)
				end := start + 6*w
				for name, ad := range clients(l, start, end, false) {
					for k := start - start%w; k < end; k += w {
						got := countIn(ad, k, k+w)
						if got > n || name == "greedy" && got != n {
							t.Errorf("%s: window at %d admitted %d, limit %d", name, k, got, n)
						}
					}
					most := mostIn(ad, w)
					if most > 2*n {
						t.Errorf("%s: %d admitted in an interval of one window, want at most %d", name, most, 2*n)
					}
					if name != "greedy" {
						continue
					}
					if want := map[bool]int64{true: n, false: 2 * n}[start%w == 0]; most != want {
						t.Errorf("greedy: %d admitted in an interval of one window, want %d", most, want)
					}
				}
			})
		}
	}
}

func TestCalendarBounds(t *testing.T) {
	t.Parallel()
	paris, ny := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/New_York")
	santiago, azores := mustLoad(t, "America/Santiago"), mustLoad(t, "Atlantic/Azores")
	havana, amman := mustLoad(t, "America/Havana"), mustLoad(t, "Asia/Amman")
	apia := mustLoad(t, "Pacific/Apia")
	date := func(loc *time.Location, y int, m time.Month, d, h, min int) time.Time {
		return time.Date(y, m, d, h, min, 0, 0, loc)
	}
	utc := time.UTC
	tests := []struct {
		name       string
		p          Period
		at         time.Time
		start, end time.Time // the window's first instant, and the next one's
		length     time.Duration
	}{
		// UTC.
		{"day", CalendarDay, date(utc, 2024, 2, 29, 13, 0), date(utc, 2024, 2, 29, 0, 0), date(utc, 2024, 3, 1, 0, 0), 24 * time.Hour},
		{"week from Thursday", CalendarWeek, date(utc, 2024, 2, 29, 13, 0), date(utc, 2024, 2, 26, 0, 0), date(utc, 2024, 3, 4, 0, 0), 7 * day},
		{"week from Sunday", CalendarWeek, date(utc, 2024, 3, 3, 23, 59), date(utc, 2024, 2, 26, 0, 0), date(utc, 2024, 3, 4, 0, 0), 7 * day},
		{"week from Monday", CalendarWeek, date(utc, 2024, 3, 4, 0, 0), date(utc, 2024, 3, 4, 0, 0), date(utc, 2024, 3, 11, 0, 0), 7 * day},
		{"week across a year", CalendarWeek, date(utc, 2025, 1, 1, 8, 0), date(utc, 2024, 12, 30, 0, 0), date(utc, 2025, 1, 6, 0, 0), 7 * day},
		{"February, leap year", CalendarMonth, date(utc, 2024, 2, 10, 0, 0), date(utc, 2024, 2, 1, 0, 0), date(utc, 2024, 3, 1, 0, 0), 29 * day},
		{"February", CalendarMonth, date(utc, 2023, 2, 28, 23, 59), date(utc, 2023, 2, 1, 0, 0), date(utc, 2023, 3, 1, 0, 0), 28 * day},
		{"April", CalendarMonth, date(utc, 2024, 4, 1, 0, 0), date(utc, 2024, 4, 1, 0, 0), date(utc, 2024, 5, 1, 0, 0), 30 * day},
		{"January", CalendarMonth, date(utc, 2024, 1, 31, 12, 0), date(utc, 2024, 1, 1, 0, 0), date(utc, 2024, 2, 1, 0, 0), 31 * day},
		{"December", CalendarMonth, date(utc, 2024, 12, 31, 23, 59), date(utc, 2024, 12, 1, 0, 0), date(utc, 2025, 1, 1, 0, 0), 31 * day},
		// Paris: summer time from 2024-03-31 02:00 to 2024-10-27 03:00.
		{"Paris day", CalendarDay, date(paris, 2024, 7, 14, 12, 0), date(paris, 2024, 7, 14, 0, 0), date(paris, 2024, 7, 15, 0, 0), 24 * time.Hour},
		{"Paris 23h day", CalendarDay, date(paris, 2024, 3, 31, 12, 0), date(paris, 2024, 3, 31, 0, 0), date(paris, 2024, 4, 1, 0, 0), 23 * time.Hour},
		{"Paris 25h day", CalendarDay, date(paris, 2024, 10, 27, 2, 30), date(paris, 2024, 10, 27, 0, 0), date(paris, 2024, 10, 28, 0, 0), 25 * time.Hour},
		{"Paris day before", CalendarDay, date(paris, 2024, 3, 30, 23, 59), date(paris, 2024, 3, 30, 0, 0), date(paris, 2024, 3, 31, 0, 0), 24 * time.Hour},
		{"Paris short week", CalendarWeek, date(paris, 2024, 3, 27, 9, 0), date(paris, 2024, 3, 25, 0, 0), date(paris, 2024, 4, 1, 0, 0), 7*day - time.Hour},
		{"Paris long week", CalendarWeek, date(paris, 2024, 10, 27, 23, 0), date(paris, 2024, 10, 21, 0, 0), date(paris, 2024, 10, 28, 0, 0), 7*day + time.Hour},
		{"Paris March", CalendarMonth, date(paris, 2024, 3, 31, 23, 59), date(paris, 2024, 3, 1, 0, 0), date(paris, 2024, 4, 1, 0, 0), 31*day - time.Hour},
		{"Paris October", CalendarMonth, date(paris, 2024, 10, 1, 0, 0), date(paris, 2024, 10, 1, 0, 0), date(paris, 2024, 11, 1, 0, 0), 31*day + time.Hour},
		{"Paris February", CalendarMonth, date(paris, 2024, 2, 29, 23, 59), date(paris, 2024, 2, 1, 0, 0), date(paris, 2024, 3, 1, 0, 0), 29 * day},
		{"Paris April", CalendarMonth, date(paris, 2024, 4, 15, 0, 0), date(paris, 2024, 4, 1, 0, 0), date(paris, 2024, 5, 1, 0, 0), 30 * day},
		// New York: daylight time from 2024-03-10 02:00 to 2024-11-03 02:00.
		{"New York 23h day", CalendarDay, date(ny, 2024, 3, 10, 3, 0), date(ny, 2024, 3, 10, 0, 0), date(ny, 2024, 3, 11, 0, 0), 23 * time.Hour},
		{"New York 25h day, first 1:30", CalendarDay, time.Date(2024, 11, 3, 5, 30, 0, 0, utc).In(ny), date(ny, 2024, 11, 3, 0, 0), date(ny, 2024, 11, 4, 0, 0), 25 * time.Hour},
		{"New York 25h day, second 1:30", CalendarDay, time.Date(2024, 11, 3, 6, 30, 0, 0, utc).In(ny), date(ny, 2024, 11, 3, 0, 0), date(ny, 2024, 11, 4, 0, 0), 25 * time.Hour},
		{"New York short week", CalendarWeek, date(ny, 2024, 3, 10, 23, 0), date(ny, 2024, 3, 4, 0, 0), date(ny, 2024, 3, 11, 0, 0), 7*day - time.Hour},
		{"New York long week", CalendarWeek, date(ny, 2024, 10, 28, 0, 0), date(ny, 2024, 10, 28, 0, 0), date(ny, 2024, 11, 4, 0, 0), 7*day + time.Hour},
		{"New York March", CalendarMonth, date(ny, 2024, 3, 10, 12, 0), date(ny, 2024, 3, 1, 0, 0), date(ny, 2024, 4, 1, 0, 0), 31*day - time.Hour},
		{"New York November", CalendarMonth, date(ny, 2024, 11, 30, 23, 0), date(ny, 2024, 11, 1, 0, 0), date(ny, 2024, 12, 1, 0, 0), 30*day + time.Hour},
		{"New York February", CalendarMonth, date(ny, 2023, 2, 14, 0, 0), date(ny, 2023, 2, 1, 0, 0), date(ny, 2023, 3, 1, 0, 0), 28 * day},
		// Midnights that do not exist: Santiago moves from 00:00 -04 to
		// 01:00 -03 on 2024-09-08, Azores from 00:00 -01 to 01:00 +00 on
		// 2024-03-31, Havana from 00:00 CST to 01:00 CDT on 2024-03-10.
		// The day before keeps its 24 hours; the day itself starts at 01:00.
		{"Santiago day before a skipped midnight", CalendarDay, date(santiago, 2024, 9, 7, 23, 30), date(santiago, 2024, 9, 7, 0, 0), time.Date(2024, 9, 8, 4, 0, 0, 0, utc), 24 * time.Hour},
		{"Santiago day without midnight", CalendarDay, time.Date(2024, 9, 8, 4, 0, 0, 0, utc).In(santiago), time.Date(2024, 9, 8, 4, 0, 0, 0, utc), date(santiago, 2024, 9, 9, 0, 0), 23 * time.Hour},
		{"Santiago month", CalendarMonth, date(santiago, 2024, 9, 20, 0, 0), date(santiago, 2024, 9, 1, 0, 0), date(santiago, 2024, 10, 1, 0, 0), 30*day - time.Hour},
		{"Azores day before a skipped midnight", CalendarDay, date(azores, 2024, 3, 30, 23, 59), date(azores, 2024, 3, 30, 0, 0), time.Date(2024, 3, 31, 1, 0, 0, 0, utc), 24 * time.Hour},
		{"Azores week", CalendarWeek, date(azores, 2024, 3, 31, 12, 0), date(azores, 2024, 3, 25, 0, 0), date(azores, 2024, 4, 1, 0, 0), 7*day - time.Hour},
		{"Havana day before a skipped midnight", CalendarDay, date(havana, 2024, 3, 9, 23, 30), date(havana, 2024, 3, 9, 0, 0), time.Date(2024, 3, 10, 5, 0, 0, 0, utc), 24 * time.Hour},
		// Midnights shown twice: Havana goes back from 01:00 CDT to 00:00
		// CST on 2024-11-03, Amman from 01:00 EEST to 00:00 EET on
		// 2021-10-29. The day starts at the first.
		{"Havana day with two midnights", CalendarDay, time.Date(2024, 11, 3, 4, 30, 0, 0, utc).In(havana), time.Date(2024, 11, 3, 4, 0, 0, 0, utc), date(havana, 2024, 11, 4, 0, 0), 25 * time.Hour},
		{"Amman day with two midnights, first", CalendarDay, time.Date(2021, 10, 28, 21, 30, 0, 0, utc).In(amman), time.Date(2021, 10, 28, 21, 0, 0, 0, utc), date(amman, 2021, 10, 30, 0, 0), 25 * time.Hour},
		{"Amman day with two midnights, second", CalendarDay, time.Date(2021, 10, 28, 22, 30, 0, 0, utc).In(amman), time.Date(2021, 10, 28, 21, 0, 0, 0, utc), date(amman, 2021, 10, 30, 0, 0), 25 * time.Hour},
		{"Amman day before", CalendarDay, time.Date(2021, 10, 28, 20, 59, 0, 0, utc).In(amman), date(amman, 2021, 10, 28, 0, 0), time.Date(2021, 10, 28, 21, 0, 0, 0, utc), 24 * time.Hour},
		// Apia skipped 2011-12-30 entirely, from 23:59:59 -10 on the 29th to
		// 00:00 +14 on the 31st.
		{"Apia day before a skipped day", CalendarDay, date(apia, 2011, 12, 29, 12, 0), date(apia, 2011, 12, 29, 0, 0), date(apia, 2011, 12, 31, 0, 0), 24 * time.Hour},
		{"Apia day after a skipped day", CalendarDay, date(apia, 2011, 12, 31, 0, 0), date(apia, 2011, 12, 31, 0, 0), date(apia, 2012, 1, 1, 0, 0), 24 * time.Hour},
	}
	for _, tt := range tests {
		l := Limit{Requests: 1, Algorithm: FixedWindow, Period: tt.p, Location: tt.at.Location()}
		at, start, end := tt.at.UnixMilli(), tt.start.UnixMilli(), tt.end.UnixMilli()
		s, e := l.Bounds(at)
		if s != start || e != end {
			t.Errorf("%s: Bounds(%v) = [%v, %v), want [%v, %v)", tt.name, tt.at, time.UnixMilli(s).In(tt.at.Location()), time.UnixMilli(e).In(tt.at.Location()), tt.start, tt.end)
			continue
		}
		if got := time.Duration(e-s) * time.Millisecond; got != tt.length {
			t.Errorf("%s: window of %v, want %v", tt.name, got, tt.length)
		}
		for _, x := range []int64{start, end - 1} {
			if s2, e2 := l.Bounds(x); s2 != s || e2 != e {
				t.Errorf("%s: Bounds(%d) = [%d, %d), want the same window [%d, %d)", tt.name, x, s2, e2, s, e)
			}
		}
		// Boundaries: the window before, this one and the next, consecutive.
		b := l.Boundaries(at)
		ps, pe := l.Bounds(start - 1)
		ns, ne := l.Bounds(end)
		if b != [4]int64{ps, start, end, ne} || pe != start || ns != end {
			t.Errorf("%s: Boundaries = %v; windows around: [%d, %d) [%d, %d) [%d, %d)", tt.name, b, ps, pe, start, end, ns, ne)
		}
		for _, x := range []int64{b[0], b[1] - 1, b[1], b[2] - 1, b[2], b[3] - 1} {
			if got := l.Boundaries(x); x >= b[1] && x < b[2] && got != b {
				t.Errorf("%s: Boundaries(%d) = %v, want %v", tt.name, x, got, b)
			}
		}
	}
}

// TestCalendarTiles walks the days, weeks and months of several years in
// zones with unusual changes: each window contains its instants, starts
// where the one before ends, and is the window of every instant in it,
// around each zone change included.
func TestCalendarTiles(t *testing.T) {
	t.Parallel()
	for _, zone := range []string{
		"UTC", "Europe/Paris", "America/New_York", "America/Santiago", "Atlantic/Azores", "America/Havana", "Asia/Amman",
		"America/Sao_Paulo", "Asia/Beirut", "Pacific/Apia", "Australia/Lord_Howe", "Asia/Kathmandu", "America/St_Johns", "Asia/Tehran",
	} {
		loc := mustLoad(t, zone)
		for _, p := range []Period{CalendarDay, CalendarWeek, CalendarMonth} {
			t.Run(fmt.Sprintf("%s %s", zone, p), func(t *testing.T) {
				t.Parallel()
				l := Limit{Requests: 1, Algorithm: FixedWindow, Period: p, Location: loc}
				for _, span := range [][2]int{{2008, 2012}, {2021, 2026}} {
					at := time.Date(span[0], 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
					stop := time.Date(span[1], 1, 1, 0, 0, 0, 0, time.UTC).UnixMilli()
					prev := int64(-1)
					for at < stop {
						s, e := l.Bounds(at)
						if s > at || e <= at || prev >= 0 && s != prev {
							t.Fatalf("Bounds(%v) = [%v, %v), after a window ending %v", time.UnixMilli(at).In(loc), time.UnixMilli(s).In(loc), time.UnixMilli(e).In(loc), time.UnixMilli(prev).In(loc))
						}
						inside := []int64{s, e - 1, s + (e-s)/3, s + (e-s)/2}
						for z := time.UnixMilli(s).In(loc); ; {
							_, next := z.ZoneBounds()
							if next.IsZero() || next.UnixMilli() >= e {
								break
							}
							inside = append(inside, next.UnixMilli()-1, next.UnixMilli())
							z = next
						}
						for _, x := range inside {
							if s2, e2 := l.Bounds(x); s2 != s || e2 != e {
								t.Fatalf("Bounds(%v) = [%v, %v), inside [%v, %v)", time.UnixMilli(x).In(loc), time.UnixMilli(s2).In(loc), time.UnixMilli(e2).In(loc), time.UnixMilli(s).In(loc), time.UnixMilli(e).In(loc))
							}
						}
						prev, at = e, e
					}
				}
			})
		}
	}
}

// TestCalendarDayRenewsAtLocalMidnight: a calendar_day limit in Paris
// renews at midnight in Paris, not in UTC, and its quota lasts the whole
// local day, 23 hours on the day summer time starts.
func TestCalendarDayRenewsAtLocalMidnight(t *testing.T) {
	t.Parallel()
	paris, santiago, amman := mustLoad(t, "Europe/Paris"), mustLoad(t, "America/Santiago"), mustLoad(t, "Asia/Amman")
	l := Limit{Requests: 3, Algorithm: FixedWindow, Period: CalendarDay, Location: paris}
	midnight := time.Date(2024, 3, 31, 0, 0, 0, 0, paris).UnixMilli() // 23:00 UTC on the 30th
	day30 := time.Date(2024, 3, 30, 0, 0, 0, 0, paris).UnixMilli()
	runSteps(t, l, []step{
		{"23:59:59 Paris", midnight - sec, 3, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: time.Second, NextAfter: time.Second},
			State{Start: day30, Curr: 3}},
		{"23:59:59.999 Paris", midnight - 1, 1, false,
			Decision{ResetAfter: ms, RetryAfter: ms, NextAfter: ms},
			State{Start: day30, Curr: 3}},
		// The day of the change lasts 23 hours.
		{"00:00 Paris", midnight, 2, true,
			Decision{Allowed: true, Remaining: 1, ResetAfter: 23 * time.Hour, NextAfter: 23 * time.Hour},
			State{Start: midnight, Curr: 2}},
		// 00:00 UTC is 01:00 in Paris: the same day, no renewal.
		{"00:00 UTC", midnight + time.Hour.Milliseconds(), 2, false,
			Decision{Remaining: 1, ResetAfter: 22 * time.Hour, RetryAfter: 22 * time.Hour},
			State{Start: midnight, Curr: 2}},
		{"23:59 Paris", midnight + (23*time.Hour - time.Minute).Milliseconds(), 1, true,
			Decision{Allowed: true, Remaining: 0, ResetAfter: time.Minute, NextAfter: time.Minute},
			State{Start: midnight, Curr: 3}},
	})
	// In Santiago the day before a skipped midnight ends at 01:00 of the
	// next, and a denied request there waits until then.
	l.Location = santiago
	sep7 := time.Date(2024, 9, 7, 0, 0, 0, 0, santiago).UnixMilli()
	sep8 := time.Date(2024, 9, 8, 4, 0, 0, 0, time.UTC).UnixMilli() // 01:00 -03
	runSteps(t, l, []step{
		{"23:00 Santiago", sep8 - time.Hour.Milliseconds(), 3, true,
			Decision{Allowed: true, ResetAfter: time.Hour, NextAfter: time.Hour},
			State{Start: sep7, Curr: 3}},
		{"23:30 Santiago", sep8 - 30*minute, 1, false,
			Decision{ResetAfter: 30 * time.Minute, RetryAfter: 30 * time.Minute, NextAfter: 30 * time.Minute},
			State{Start: sep7, Curr: 3}},
		{"01:00 Santiago", sep8, 1, true,
			Decision{Allowed: true, Remaining: 2, ResetAfter: 23 * time.Hour, NextAfter: 23 * time.Hour},
			State{Start: sep8, Curr: 1}},
	})
	// In Amman the day with two midnights is one window of 25 hours: the
	// hour between them is not a window of its own at every instant.
	l.Location = amman
	first := time.Date(2021, 10, 28, 21, 0, 0, 0, time.UTC).UnixMilli() // 00:00 EEST
	var s State
	admitted := 0
	for now := first; now < first+2*time.Hour.Milliseconds(); now += 10 * sec {
		for {
			var ok bool
			if s, _, ok = take(l, s, now, 1); !ok {
				break
			}
			admitted++
		}
	}
	if admitted != 3 || s.Start != first {
		t.Errorf("Amman: %d admitted in the first two hours of a day, limit 3; state %+v", admitted, s)
	}
}
