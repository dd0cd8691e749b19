package headerwrite

import (
	"net/http"
	"reflect"
	"testing"
	"time"
)

type mapSetter map[string]string

func (m mapSetter) Set(k, v string) { m[k] = v }

func TestWrite(t *testing.T) {
	t.Parallel()
	// X-RateLimit-Reset is Reset (whole again); RateLimit's t is Next
	// (more quota); Retry-After is the denied request's own wait.
	allowed := Values{Name: "api", Limit: 100, Remaining: 42, Reset: 17100 * time.Millisecond,
		Next: 400 * time.Millisecond, Policy: `"api";q=100;w=60`}
	denied := Values{Name: "login", Limit: 5, Remaining: 0, Reset: 299 * time.Second,
		RetryAfter: 3001 * time.Millisecond, Next: 1001 * time.Millisecond, Policy: `"login";q=5;w=300, "api";q=100;w=60`}
	tests := []struct {
		name  string
		style Style
		v     Values
		want  map[string]string
	}{
		{"both allowed", Both, allowed, map[string]string{
			Limit: "100", Remaining: "42", Reset: "18",
			RateLimit: `"api";r=42;t=1`, RateLimitPolicy: `"api";q=100;w=60`,
		}},
		{"legacy allowed", Legacy, allowed, map[string]string{Limit: "100", Remaining: "42", Reset: "18"}},
		{"draft allowed", Draft, allowed, map[string]string{
			RateLimit: `"api";r=42;t=1`, RateLimitPolicy: `"api";q=100;w=60`,
		}},
		{"none allowed", None, allowed, map[string]string{}},
		{"both denied", Both, denied, map[string]string{
			Limit: "5", Remaining: "0", Reset: "299", RetryAfter: "4",
			RateLimit: `"login";r=0;t=2`, RateLimitPolicy: `"login";q=5;w=300, "api";q=100;w=60`,
		}},
		{"none denied keeps Retry-After", None, denied, map[string]string{RetryAfter: "4"}},
		{"negative remaining clamps", Legacy, Values{Limit: 1, Remaining: -3}, map[string]string{Limit: "1", Remaining: "0", Reset: "0"}},
		{"quoted name", Draft, Values{Name: `a"b`, Limit: 1}, map[string]string{RateLimit: `"a\"b";r=0;t=0`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := mapSetter{}
			Write(got, tt.style, &tt.v, nil)
			if !reflect.DeepEqual(map[string]string(got), tt.want) {
				t.Errorf("Setter: got %v, want %v", got, tt.want)
			}
			h := http.Header{}
			Write(h, tt.style, &tt.v, nil)
			if len(h) != len(tt.want) {
				t.Errorf("http.Header: got %v, want %v", h, tt.want)
			}
			for k, v := range tt.want {
				if got := h.Values(k); len(got) != 1 || got[0] != v {
					t.Errorf("http.Header[%s] = %q, want [%q]", k, got, v)
				}
			}
		})
	}
}

// TestWritePrepared: the fields are the same with a Prepared as without,
// and a Prepared made for another name or limit is not used.
func TestWritePrepared(t *testing.T) {
	t.Parallel()
	base := []Values{
		{Name: "api", Limit: 100, Remaining: 42, Reset: 17100 * time.Millisecond, Next: 400 * time.Millisecond, Policy: `"api";q=100;w=60`},
		{Name: "login", Limit: 5, Reset: 299 * time.Second, RetryAfter: 3001 * time.Millisecond, Next: 1001 * time.Millisecond},
		{Name: `a"b`, Limit: 1 << 40, Remaining: 1<<40 - 1, Reset: 1000 * time.Second, Next: 300 * time.Second},
		{Name: "neg", Limit: 7, Remaining: -3},
	}
	for _, v := range base {
		for _, p := range []*Prepared{Prepare(v.Name, v.Limit), Prepare(v.Name, v.Limit+1), Prepare(v.Name+"x", v.Limit)} {
			for _, style := range []Style{Both, Legacy, Draft, None} {
				want, got := mapSetter{}, mapSetter{}
				Write(want, style, &v, nil)
				Write(got, style, &v, p)
				if !reflect.DeepEqual(got, want) {
					t.Errorf("style %d, %+v prepared as %+v: got %v, want %v", style, v, *p, got, want)
				}
				h := http.Header{}
				Write(h, style, &v, p)
				for k, w := range want {
					if g := h.Values(k); len(g) != 1 || g[0] != w {
						t.Errorf("style %d, %+v: http.Header[%s] = %q, want [%q]", style, v, k, g, w)
					}
				}
			}
		}
	}
}

