package labelcap

import (
	"fmt"
	"sync"
	"testing"
)

func TestTable(t *testing.T) {
	t.Parallel()
	made := 0
	tb := New(2, "other", func(label string) *string { made++; return &label })
	a, b := tb.Get("a"), tb.Get("b")
	c, d := tb.Get("c"), tb.Get("d")
	if *a != "a" || *b != "b" || *c != "other" || c != d || tb.Get("a") != a {
		t.Fatalf("series %q %q %q %q", *a, *b, *c, *d)
	}
	if made != 3 {
		t.Errorf("%d series made, want 3 (a, b, other)", made)
	}
	var labels []string
	tb.Each(func(label string, _ *string) { labels = append(labels, label) })
	if fmt.Sprint(labels) != "[a b other]" {
		t.Errorf("labels %v", labels)
	}
	// Many values past the cap: bounded memory, always the other series.
	for i := range 1000 {
		if s := tb.Get(fmt.Sprint("x", i)); *s != "other" {
			t.Fatalf("value %d: %q", i, *s)
		}
	}
	if n := len(tb.cur.Load().byName); n > 8 {
		t.Errorf("%d values remembered, want at most 4 * max", n)
	}
}

func TestTableConcurrent(t *testing.T) {
	t.Parallel()
	tb := New(100, "other", func(label string) *string { return &label })
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				name := fmt.Sprint(i % 150)
				if s := tb.Get(name); *s != name && *s != "other" || g < 0 {
					t.Errorf("%s: %q", name, *s)
				}
			}
		}()
	}
	wg.Wait()
	n := 0
	tb.Each(func(string, *string) { n++ })
	if n != 101 {
		t.Errorf("%d series, want 100 and other", n)
	}
}
