package sluicetest

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/ratefields"
)

// Fields are the rate-limit fields of a response, as ReadFields parses
// them. Each duration is a whole number of seconds, as sent.
type Fields struct {
	// Status is the response's status code.
	Status int
	// HasLegacy reports whether the response has X-RateLimit-Limit,
	// X-RateLimit-Remaining and X-RateLimit-Reset (sluice sends the three
	// together, or none); Limit, Remaining and Reset are their values.
	HasLegacy bool
	Limit     int64
	Remaining int64
	Reset     time.Duration
	// HasRetryAfter reports whether the response has Retry-After, and
	// RetryAfter is its value.
	HasRetryAfter bool
	RetryAfter    time.Duration
	// RateLimit holds the items of the RateLimit field in order: the
	// binding policy's first.
	RateLimit []Item
	// Policies holds the items of the RateLimit-Policy field in order.
	Policies []Policy
}

// Item is an item of the RateLimit field: "name";r=4;t=120.
type Item struct {
	// Policy is the item's name; Remaining its r and Next its t (zero
	// when absent).
	Policy    string
	Remaining int64
	Next      time.Duration
}

// Policy is an item of the RateLimit-Policy field: "name";q=5;w=60.
type Policy struct {
	// Name is the item's name, Quota its q and Window its w (zero when
	// absent).
	Name   string
	Quota  int64
	Window time.Duration
}

// Binding returns the first item of the RateLimit field, that of the
// policy that binds, and whether there is one.
func (f Fields) Binding() (Item, bool) {
	if len(f.RateLimit) == 0 {
		return Item{}, false
	}
	return f.RateLimit[0], true
}

// Left returns how many more requests the response says the client may
// send now: X-RateLimit-Remaining, or the binding item's r when the
// response has only the draft's fields. ok is false when it has neither.
func (f Fields) Left() (n int64, ok bool) {
	if f.HasLegacy {
		return f.Remaining, true
	}
	if b, ok := f.Binding(); ok {
		return b.Remaining, true
	}
	return 0, false
}

// ReadFields parses the rate-limit fields of resp strictly: a field that
// is sent twice, a number that is not a non-negative integer, a
// Retry-After that is not delay-seconds (sluice never sends a date), a
// RateLimit item without r, a RateLimit-Policy item without a positive q,
// or a structured field with a syntax error is an error. So are fields that
// disagree: some of the X-RateLimit fields without the others, a RateLimit
// item of a policy that RateLimit-Policy does not list, and with both
// styles, an X-RateLimit-Remaining or X-RateLimit-Limit other than the
// binding policy's r and q.
func ReadFields(resp *http.Response) (Fields, error) {
	f := Fields{Status: resp.StatusCode}
	h := resp.Header
	var errs []error
	legacy := 0
	for _, x := range []struct {
		name string
		n    *int64
	}{{headers.Limit, &f.Limit}, {headers.Remaining, &f.Remaining}, {headers.Reset, nil}} {
		v, ok, err := one(h, x.name)
		if err != nil || !ok {
			errs = append(errs, err)
			continue
		}
		legacy++
		n, err := nonNegative(x.name, v)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if x.n != nil {
			*x.n = n
		} else {
			f.Reset = time.Duration(n) * time.Second
		}
	}
	switch legacy {
	case 3:
		f.HasLegacy = true
	case 0:
	default:
		errs = append(errs, fmt.Errorf("only %d of %s, %s and %s", legacy, headers.Limit, headers.Remaining, headers.Reset))
	}
	if v, ok, err := one(h, headers.RetryAfter); err != nil {
		errs = append(errs, err)
	} else if ok {
		n, err := nonNegative(headers.RetryAfter+" (delay-seconds)", v)
		errs = append(errs, err)
		f.HasRetryAfter, f.RetryAfter = err == nil, time.Duration(n)*time.Second
	}
	if v, ok, err := one(h, headers.RateLimitPolicy); err != nil {
		errs = append(errs, err)
	} else if ok {
		items, err := list(headers.RateLimitPolicy, v)
		errs = append(errs, err)
		for _, it := range items {
			q, ok := it.Ints["q"]
			if !ok || q <= 0 {
				errs = append(errs, fmt.Errorf("%s: item %q has no positive integer q", headers.RateLimitPolicy, it.Name))
			}
			w := it.Ints["w"]
			if w < 0 {
				errs = append(errs, fmt.Errorf("%s: item %q has a negative w", headers.RateLimitPolicy, it.Name))
			}
			f.Policies = append(f.Policies, Policy{Name: it.Name, Quota: q, Window: time.Duration(w) * time.Second})
		}
	}
	if v, ok, err := one(h, headers.RateLimit); err != nil {
		errs = append(errs, err)
	} else if ok {
		items, err := list(headers.RateLimit, v)
		errs = append(errs, err)
		for _, it := range items {
			r, ok := it.Ints["r"]
			if !ok || r < 0 {
				errs = append(errs, fmt.Errorf("%s: item %q has no non-negative integer r", headers.RateLimit, it.Name))
			}
			t := it.Ints["t"]
			if t < 0 {
				errs = append(errs, fmt.Errorf("%s: item %q has a negative t", headers.RateLimit, it.Name))
			}
			f.RateLimit = append(f.RateLimit, Item{Policy: it.Name, Remaining: r, Next: time.Duration(t) * time.Second})
		}
	}
	errs = append(errs, f.agree())
	return f, errors.Join(errs...)
}

