package upstreamtest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/ratefields"
)

// get asks u once, with tokens if any, and returns the answer.
func get(u *Upstream, tokens int) *httptest.ResponseRecorder {
	r := httptest.NewRequest("GET", "/", nil)
	if tokens > 0 {
		r.Header.Set(TokensHeader, strconv.Itoa(tokens))
	}
	w := httptest.NewRecorder()
	u.ServeHTTP(w, r)
	return w
}

// TestCounting: a log admits the limit within any window and frees each
// unit a window after it was taken; fixed windows admit the limit per
// window of the clock. Each family answers its fields, which
// internal/ratefields reads back as the upstream meant them.
func TestCounting(t *testing.T) {
	t.Parallel()
	for _, counting := range []Counting{Log, Fixed} {
		for _, fields := range []Fields{Draft10, GitHub, OpenAI, Silent} {
			u := New(Config{Counting: counting, Fields: fields, Window: 200 * time.Millisecond, Limit: Constant(3)})
			ok := 0
			var last *httptest.ResponseRecorder
			for range 5 {
				last = get(u, 0)
				if last.Code == http.StatusOK {
					ok++
				}
			}
			name := counting.String() + "-" + fields.String()
			// Fixed windows of 200 ms may turn between the five requests;
			// the log may not.
			if counting == Log && ok != 3 || ok < 3 || ok > 6 {
				t.Errorf("%s: %d of 5 admitted at once, want 3", name, ok)
			}
			if last.Code != http.StatusTooManyRequests {
				continue
			}
			f := ratefields.Parse(last.Header(), time.Now())
			switch fields {
			case Draft10:
				if len(f.Policies) != 1 || f.Policies[0].Quota != 3 || f.Policies[0].Window != time.Second || f.Requests.Remaining != 0 || f.RetryAfter != time.Second {
					t.Errorf("%s: %+v", name, f)
				}
			case GitHub:
				if f.Requests.Source != ratefields.XRateLimit || f.Requests.Limit != 3 || f.Requests.Remaining != 0 || f.Requests.Reset > 2*time.Second || f.HasRetryAfter {
					t.Errorf("%s: %+v", name, f)
				}
			case OpenAI:
				if f.Requests.Source != ratefields.OpenAI || f.Requests.Limit != 3 || f.Requests.Remaining != 0 || f.Requests.Reset > 200*time.Millisecond || f.Requests.Reset <= 0 || f.HasRetryAfter {
					t.Errorf("%s: %+v", name, f)
				}
			case Silent:
				if f.Requests.Known() || f.RetryAfter != time.Second {
					t.Errorf("%s: %+v", name, f)
				}
			}
		}
	}
	// A log frees each unit a window after it was taken.
	u := New(Config{Counting: Log, Fields: OpenAI, Window: 100 * time.Millisecond, Limit: Constant(1)})
	if get(u, 0).Code != 200 || get(u, 0).Code != 429 {
		t.Fatal("a log of 1: want one admitted, then refused")
	}
	time.Sleep(110 * time.Millisecond)
	if c := get(u, 0).Code; c != 200 {
		t.Errorf("a window later: %d, want 200", c)
	}
}

// TestHostile: an upstream that announces another limit than it keeps,
// and refuses once with the Retry-After it is given.
func TestHostile(t *testing.T) {
	t.Parallel()
	u := New(Config{Counting: Fixed, Fields: Draft10, Limit: Constant(5), Announced: Constant(1000),
		HostileAt: time.Nanosecond, HostileRetryAfter: "315360000"})
	w := get(u, 0)
	f := ratefields.Parse(w.Header(), time.Now())
	if w.Code != 429 || f.RetryAfter != ratefields.MaxWait || len(f.Policies) != 1 || f.Policies[0].Quota != 1000 {
		t.Errorf("the hostile refusal: %d %+v", w.Code, f)
	}
	if w := get(u, 0); w.Code != 200 || w.Header().Get("Retry-After") != "" {
		t.Errorf("after it: %d %v", w.Code, w.Header())
	}
}

// TestTokens: a request whose tokens do not fit what is left is refused,
// and its usage is answered when admitted.
func TestTokens(t *testing.T) {
	t.Parallel()
	u := New(Config{Counting: Log, Fields: OpenAI, Limit: Constant(100), Tokens: Constant(250)})
	for i, want := range []int{200, 200, 429, 200} {
		w := get(u, []int{100, 100, 100, 50}[i])
		if w.Code != want {
			t.Errorf("request %d: %d, want %d", i, w.Code, want)
		}
		f := ratefields.Parse(w.Header(), time.Now())
		if f.Tokens.Limit != 250 {
			t.Errorf("request %d: tokens %+v", i, f.Tokens)
		}
		if want == 200 && w.Header().Get(UsageHeader) == "" {
			t.Errorf("request %d: no %s", i, UsageHeader)
		}
	}
}

// TestRecord: the record's sums, capacity, share used and following,
// on a record made by hand.
func TestRecord(t *testing.T) {
	t.Parallel()
	bins := int(3 * time.Second / BinWidth)
	r := Record{Window: time.Second, Limit: Steps(100, time.Second, 50), Ok: make([]int, bins), Ref: make([]int, bins)}
	// 100 a second in the first second, then 60 in the next, 10 of them
	// refused at its start, then 45.
	for b := 0; b < 100; b++ {
		r.Ok[b] = 1
	}
	for b := 100; b < 150; b++ {
		r.Ok[b] = 1
	}
	for b := 100; b < 110; b++ {
		r.Ref[b] = 1
	}
	for b := 200; b < 245; b++ {
		r.Ok[b] = 1
	}
	if n := r.Admitted(0, 3*time.Second); n != 195 {
		t.Errorf("Admitted = %d", n)
	}
	if n := r.Refused(time.Second, 2*time.Second); n != 10 {
		t.Errorf("Refused = %d", n)
	}
	if c := r.Capacity(0, 3*time.Second); c < 199.9 || c > 200.1 {
		t.Errorf("Capacity = %v, want 200", c)
	}
	if u := r.Used(time.Second, 3*time.Second); u < 0.949 || u > 0.951 {
		t.Errorf("Used = %v, want 0.95", u)
	}
	// The episode of refusals ends at 1.1 s; the window from then holds
	// 40 + 10 admitted, none refused: followed at 2.1 s.
	if d, ok := r.Follow(time.Second, 3*time.Second, 50); !ok || d != 1100*time.Millisecond {
		t.Errorf("Follow = %v, %v; want 1.1s", d, ok)
	}
	if _, ok := r.Follow(time.Second, 3*time.Second, 60); ok {
		t.Error("Follow at 60: the clients never sent 54 a second after the refusals")
	}
	if n := r.MostWithin(0, 3*time.Second); n != 110 {
		t.Errorf("MostWithin = %d, want 110 (0.1 s to 1.1 s: 90, then 10 admitted and 10 refused)", n)
	}
	if g := r.LongestGap(0, 3*time.Second); g != 550*time.Millisecond {
		t.Errorf("LongestGap = %v, want 550ms (2.45 s to 3 s)", g)
	}
	if n := Steps(100, time.Second, 50, 2*time.Second, 100)(2500 * time.Millisecond); n != 100 {
		t.Errorf("Steps at 2.5s = %d", n)
	}
}
