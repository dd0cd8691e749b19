// Package ratefields reads the rate-limit fields that an upstream API sends
// in its responses, for a client that wants to stay within the upstream's
// limits:
//
//   - Retry-After, in delay-seconds or as an HTTP date (RFC 9110, section
//     10.2.3);
//   - the IETF fields RateLimit and RateLimit-Policy
//     (draft-ietf-httpapi-ratelimit-headers-10): RateLimit: "name";r=0;t=12
//     and RateLimit-Policy: "name";q=100;w=60;
//   - X-RateLimit-Limit, X-RateLimit-Remaining and X-RateLimit-Reset, the
//     reset in seconds from now or, as GitHub sends it, a Unix time;
//   - the fields of OpenAI's API: x-ratelimit-limit-requests,
//     x-ratelimit-remaining-requests and x-ratelimit-reset-requests (a
//     duration such as "1s" or "6m0s"), and the same for tokens.
//
// Every field is untrusted input: Parse never panics, reads at most
// MaxFieldLen bytes of a field and MaxItems items of a list, ignores what
// it cannot read whole (a negative number, garbage, a structured field
// with a syntax error), caps every count at MaxCount and every duration at
// MaxWait, and takes linear time in the size of the fields. Callers apply
// their own, shorter, caps on top (the outbound transport caps a pause at
// its MaxPause). docs/outbound.md says what the transport does with each
// field.
package ratefields

import (
	"net/http"
	"strings"
	"time"
)

const (
	// MaxWait is the longest duration Parse reports: a longer
	// Retry-After or reset, such as ten years, is read as MaxWait.
	MaxWait = 24 * time.Hour
	// MaxCount is the largest count (a limit, a number remaining) Parse
	// reports: 2^50, the largest limit sluice counts.
	MaxCount = 1 << 50
	// MaxFieldLen is the longest field value Parse reads; a longer one is
	// ignored.
	MaxFieldLen = 4096
	// MaxItems is how many items of a structured list (RateLimit,
	// RateLimit-Policy) Parse reads; a list with more is ignored.
	MaxItems = 32
)

// The field names Parse reads.
const (
	RetryAfter        = "Retry-After"
	RateLimit         = "RateLimit"
	RateLimitPolicy   = "RateLimit-Policy"
	XLimit            = "X-RateLimit-Limit"
	XRemaining        = "X-RateLimit-Remaining"
	XReset            = "X-RateLimit-Reset"
	LimitRequests     = "X-Ratelimit-Limit-Requests"
	RemainingRequests = "X-Ratelimit-Remaining-Requests"
	ResetRequests     = "X-Ratelimit-Reset-Requests"
	LimitTokens       = "X-Ratelimit-Limit-Tokens"
	RemainingTokens   = "X-Ratelimit-Remaining-Tokens"
	ResetTokens       = "X-Ratelimit-Reset-Tokens"
)

// Source names the family of fields a Budget was read from.
type Source uint8

// The sources.
const (
	// None: no field said anything of the budget.
	None Source = iota
	// IETF: the RateLimit field (and RateLimit-Policy).
	IETF
	// XRateLimit: X-RateLimit-Remaining (and -Limit, -Reset).
	XRateLimit
	// OpenAI: x-ratelimit-remaining-requests or -tokens (and their limit
	// and reset).
	OpenAI
)

var sourceNames = [...]string{None: "none", IETF: "ietf", XRateLimit: "x-ratelimit", OpenAI: "openai"}

// String returns the source's name: "none", "ietf", "x-ratelimit" or
// "openai".
func (s Source) String() string {
	if int(s) < len(sourceNames) {
		return sourceNames[s]
	}
	return "unknown"
}

