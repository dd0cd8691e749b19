package ratefields

import (
	"net/http"
	"testing"
	"time"
)

// FuzzParse feeds hostile values to every field Parse reads and checks
// that what comes out is safe to act on: no panic, every duration between
// 0 and MaxWait, every count between 0 and MaxCount, and the same answer
// twice.
func FuzzParse(f *testing.F) {
	for _, seed := range [][3]string{
		{"120", `"default";r=42;t=18`, `"default";q=100;w=60`},
		{"Wed, 21 Oct 2015 07:28:00 GMT", `"a";r=0;t=1, "b";r=5;t=60`, `"a";q=10;w=1, "b";q=1000;w=3600`},
		{"315360000", `api;r=0;t=999999999999999`, `("x" "y");q=1`},
		{"-5", `"a";r=-1`, `"a";q=-1;w=-1`},
		{"1.5", `"es\"c";r=1;pk=:cHsd:`, `"a";q=1;qu="requests"`},
		{"NaN", `"a";r=1,`, `:bad`},
	} {
		f.Add(seed[0], seed[1], seed[2], "1740833400", "6m0s", "59")
	}
	f.Fuzz(func(t *testing.T, retry, rl, policy, reset, dur, count string) {
		h := http.Header{}
		h.Set(RetryAfter, retry)
		h.Set(RateLimit, rl)
		h.Set(RateLimitPolicy, policy)
		h.Set(XRemaining, count)
		h.Set(XLimit, count)
		h.Set(XReset, reset)
		h.Set(RemainingTokens, count)
		h.Set(LimitTokens, count)
		h.Set(ResetTokens, dur)
		h.Set("Date", retry)
		now := time.Unix(1740830400, 0)
		got := Parse(h, now)
		check(t, got)
		if again := Parse(h, now); !equal(got, again) {
			t.Fatalf("Parse differs on the same input:\n%+v\n%+v", got, again)
		}
		// Each field alone, so that a field the others shadow is checked
		// too.
		for _, name := range []string{RateLimit, XRemaining, RemainingRequests} {
			one := http.Header{}
			one.Set(name, count)
			one.Set(XReset, reset)
			one.Set(ResetRequests, dur)
			check(t, Parse(one, now))
		}
	})
}

func check(t *testing.T, f Fields) {
	t.Helper()
	wait := func(name string, d time.Duration) {
		if d < 0 || d > MaxWait {
			t.Fatalf("%s = %v, outside [0, %v]", name, d, MaxWait)
		}
	}
	budget := func(name string, b Budget) {
		wait(name+".Reset", b.Reset)
		wait(name+".Window", b.Window)
		if b.Remaining < 0 || b.Remaining > MaxCount || b.Limit < 0 || b.Limit > MaxCount {
			t.Fatalf("%s = %+v: a count outside [0, MaxCount]", name, b)
		}
		if !b.Known() && b != (Budget{}) {
			t.Fatalf("%s = %+v: not known but not zero", name, b)
		}
	}
	wait("RetryAfter", f.RetryAfter)
	if !f.HasRetryAfter && f.RetryAfter != 0 {
		t.Fatalf("RetryAfter %v without HasRetryAfter", f.RetryAfter)
	}
	budget("Requests", f.Requests)
	budget("Tokens", f.Tokens)
	if len(f.Policies) > MaxItems {
		t.Fatalf("%d policies, more than MaxItems", len(f.Policies))
	}
	for _, p := range f.Policies {
		if p.Quota <= 0 || p.Quota > MaxCount {
			t.Fatalf("policy %+v: quota outside (0, MaxCount]", p)
		}
		wait("Policy.Window", p.Window)
	}
}

func equal(a, b Fields) bool {
	if a.RetryAfter != b.RetryAfter || a.HasRetryAfter != b.HasRetryAfter || a.Requests != b.Requests || a.Tokens != b.Tokens || len(a.Policies) != len(b.Policies) {
		return false
	}
	for i := range a.Policies {
		if a.Policies[i] != b.Policies[i] {
			return false
		}
	}
	return true
}
