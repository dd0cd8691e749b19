package usage

import (
	"errors"
	"slices"
	"sync"
	"testing"
)

func TestLedger(t *testing.T) {
	t.Parallel()
	lines := func() []Line {
		return []Line{{Estimate: 100, Paid: 100, Max: 4000, Rule: "chat"}, {Estimate: 100, Paid: 1, Max: 500, Rule: "all"}}
	}
	tests := []struct {
		name     string
		settle   []int64 // in turn, before Close
		wantErr  []error
		wantDue  []int64
		late     int64 // settled after Close, if >= 0
		wantLate []int64
	}{
		{"nothing reported: the estimate stands", nil, nil, []int64{0, 99}, -1, nil},
		{"more than the estimate", []int64{300}, []error{nil}, []int64{200, 299}, -1, nil},
		{"less: given back", []int64{10}, []error{nil}, []int64{-90, 9}, -1, nil},
		{"zero", []int64{0}, []error{nil}, []int64{-100, -1}, -1, nil},
		{"twice", []int64{300, 5}, []error{nil, ErrTwice}, []int64{200, 299}, -1, nil},
		{"negative, then good", []int64{-1, 50}, []error{ErrBad, nil}, []int64{-50, 49}, -1, nil},
		{"above a line's max", []int64{501, 400}, []error{ErrBad, nil}, []int64{300, 399}, -1, nil},
		{"after the end", nil, nil, []int64{0, 99}, 250, []int64{150, 150}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			l := NewLedger(lines())
			for i, u := range tt.settle {
				due, err := l.Settle(u)
				if !errors.Is(err, tt.wantErr[i]) || err == nil != (tt.wantErr[i] == nil) || due != nil {
					t.Fatalf("Settle(%d) = %v, %v; want no due and %v", u, due, err, tt.wantErr[i])
				}
			}
			if due := l.Close(); !slices.Equal(due, tt.wantDue) {
				t.Fatalf("Close() = %v, want %v", due, tt.wantDue)
			}
			if used := l.Used(1); used != tt.wantDue[1]+1 && tt.late < 0 {
				t.Fatalf("Used(1) = %d, want %d", used, tt.wantDue[1]+1)
			}
			if due := l.Close(); due != nil {
				t.Fatalf("second Close() = %v, want nothing", due)
			}
			if tt.late >= 0 {
				due, err := l.Settle(tt.late)
				if err != nil || !slices.Equal(due, tt.wantLate) {
					t.Fatalf("late Settle(%d) = %v, %v; want %v", tt.late, due, err, tt.wantLate)
				}
				if _, err := l.Settle(tt.late); !errors.Is(err, ErrTwice) {
					t.Fatalf("late second Settle: %v, want ErrTwice", err)
				}
			}
		})
	}
}

// TestLedgerRace settles and closes from two goroutines: whichever comes
// first, the units are due exactly once.
func TestLedgerRace(t *testing.T) {
	t.Parallel()
	for range 200 {
		l := NewLedger([]Line{{Estimate: 10, Paid: 10, Max: 100}})
		var wg sync.WaitGroup
		var fromSettle, fromClose []int64
		wg.Add(2)
		go func() {
			defer wg.Done()
			d, err := l.Settle(70)
			if err != nil {
				t.Error(err)
			}
			fromSettle = d
		}()
		go func() {
			defer wg.Done()
			fromClose = l.Close()
		}()
		wg.Wait()
		total := int64(0)
		for _, d := range [][]int64{fromSettle, fromClose} {
			if len(d) > 0 {
				total += d[0]
			}
		}
		if total != 60 {
			t.Fatalf("due %v then %v: %d in all, want 60", fromSettle, fromClose, total)
		}
	}
}

func TestParseUnits(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want int64
		ok   bool
	}{
		{"0", 0, true}, {"42", 42, true}, {" 7\t", 7, true}, {"007", 7, true},
		{"1125899906842624", MaxUnits, true},
		{"1125899906842625", 0, false}, {"99999999999999999999999", 0, false},
		{"", 0, false}, {"  ", 0, false}, {"-1", 0, false}, {"+1", 0, false}, {"1.5", 0, false},
		{"1e3", 0, false}, {"0x10", 0, false}, {"1,2", 0, false}, {"12 34", 0, false}, {"٣", 0, false},
	} {
		got, err := ParseUnits(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("ParseUnits(%q) = %d, %v; want %d, ok %v", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && !errors.Is(err, ErrBad) {
			t.Errorf("ParseUnits(%q): %v does not wrap ErrBad", tt.in, err)
		}
	}
}

// FuzzParseUnits: a header's value from an untrusted upstream never
// panics, and is either a number within bounds that prints back to its
// digits, or ErrBad.
func FuzzParseUnits(f *testing.F) {
	for _, s := range []string{"0", "123", " 9 ", "-1", "1e9", "18446744073709551616", "\x00", "１２"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := ParseUnits(s)
		if err != nil {
			if !errors.Is(err, ErrBad) || n != 0 {
				t.Fatalf("ParseUnits(%q) = %d, %v", s, n, err)
			}
			return
		}
		if n < 0 || n > MaxUnits {
			t.Fatalf("ParseUnits(%q) = %d, out of bounds", s, n)
		}
	})
}