// Budget is what an upstream said of one of its budgets (requests, or
// tokens) for the client.
type Budget struct {
	// Source is where it was read; None when nothing was, and then the
	// other fields are zero.
	Source Source
	// Remaining is how many units the upstream said the client has left.
	Remaining int64
	// Limit is the budget's quota, 0 when not sent.
	Limit int64
	// Reset is how long until more units are available (the draft's t,
	// X-RateLimit-Reset, x-ratelimit-reset-*), 0 when not sent or when
	// they are available now.
	Reset time.Duration
	// Window is the window of the quota (RateLimit-Policy's w), 0 when not
	// sent.
	Window time.Duration
	// Policy is the name of the IETF policy, "" for the other sources.
	Policy string
}

// Known reports whether the upstream said how much of the budget is left.
func (b Budget) Known() bool { return b.Source != None }

// Policy is a quota an upstream announced in its RateLimit-Policy field.
type Policy struct {
	// Name is the policy's name.
	Name string
	// Quota is how many units it admits per Window.
	Quota int64
	// Window is its window; 0 when the field did not say.
	Window time.Duration
}

// Fields is what Parse read from a response.
type Fields struct {
	// RetryAfter is the wait Retry-After asks for; HasRetryAfter reports
	// whether the field was there and readable (a date in the past reads
	// as a zero wait).
	RetryAfter    time.Duration
	HasRetryAfter bool
	// Requests is the budget of requests: from the RateLimit field (its
	// item with the fewest units remaining), else the X-RateLimit fields,
	// else OpenAI's -requests fields.
	Requests Budget
	// Tokens is the budget of tokens, from OpenAI's -tokens fields.
	Tokens Budget
	// Policies are the quotas of the RateLimit-Policy field, in its order.
	Policies []Policy
}

// Parse reads the rate-limit fields of a response's header h, received
// at now. An HTTP date and a Unix time are read against now when the
// response's own Date field agrees with now to its resolution (now is
// within a second after it, or a tenth of one before), else against that
// Date (so that the upstream's clock skew does not matter): a Date is in
// whole seconds, and reading a reset of whole seconds against it would
// wait up to a second longer than the upstream asks.
func Parse(h http.Header, now time.Time) Fields {
	var f Fields
	base := now
	if d, ok := field(h, "Date"); ok {
		if t, err := http.ParseTime(d); err == nil && (now.Before(t.Add(-dateSlack)) || !now.Before(t.Add(time.Second+dateSlack))) {
			base = t
		}
	}
	if v, ok := field(h, RetryAfter); ok {
		f.RetryAfter, f.HasRetryAfter = retryAfter(v, base)
	}
	f.Policies = policies(h)
	f.Requests = ietf(h, f.Policies)
	if !f.Requests.Known() {
		f.Requests = budget(h, XRateLimit, XLimit, XRemaining, XReset, func(v string) time.Duration { return reset(v, base) })
	}
	if !f.Requests.Known() {
		f.Requests = budget(h, OpenAI, LimitRequests, RemainingRequests, ResetRequests, openAIReset)
	}
	f.Tokens = budget(h, OpenAI, LimitTokens, RemainingTokens, ResetTokens, openAIReset)
	return f
}

// dateSlack is how far outside the second of a response's Date now may be
// and still agree with it: the answer's own travel, and the rounding of
// the clocks.
const dateSlack = 100 * time.Millisecond

// field returns the first value of the named field, trimmed, if it is
// there and not too long.
func field(h http.Header, name string) (string, bool) {
	vs := h[name]
	if len(vs) == 0 {
		vs = h.Values(name)
	}
	if len(vs) == 0 || len(vs[0]) > MaxFieldLen {
		return "", false
	}
	v := strings.TrimSpace(vs[0])
	return v, v != ""
}

