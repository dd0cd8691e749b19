package arena

import (
	"runtime"
	"strconv"
	"strings"
	"testing"
)

func TestStringsAreCopiesAndStay(t *testing.T) {
	t.Parallel()
	a := Get()
	defer Put(a)
	var got []string
	buf := []byte("x")
	for i := range 3000 { // several chunks
		buf[0] = 'x'
		buf = strconv.AppendInt(buf[:1], int64(i), 10)
		got = append(got, a.String(buf))
		buf[0] = 'y' // the caller's buffer changes; the string must not
	}
	runtime.GC()
	for i, s := range got {
		if want := "x" + strconv.Itoa(i); s != want {
			t.Fatalf("string %d = %q, want %q", i, s, want)
		}
	}
	if s := a.String(nil); s != "" {
		t.Errorf("empty = %q", s)
	}
	long := []byte(strings.Repeat("z", maxCarved+1))
	if s := a.String(long); s != string(long) {
		t.Error("long string differs")
	}
}

func TestOneIsIsolated(t *testing.T) {
	t.Parallel()
	a := Get()
	defer Put(a)
	x, y := a.One("x"), a.One("y")
	if len(x) != 1 || cap(x) != 1 || x[0] != "x" || y[0] != "y" {
		t.Fatalf("One: %q (cap %d), %q", x, cap(x), y)
	}
	x = append(x, "more") // must copy, not overwrite y
	if y[0] != "y" || x[1] != "more" {
		t.Errorf("append to one slice changed the next: %q %q", x, y)
	}
	for range 3 * chunkSlots {
		a.One("z")
	}
	if y[0] != "y" {
		t.Errorf("later slices overwrote an earlier one: %q", y)
	}
}

func TestAllocs(t *testing.T) {
	a := Get()
	defer Put(a)
	b := []byte("ip:192.0.2.1")
	allocs := testing.AllocsPerRun(10_000, func() {
		a.One(a.String(b))
	})
	// One chunk of each kind every few hundred calls.
	if allocs > 0.05 {
		t.Errorf("%.3f allocations per string, want amortised to almost none", allocs)
	}
}

func TestSlots(t *testing.T) {
	a := Get()
	defer Put(a)
	before := a.One("before")
	var all [][]string
	for i := range 3 * chunkSlots / 5 {
		vs := a.Slots(5)
		if len(vs) != 5 || cap(vs) != 5 {
			t.Fatalf("Slots(5): len %d, cap %d", len(vs), cap(vs))
		}
		for j := range vs {
			if vs[j] != "" {
				t.Fatalf("Slots(5)[%d] = %q, want empty", j, vs[j])
			}
			vs[j] = string(rune('a'+j)) + string(rune('0'+i%10))
		}
		all = append(all, vs)
	}
	if got := append(a.Slots(1)[:0:0], a.One("after")...); got[0] != "after" || before[0] != "before" {
		t.Errorf("Slots disturbed One: %q %q", before, got)
	}
	for i, vs := range all {
		for j, v := range vs {
			if want := string(rune('a'+j)) + string(rune('0'+i%10)); v != want {
				t.Fatalf("slot %d of batch %d = %q, want %q: batches overlap", j, i, v, want)
			}
		}
	}
	one := all[0][1:2:2]
	one = append(one, "more") // must copy, not overwrite the next slot
	if all[0][2] != "c0" {
		t.Errorf("append to a slot changed the next: %q", all[0])
	}
}
