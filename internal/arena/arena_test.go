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