// retryAfter reads a Retry-After value: delay-seconds (a decimal fraction
// is accepted) or an HTTP date, read against base.
func retryAfter(v string, base time.Time) (time.Duration, bool) {
	if d, ok := seconds(v); ok {
		return d, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return until(t, base), true
}

// until is t - base, floored at 0 and capped at MaxWait.
func until(t, base time.Time) time.Duration {
	if !t.After(base) {
		return 0
	}
	if t.Sub(base) > MaxWait || t.After(base.Add(MaxWait)) {
		return MaxWait
	}
	return t.Sub(base)
}

// unixThreshold is where a reset stops being read as seconds from now and
// starts being read as a Unix time: 10^9 seconds (September 2001) is far
// past any wait, and far before any date an upstream would send.
const unixThreshold = 1_000_000_000

// budget reads a budget of one source from the fields of its limit,
// remaining count and reset, the reset read by readReset (0 when it cannot
// be read). The remaining count is required.
func budget(h http.Header, src Source, limit, remaining, resetName string, readReset func(string) time.Duration) Budget {
	rem, ok := field(h, remaining)
	if !ok {
		return Budget{}
	}
	n, ok := count(rem)
	if !ok {
		return Budget{}
	}
	b := Budget{Source: src, Remaining: n}
	if v, ok := field(h, limit); ok {
		b.Limit, _ = count(v)
	}
	if v, ok := field(h, resetName); ok {
		b.Reset = readReset(v)
	}
	return b
}

// reset reads X-RateLimit-Reset: seconds from now, or a Unix time in
// seconds (at least unixThreshold) or milliseconds (at least
// unixThreshold × 1000). It returns 0 for what it cannot read.
func reset(v string, base time.Time) time.Duration {
	whole, frac, ok := decimal(v)
	if !ok {
		return 0
	}
	switch {
	case whole >= unixThreshold*1000:
		return until(time.UnixMilli(min(whole, 1<<52)), base)
	case whole >= unixThreshold:
		return until(time.Unix(whole, int64(frac)*int64(time.Millisecond)), base)
	}
	return capWait(whole, frac)
}

// ietf reads the RateLimit field: of its items with a remaining count,
// the one with the fewest units left (of those, the one with the longest
// wait), with its quota and window from the policy of the same name.
func ietf(h http.Header, ps []Policy) Budget {
	v, ok := field(h, RateLimit)
	if !ok {
		return Budget{}
	}
	items, ok := parseList(v)
	if !ok {
		return Budget{}
	}
	var best Budget
	for _, it := range items {
		r, ok := it.param("r")
		if !ok || r.kind != kindInt || r.n < 0 {
			continue
		}
		b := Budget{Source: IETF, Remaining: min(r.n, MaxCount), Policy: it.name}
		if t, ok := it.param("t"); ok && t.kind == kindInt && t.n >= 0 {
			b.Reset = capWait(t.n, 0)
		}
		if best.Known() && (b.Remaining > best.Remaining || b.Remaining == best.Remaining && b.Reset <= best.Reset) {
			continue
		}
		best = b
	}
	if !best.Known() {
		return best
	}
	for _, p := range ps {
		if p.Name == best.Policy {
			best.Limit, best.Window = p.Quota, p.Window
			break
		}
	}
	return best
}

// policies reads the RateLimit-Policy field: its items with a quota.
func policies(h http.Header) []Policy {
	v, ok := field(h, RateLimitPolicy)
	if !ok {
		return nil
	}
	items, ok := parseList(v)
	if !ok {
		return nil
	}
	var out []Policy
	for _, it := range items {
		q, ok := it.param("q")
		if !ok || q.kind != kindInt || q.n <= 0 {
			continue
		}
		p := Policy{Name: it.name, Quota: min(q.n, MaxCount)}
		if w, ok := it.param("w"); ok && w.kind == kindInt && w.n > 0 {
			p.Window = capWait(w.n, 0)
		}
		out = append(out, p)
	}
	return out
}

// count reads a count: a non-negative whole number (a fraction is
// dropped), capped at MaxCount.
func count(v string) (int64, bool) {
	whole, _, ok := decimal(v)
	if !ok {
		return 0, false
	}
	return min(whole, MaxCount), true
}

// seconds reads non-negative decimal seconds, capped at MaxWait.
func seconds(v string) (time.Duration, bool) {
	whole, frac, ok := decimal(v)
	if !ok {
		return 0, false
	}
	return capWait(whole, frac), true
}

// capWait is whole seconds and frac milliseconds, rounded up to the
// millisecond, capped at MaxWait.
func capWait(whole int64, frac int) time.Duration {
	if whole >= int64(MaxWait/time.Second) {
		return MaxWait
	}
	return min(time.Duration(whole)*time.Second+time.Duration(frac)*time.Millisecond, MaxWait)
}

// maxWhole caps the whole part decimal reads: more digits are read as
// this, which every caller caps further.
const maxWhole = 1 << 53

// decimal reads a non-negative decimal number, digits with an optional
// fraction ("12", "1.5", "0.001"): its whole part (capped at maxWhole)
// and its fraction in milliseconds, rounded up. Signs, exponents, spaces
// inside and empty parts are refused.
func decimal(v string) (whole int64, fracMs int, ok bool) {
	i := 0
	for ; i < len(v) && v[i] >= '0' && v[i] <= '9'; i++ {
		if whole < maxWhole {
			whole = whole*10 + int64(v[i]-'0')
		}
	}
	if i == 0 {
		return 0, 0, false
	}
	whole = min(whole, maxWhole)
	if i == len(v) {
		return whole, 0, true
	}
	if v[i] != '.' || i+1 == len(v) {
		return 0, 0, false
	}
	scale, rest := 100, false
	for j := i + 1; j < len(v); j++ {
		c := v[j]
		if c < '0' || c > '9' {
			return 0, 0, false
		}
		if scale > 0 {
			fracMs += int(c-'0') * scale
			scale /= 10
		} else if c != '0' {
			rest = true
		}
	}
	if rest {
		fracMs++
	}
	if fracMs == 1000 {
		whole, fracMs = min(whole+1, maxWhole), 0
	}
	return whole, fracMs, true
}

// openAIReset reads one of OpenAI's resets, 0 when it cannot.
func openAIReset(v string) time.Duration {
	d, _ := duration(v)
	return d
}

// duration reads a duration as OpenAI sends it ("1s", "6m0s", "20ms",
// "1h2m3.5s") or as plain decimal seconds ("1.5"): non-negative, capped at
// MaxWait. Units are h, m, s, ms, us (or µs) and ns.
func duration(v string) (time.Duration, bool) {
	if d, ok := seconds(v); ok {
		return d, true
	}
	if len(v) > 64 {
		return 0, false
	}
	var total time.Duration
	for v != "" {
		whole, frac, n := number(v)
		if n == 0 {
			return 0, false
		}
		v = v[n:]
		u := 0
		for u < len(v) && (v[u] < '0' || v[u] > '9') && v[u] != '.' {
			u++
		}
		unit, ok := units[v[:u]]
		if !ok {
			return 0, false
		}
		v = v[u:]
		// whole is at most 64 digits' worth, capped: the product is
		// bounded before it is added.
		part := min(whole, int64(MaxWait/unit)+1)*int64(unit) + int64(frac*float64(unit))
		total = min(total+time.Duration(part), MaxWait)
	}
	return total, true
}

var units = map[string]time.Duration{
	"h": time.Hour, "m": time.Minute, "s": time.Second, "ms": time.Millisecond,
	"us": time.Microsecond, "µs": time.Microsecond, "ns": time.Nanosecond,
}

// number reads digits with an optional fraction at the start of v: the
// whole part (capped), the fraction, and how many bytes it took (0 for
// none).
func number(v string) (whole int64, frac float64, n int) {
	for ; n < len(v) && v[n] >= '0' && v[n] <= '9'; n++ {
		if whole < maxWhole {
			whole = whole*10 + int64(v[n]-'0')
		}
	}
	digits := n
	if n < len(v) && v[n] == '.' {
		n++
		scale := 0.1
		for ; n < len(v) && v[n] >= '0' && v[n] <= '9'; n++ {
			frac += float64(v[n]-'0') * scale
			scale /= 10
		}
		if n == digits+1 && digits == 0 {
			return 0, 0, 0 // a lone "."
		}
	}
	return min(whole, maxWhole), frac, n
}
