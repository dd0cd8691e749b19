package clients

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

func TestBans(t *testing.T) {
	t.Parallel()
	b := Bans{Max: 3}
	a, c := ID{"login", "ip:a"}, ID{"login", "ip:c"}
	if _, ok := b.Until(a, 0); ok {
		t.Fatal("an empty table holds a ban")
	}
	if got := b.Set(a, 100, 0); got != 100 {
		t.Fatalf("Set = %d, want 100", got)
	}
	// A shorter ban does not cut a longer one short; a longer one extends it.
	if got := b.Set(a, 50, 0); got != 100 {
		t.Fatalf("a shorter ban: Set = %d, want 100", got)
	}
	if got := b.Set(a, 150, 0); got != 150 {
		t.Fatalf("a longer ban: Set = %d, want 150", got)
	}
	if u, ok := b.Until(a, 149); !ok || u != 150 {
		t.Fatalf("Until(149) = %d, %v; want 150, true", u, ok)
	}
	if _, ok := b.Until(a, 150); ok {
		t.Fatal("a ban is in force at its end")
	}
	// Full: a new ban pushes out an expired one first.
	b.Set(c, 20, 0)
	b.Set(ID{"login", "ip:d"}, 300, 0)
	b.Set(ID{"login", "ip:e"}, 400, 30) // c (ended at 20) goes
	if _, ok := b.Until(c, 30); ok {
		t.Fatal("the expired ban was kept over a new one")
	}
	got := b.List(30)
	if len(got) != 3 {
		t.Fatalf("List holds %d bans, want 3 (the bound): %v", len(got), got)
	}
	if !slices.IsSortedFunc(got, func(x, y Ban) int { return int(x.Until - y.Until) }) {
		t.Fatalf("List is not soonest first: %v", got)
	}
	if !b.Lift(a, 30) || b.Lift(a, 30) {
		t.Fatal("Lift: want true once, then false")
	}
	if keys := b.Clear(); len(keys) != 2 {
		t.Fatalf("Clear returned %v, want the 2 keys left", keys)
	}
	if _, ok := b.Until(ID{"login", "ip:d"}, 0); ok {
		t.Fatal("a ban survived Clear")
	}
}

func TestBansBound(t *testing.T) {
	t.Parallel()
	b := Bans{Max: 100}
	for i := range 10_000 {
		b.Set(ID{"r", fmt.Sprint(i)}, int64(1000+i), 0)
	}
	if n := len(b.List(0)); n != 100 {
		t.Fatalf("the table holds %d bans, want its bound of 100", n)
	}
}

func TestOverrides(t *testing.T) {
	t.Parallel()
	var o Overrides[string]
	t0 := time.Unix(1000, 0)
	a := &Entry[string]{ID: ID{"api", "user:a"}, V: "a"}
	ends := &Entry[string]{ID: ID{"api", "user:b"}, Until: t0.Add(time.Second), V: "b"}
	if o.Get(a.ID) != nil || o.Len() != 0 {
		t.Fatal("an empty table holds an override")
	}
	if !o.Put(a, t0, 2) || !o.Put(ends, t0, 2) {
		t.Fatal("Put refused below the bound")
	}
	if o.Put(&Entry[string]{ID: ID{"api", "user:c"}}, t0, 2) {
		t.Fatal("Put went past the bound")
	}
	// Replacing one held is allowed at the bound.
	if !o.Put(&Entry[string]{ID: a.ID, V: "a2"}, t0, 2) || o.Get(a.ID).V != "a2" {
		t.Fatal("Put did not replace at the bound")
	}
	// Once one has ended it makes room.
	later := t0.Add(2 * time.Second)
	if ends.Live(later) {
		t.Fatal("an override is in force after its end")
	}
	if !o.Put(&Entry[string]{ID: ID{"api", "user:c"}}, later, 2) {
		t.Fatal("an ended override did not make room")
	}
	if got := o.List(later); len(got) != 2 || got[0].ID.Key != "user:a" || got[1].ID.Key != "user:c" {
		t.Fatalf("List = %v, want user:a and user:c in order", got)
	}
	if !o.Remove(a.ID) || o.Remove(a.ID) {
		t.Fatal("Remove: want true once, then false")
	}
	if o.Replace([]*Entry[string]{a}, func() bool { return false }) || o.Len() != 1 {
		t.Fatal("Replace changed the table though keep said no")
	}
	if !o.Replace([]*Entry[string]{a, ends}, nil) || o.Len() != 2 || o.Get(ends.ID) == nil {
		t.Fatal("Replace did not replace the table")
	}
}

func TestLimitsCodec(t *testing.T) {
	t.Parallel()
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Skip("no time zone data:", err)
	}
	in := []window.Limit{
		{Requests: 100, Window: time.Minute},
		{Requests: 5, Window: time.Second, Algorithm: window.TokenBucket, Burst: 10},
		{Requests: 1000, Algorithm: window.FixedWindow, Period: window.CalendarMonth, Location: paris},
		{Requests: 2, Window: time.Second, Algorithm: window.LeakyBucket, Burst: 4, MaxDelay: 3 * time.Second},
		{Requests: 5, Window: 15 * time.Minute, Algorithm: window.SlidingLog, MaxLog: 2000, Ban: time.Hour},
	}
	b, err := EncodeLimits(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeLimits(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != len(in) {
		t.Fatalf("decoded %d limits, want %d", len(out), len(in))
	}
	for i := range in {
		if out[i].String() != in[i].String() || out[i].MaxLog != in[i].MaxLog || out[i].MaxDelay != in[i].MaxDelay || out[i].Ban != in[i].Ban {
			t.Errorf("limit %d: decoded %+v, want %+v", i, out[i], in[i])
		}
	}
	for _, bad := range []string{
		``, `{}`, `[{"requests":0,"window_ms":1000}]`, `[{"requests":1,"window_ms":-5}]`,
		`[{"requests":1,"algorithm":1,"period":1,"time_zone":"Nowhere/Atlantis"}]`, `[{"requests":1,"window_ms":1000,"algorithm":99}]`,
	} {
		if _, err := DecodeLimits([]byte(bad)); err == nil {
			t.Errorf("DecodeLimits(%q): no error", bad)
		}
	}
}

func FuzzDecodeLimits(f *testing.F) {
	f.Add([]byte(`[{"requests":100,"window_ms":60000}]`))
	f.Add([]byte(`[{"requests":1,"algorithm":1,"period":3,"time_zone":"UTC"}]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ls, err := DecodeLimits(b)
		if err != nil {
			return
		}
		for _, l := range ls {
			if err := l.Validate(); err != nil {
				t.Fatalf("DecodeLimits returned an invalid limit %+v: %v", l, err)
			}
		}
	})
}
