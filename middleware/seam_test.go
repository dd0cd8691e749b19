package middleware

import (
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/denycache"
	"github.com/sluicehq/sluice/internal/window"
)

// TestSeamLayout checks that the public types and internal/window's have
// the same layout, field by field, so that the conversions of seam.go
// read each as the other.
func TestSeamLayout(t *testing.T) {
	t.Parallel()
	pairs := []struct{ pub, in reflect.Type }{
		{reflect.TypeFor[Limit](), reflect.TypeFor[window.Limit]()},
		{reflect.TypeFor[Charge](), reflect.TypeFor[window.Charge]()},
		{reflect.TypeFor[Decision](), reflect.TypeFor[window.Decision]()},
		{reflect.TypeFor[Slot](), reflect.TypeFor[window.Slot]()},
		{reflect.TypeFor[Algorithm](), reflect.TypeFor[window.Algorithm]()},
		{reflect.TypeFor[Period](), reflect.TypeFor[window.Period]()},
	}
	for _, p := range pairs {
		sameLayout(t, p.pub.Name(), p.pub, p.in)
	}
}

func sameLayout(t *testing.T, path string, a, b reflect.Type) {
	t.Helper()
	if a.Kind() != b.Kind() || a.Size() != b.Size() || a.Align() != b.Align() {
		t.Errorf("%s: %s (%s, %d bytes) against %s (%s, %d bytes)", path, a, a.Kind(), a.Size(), b, b.Kind(), b.Size())
		return
	}
	switch a.Kind() {
	case reflect.Struct:
		if a.NumField() != b.NumField() {
			t.Errorf("%s: %d fields against %d", path, a.NumField(), b.NumField())
			return
		}
		for i := range a.NumField() {
			fa, fb := a.Field(i), b.Field(i)
			if fa.Name != fb.Name || fa.Offset != fb.Offset {
				t.Errorf("%s: field %d is %s at %d against %s at %d", path, i, fa.Name, fa.Offset, fb.Name, fb.Offset)
				continue
			}
			sameLayout(t, path+"."+fa.Name, fa.Type, fb.Type)
		}
	case reflect.Pointer, reflect.Slice:
		if a.Elem() != b.Elem() {
			sameLayout(t, path+"[]", a.Elem(), b.Elem())
		}
	default:
		if a.PkgPath() != b.PkgPath() && a.Kind() != reflect.Uint8 {
			// Only Algorithm and Period differ in their named type.
			t.Errorf("%s: %s against %s", path, a, b)
		}
	}
}

// TestSeamValues checks that the algorithms and periods have the same
// values and names on both sides.
func TestSeamValues(t *testing.T) {
	t.Parallel()
	algs := []struct {
		pub Algorithm
		in  window.Algorithm
	}{
		{SlidingWindow, window.SlidingWindow},
		{FixedWindow, window.FixedWindow},
		{SlidingLog, window.SlidingLog},
		{TokenBucket, window.TokenBucket},
		{LeakyBucket, window.LeakyBucket},
	}
	for _, a := range algs {
		if uint8(a.pub) != uint8(a.in) {
			t.Errorf("%s is %d, internally %d", a.pub, a.pub, a.in)
		}
		if got, err := window.ParseAlgorithm(a.pub.String()); err != nil || got != a.in {
			t.Errorf("%s parses as %v, %v", a.pub, got, err)
		}
	}
	if _, err := window.ParseAlgorithm(Algorithm(len(algs)).String()); err == nil {
		t.Errorf("an algorithm after LeakyBucket exists internally but not here")
	}
	periods := []struct {
		pub Period
		in  window.Period
	}{
		{NoPeriod, window.NoPeriod},
		{CalendarDay, window.CalendarDay},
		{CalendarWeek, window.CalendarWeek},
		{CalendarMonth, window.CalendarMonth},
	}
	for _, p := range periods {
		if uint8(p.pub) != uint8(p.in) || p.pub.String() != p.in.String() {
			t.Errorf("period %q is %d, internally %q %d", p.pub, p.pub, p.in, p.in)
		}
	}
	if _, ok := window.ParsePeriod(Period(len(periods)).String()); ok {
		t.Errorf("a period after CalendarMonth exists internally but not here")
	}
}

// TestSeamConversions checks that the converted slices share their
// memory with the public ones, both ways.
func TestSeamConversions(t *testing.T) {
	t.Parallel()
	loc := time.FixedZone("X", 3600)
	cs := []Charge{
		{Key: "ip:192.0.2.1", Name: "api", Limit: PerSecond(4).TokenBucket(8), Cost: 2},
		{Key: "user:7", Name: "day", Limit: Calendar(1000, CalendarWeek, loc), Cost: 1},
		{Key: "k", Name: "q", Limit: PerSecond(2).LeakyBucket(10, 3*time.Second)},
		{Key: "k", Name: "log", Limit: Limit{Requests: 5000, Window: time.Minute, Algorithm: SlidingLog, MaxLog: 6000}},
	}
	in := internalCharges(cs)
	want := []window.Charge{
		{Key: "ip:192.0.2.1", Name: "api", Limit: window.Limit{Requests: 4, Window: time.Second, Algorithm: window.TokenBucket, Burst: 8}, Cost: 2},
		{Key: "user:7", Name: "day", Limit: window.Limit{Requests: 1000, Algorithm: window.FixedWindow, Period: window.CalendarWeek, Location: loc}, Cost: 1},
		{Key: "k", Name: "q", Limit: window.Limit{Requests: 2, Window: time.Second, Algorithm: window.LeakyBucket, Burst: 10, MaxDelay: 3 * time.Second}},
		{Key: "k", Name: "log", Limit: window.Limit{Requests: 5000, Window: time.Minute, Algorithm: window.SlidingLog, MaxLog: 6000}},
	}
	if !reflect.DeepEqual(in, want) {
		t.Errorf("internalCharges:\n got %+v\nwant %+v", in, want)
	}
	for i := range cs {
		if got, want := cs[i].Limit.String(), want[i].Limit.String(); got != want {
			t.Errorf("String: %q, internally %q", got, want)
		}
	}
	ds := make([]Decision, 2)
	ids := internalDecisions(ds)
	ids[1] = window.Decision{Allowed: true, Remaining: 3, ResetAfter: 1, RetryAfter: 2, NextAfter: 3, Delay: 4}
	if want := (Decision{Allowed: true, Remaining: 3, ResetAfter: 1, RetryAfter: 2, NextAfter: 3, Delay: 4}); ds[1] != want || ds[0] != (Decision{}) {
		t.Errorf("internalDecisions wrote %+v, want %+v", ds, want)
	}
	s := &Slot{Key: "k", Name: "n", Limit: 3, ID: "id", Lease: time.Second}
	if is := internalSlots([]*Slot{s}); len(is) != 1 || *is[0] != (window.Slot{Key: "k", Name: "n", Limit: 3, ID: "id", Lease: time.Second}) {
		t.Errorf("internalSlots: %+v", is)
	}
	if internalCharges(nil) != nil || len(internalDecisions(ds[:0])) != 0 {
		t.Errorf("empty slices do not stay empty")
	}
}

// TestSeamDefaults: defaults this package states as numbers are those of
// the internal packages that apply them.
func TestSeamDefaults(t *testing.T) {
	t.Parallel()
	if DefaultDenyCacheSize != denycache.DefaultMaxEntries {
		t.Errorf("DefaultDenyCacheSize %d, the deny cache's default %d", DefaultDenyCacheSize, denycache.DefaultMaxEntries)
	}
}