func TestWriteReplaces(t *testing.T) {
	t.Parallel()
	h := http.Header{}
	h.Add(Limit, "1")
	h.Add(Limit, "2")
	Write(h, Legacy, &Values{Limit: 3}, nil)
	if got := h.Values(Limit); len(got) != 1 || got[0] != "3" {
		t.Errorf("Limit = %q, want [3]", got)
	}
	// A later Add must not write into the neighbouring field.
	h.Add(Limit, "4")
	if got := h.Values(Remaining); len(got) != 1 || got[0] != "0" {
		t.Errorf("Remaining = %q after Add to Limit, want [0]", got)
	}
}

// TestWriteAllocs: the values are carved from shared chunks, so writing
// them into a map that has room costs well under one allocation each time.
func TestWriteAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under -race")
	}
	v := Values{Name: "default", Limit: 100, Remaining: 99, Reset: time.Minute, Next: time.Second, Policy: `"default";q=100;w=60`}
	h := make(http.Header, 8)
	allocs := testing.AllocsPerRun(1000, func() {
		clear(h)
		Write(h, Both, &v, nil)
	})
	if allocs != 0 {
		t.Errorf("Write to http.Header: %v allocs, want 0 (amortised)", allocs)
	}
	p := Prepare(v.Name, v.Limit)
	allocs = testing.AllocsPerRun(1000, func() {
		clear(h)
		Write(h, Both, &v, p)
	})
	if allocs != 0 {
		t.Errorf("Write to http.Header, prepared: %v allocs, want 0 (amortised)", allocs)
	}
}

func TestSeconds(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int64{-time.Second: 0, 0: 0, 1: 1, time.Second: 1, time.Second + 1: 2, 90 * time.Second: 90} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %d, want %d", d, got, want)
		}
	}
}

func BenchmarkWrite(b *testing.B) {
	v := Values{Name: "default", Limit: 100, Remaining: 99, Reset: time.Minute, Policy: `"default";q=100;w=60`}
	h := make(http.Header, 8)
	b.ReportAllocs()
	for b.Loop() {
		clear(h)
		Write(h, Both, &v, nil)
	}
}

// BenchmarkWritePrepared is BenchmarkWrite with the policy's fixed text
// prepared once, as the middleware does for its static rules.
func BenchmarkWritePrepared(b *testing.B) {
	v := Values{Name: "default", Limit: 100, Remaining: 99, Reset: time.Minute, Policy: `"default";q=100;w=60`}
	p := Prepare("default", 100)
	h := make(http.Header, 8)
	b.ReportAllocs()
	for b.Loop() {
		clear(h)
		Write(h, Both, &v, p)
	}
}

// setterOnly hides an http.Header behind Set, so that Write takes its
// general path.
type setterOnly struct{ h http.Header }

func (s setterOnly) Set(k, v string) { s.h.Set(k, v) }

// TestWriteBothMatches: the fast path for both styles of a prepared policy
// writes exactly what the general path does, over values small and large.
func TestWriteBothMatches(t *testing.T) {
	t.Parallel()
	p := Prepare("api", 1_000_000_000)
	for _, v := range []Values{
		{Name: "api", Limit: 1_000_000_000, Remaining: 5, Reset: 1500 * time.Millisecond, Next: 0, Policy: `"api";q=1000000000;w=60`},
		{Name: "api", Limit: 1_000_000_000, Remaining: 999_999_999, Reset: 61 * time.Second, Next: 20 * time.Millisecond, Policy: `"api";q=1000000000;w=60`},
		{Name: "api", Limit: 1_000_000_000, Remaining: -3, Reset: 300 * time.Second, Next: 299 * time.Second, Policy: "x"},
		{Name: "api", Limit: 1_000_000_000, Remaining: 255, Reset: 255 * time.Second, Next: time.Hour, Policy: "y"},
		{Name: "api", Limit: 1_000_000_000, Remaining: 256, Reset: 256 * time.Second, Next: 1<<62 - 1, Policy: "z"},
	} {
		fast, slow := http.Header{}, http.Header{}
		Write(fast, Both, &v, p)
		Write(setterOnly{slow}, Both, &v, p)
		if !reflect.DeepEqual(fast, slow) {
			t.Errorf("%+v:\nfast %v\nslow %v", v, fast, slow)
		}
		if len(fast) != 5 {
			t.Errorf("%+v: %d fields: %v", v, len(fast), fast)
		}
	}
}