// agree checks that the fields present say the same thing.
func (f *Fields) agree() error {
	var errs []error
	if len(f.Policies) > 0 {
		for _, it := range f.RateLimit {
			if _, ok := f.policy(it.Policy); !ok {
				errs = append(errs, fmt.Errorf("%s names policy %q, which %s does not list", headers.RateLimit, it.Policy, headers.RateLimitPolicy))
			}
		}
	}
	b, ok := f.Binding()
	if !ok || !f.HasLegacy {
		return errors.Join(errs...)
	}
	if f.Remaining != b.Remaining {
		errs = append(errs, fmt.Errorf("%s is %d but the binding %s item %q has r=%d", headers.Remaining, f.Remaining, headers.RateLimit, b.Policy, b.Remaining))
	}
	if p, ok := f.policy(b.Policy); ok && p.Quota != f.Limit {
		errs = append(errs, fmt.Errorf("%s is %d but policy %q has q=%d", headers.Limit, f.Limit, p.Name, p.Quota))
	}
	return errors.Join(errs...)
}

func (f *Fields) policy(name string) (Policy, bool) {
	for _, p := range f.Policies {
		if p.Name == name {
			return p, true
		}
	}
	return Policy{}, false
}

// one returns the value of the field name, and whether it is there; a
// field sent more than once is an error.
func one(h http.Header, name string) (string, bool, error) {
	vs := h.Values(name)
	switch len(vs) {
	case 0:
		return "", false, nil
	case 1:
		return vs[0], true, nil
	}
	return "", false, fmt.Errorf("%s is sent %d times: %q", name, len(vs), vs)
}

// nonNegative parses v, the value of the field name, as a non-negative
// decimal integer.
func nonNegative(name, v string) (int64, error) {
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 || v[0] == '+' {
		return 0, fmt.Errorf("%s: %q is not a non-negative integer", name, v)
	}
	return n, nil
}

// list parses v, the value of the field name, as a structured field list.
func list(name, v string) ([]ratefields.Item, error) {
	items, ok := ratefields.Items(v)
	if !ok {
		return nil, fmt.Errorf("%s: %q is not a structured field list", name, v)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%s is empty", name)
	}
	return items, nil
}

// MustReadFields returns ReadFields(resp), failing the test if the fields
// are malformed or disagree.
func MustReadFields(tb testing.TB, resp *http.Response) Fields {
	tb.Helper()
	f, err := ReadFields(resp)
	if err != nil {
		tb.Fatalf("sluicetest: rate-limit fields of a %d response: %v\n%s", resp.StatusCode, err, dump(resp.Header))
	}
	return f
}

// AssertAllowed checks that resp was let through with remaining requests
// left: its status is not 429, it has no Retry-After, and its fields
// (X-RateLimit-Remaining, or RateLimit's r) say remaining. It fails the
// test otherwise, and returns the fields.
func AssertAllowed(tb testing.TB, resp *http.Response, remaining int) Fields {
	tb.Helper()
	f := MustReadFields(tb, resp)
	if f.Status == http.StatusTooManyRequests {
		tb.Fatalf("sluicetest: got 429, want the request admitted with %d left\n%s", remaining, dump(resp.Header))
	}
	if f.HasRetryAfter {
		tb.Errorf("sluicetest: an admitted response has Retry-After: %v", f.RetryAfter)
	}
	left, ok := f.Left()
	switch {
	case !ok:
		tb.Errorf("sluicetest: the %d response has no rate-limit fields (want %d left)\n%s", f.Status, remaining, dump(resp.Header))
	case left != int64(remaining):
		tb.Errorf("sluicetest: the %d response says %d left, want %d\n%s", f.Status, left, remaining, dump(resp.Header))
	}
	return f
}

// AssertDenied checks that resp was denied: status 429, Retry-After equal
// to retryAfter in seconds rounded up (as sluice sends it), and none left
// where the fields say. It fails the test otherwise, and returns the
// fields.
func AssertDenied(tb testing.TB, resp *http.Response, retryAfter time.Duration) Fields {
	tb.Helper()
	f := MustReadFields(tb, resp)
	if f.Status != http.StatusTooManyRequests {
		tb.Fatalf("sluicetest: got %d, want 429 with Retry-After %v\n%s", f.Status, retryAfter, dump(resp.Header))
	}
	want := time.Duration(headers.Seconds(retryAfter)) * time.Second
	switch {
	case !f.HasRetryAfter:
		tb.Errorf("sluicetest: the 429 has no Retry-After (want %v)", want)
	case f.RetryAfter != want:
		tb.Errorf("sluicetest: Retry-After is %v, want %v", f.RetryAfter, want)
	}
	if left, ok := f.Left(); ok && left != 0 {
		tb.Errorf("sluicetest: the 429 says %d left, want 0", left)
	}
	return f
}

// AssertUnlimited checks that resp carries none of the rate-limit fields,
// as a request that no rule limits (a skipped path, a route without a
// rule) gets. It fails the test otherwise.
func AssertUnlimited(tb testing.TB, resp *http.Response) {
	tb.Helper()
	for _, name := range []string{headers.Limit, headers.Remaining, headers.Reset, headers.RetryAfter, headers.RateLimit, headers.RateLimitPolicy} {
		if vs := resp.Header.Values(name); len(vs) > 0 {
			tb.Errorf("sluicetest: the %d response has %s: %q, want no rate-limit fields", resp.StatusCode, name, vs)
		}
	}
}

// dump lists the rate-limit fields of h, for a failure message.
func dump(h http.Header) string {
	var s string
	for _, name := range []string{headers.Limit, headers.Remaining, headers.Reset, headers.RetryAfter, headers.RateLimit, headers.RateLimitPolicy} {
		for _, v := range h.Values(name) {
			s += fmt.Sprintf("\t%s: %s\n", name, v)
		}
	}
	if s == "" {
		return "\t(no rate-limit fields)"
	}
	return s
}
