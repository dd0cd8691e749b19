// Package headerwrite is the writer behind package headers: it sets the
// rate-limit fields with the values that vary carved from shared chunks
// (internal/arena), and with the text that is the same on every response
// of a policy computed once (Prepared), which package middleware does for
// the limits of its static rules. Package headers documents the fields.
package headerwrite

import (
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/arena"
)

// Header names, as package headers exports them.
const (
	Limit           = "X-RateLimit-Limit"
	Remaining       = "X-RateLimit-Remaining"
	Reset           = "X-RateLimit-Reset"
	RetryAfter      = "Retry-After"
	RateLimit       = "RateLimit"
	RateLimitPolicy = "RateLimit-Policy"
)

// The fields Write may set, by index: their names as given above and in
// the canonical form http.Header keys take.
const (
	fLimit = iota
	fRemaining
	fReset
	fRateLimit
	fRetryAfter
	fPolicy
	nFields
)

var (
	names     = [nFields]string{Limit, Remaining, Reset, RateLimit, RetryAfter, RateLimitPolicy}
	canonical [nFields]string
)

func init() {
	for i, n := range names {
		canonical[i] = http.CanonicalHeaderKey(n)
	}
}

// Setter sets a response header, replacing any value it had: an unnamed
// interface, so that package headers' Setter converts to it for free.
type Setter = interface {
	Set(key, value string)
}

// Style selects which fields Write sends; package headers' Style converts
// to it.
type Style uint8

// The styles, with the values of package headers' styles.
const (
	Both Style = iota
	Legacy
	Draft
	None
)

// Values is what Write reports: the binding (most restrictive) policy.
// Its fields are those of package headers' Values, which converts to it.
type Values struct {
	// Name is the binding policy's name, used in the RateLimit field.
	Name string
	// Limit is the binding policy's quota per window.
	Limit int
	// Remaining is how many requests the binding policy still admits.
	Remaining int
	// Reset is how long until the binding policy is whole again, sent as
	// X-RateLimit-Reset.
	Reset time.Duration
	// Next is how long until the binding policy makes more quota
	// available, sent as the t parameter of RateLimit.
	Next time.Duration
	// RetryAfter, when positive, is sent as Retry-After: set it only on a
	// denial.
	RetryAfter time.Duration
	// Policy is the RateLimit-Policy value, listing every policy that
	// applied. Empty omits the field.
	Policy string
	// Others, when not empty, lists the RateLimit items of the other
	// policies that applied, sent after the binding one's in RateLimit.
	Others string
}

// Prepared is the text of the fields that is the same on every response
// of one policy: its quota as X-RateLimit-Limit sends it and the quoted
// name the RateLimit field begins with. Callers that send the same
// policies on many responses prepare each once, so that Write formats
// only what changes from response to response.
type Prepared struct {
	name      string
	limit     int
	limitText string // X-RateLimit-Limit's value
	prefix    string // the RateLimit value up to the number remaining
}

// Prepare returns the fixed text of the fields of the policy named name
// whose quota is limit, for Write.
func Prepare(name string, limit int) *Prepared {
	b := AppendQuoted(nil, name)
	return &Prepared{
		name:      name,
		limit:     limit,
		limitText: strconv.Itoa(limit),
		prefix:    string(append(b, ";r="...)),
	}
}

// Seconds converts d to whole seconds, rounded up; negative durations give 0.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// smallInts holds the decimal text of the numbers below nSmall, so that
// the delays most responses send (seconds until a window of a minute or
// less is whole again) cost no formatting and no memory.
const nSmall = 256

var smallInts = func() (t [nSmall]string) {
	var b []byte
	for i := range t {
		b = strconv.AppendInt(b, int64(i), 10)
	}
	all := string(b)
	for i := range t {
		n := len(strconv.Itoa(i))
		t[i], all = all[:n], all[n:]
	}
	return t
}()

// Write sets the fields of style from v on s, replacing earlier values.
// Retry-After is set whenever v.RetryAfter is positive, whatever the style.
// p, if not nil, holds text computed once for the binding policy (see
// Prepare); Write uses it only when it was prepared for v.Name and
// v.Limit, so a stale one costs time, never a wrong field.
//
// The values that vary are carved from shared chunks of memory (see
// internal/arena), so that writing them costs a fraction of an allocation
// per response, and share their bytes: with both styles,
// X-RateLimit-Remaining's value is the number inside RateLimit's. The
// others are computed once (see Prepared). When s is an http.Header, each
// field is set to its own one-element slice, which a later Add copies
// rather than extends in place.
func Write(s Setter, style Style, v *Values, p *Prepared) {
	a := arena.Get()
	WriteIn(a, s, style, v, p)
	arena.Put(a)
}

// WriteIn is Write carving the values from a, an Arena the caller holds
// (a request's, which spares Write the trip to the arenas' pool).
func WriteIn(a *arena.Arena, s Setter, style Style, v *Values, p *Prepared) {
	if h, ok := s.(http.Header); ok && style == Both && p != nil && v.RetryAfter <= 0 && v.Others == "" &&
		v.Policy != "" && p.limit == v.Limit && p.name == v.Name {
		writeBoth(a, h, v, p)
		return
	}
	var f fields
	n := f.build(a, style, v, p)
	if h, ok := s.(http.Header); ok {
		vs := a.Slots(n)
		for i := 0; i < n; i++ {
			vs[i] = f.values[i]
			h[canonical[f.ids[i]]] = vs[i : i+1 : i+1]
		}
	} else {
		for i := 0; i < n; i++ {
			s.Set(names[f.ids[i]], f.values[i])
		}
	}
}

// writeBoth is WriteIn for what most responses send: both styles of a
// prepared policy to an http.Header, with no Retry-After and no other
// policies. It sets what build would, in fewer steps.
func writeBoth(a *arena.Arena, h http.Header, v *Values, p *Prepared) {
	var stack [96]byte
	buf := append(stack[:0], p.prefix...)
	remStart := len(buf)
	buf = strconv.AppendInt(buf, int64(max(v.Remaining, 0)), 10)
	remEnd := len(buf)
	buf = append(buf, ";t="...)
	buf = strconv.AppendInt(buf, Seconds(v.Next), 10)
	rateEnd := len(buf)
	var reset span
	buf, reset = number(buf, Seconds(v.Reset))
	all := a.String(buf)
	vs := a.Slots(5)
	vs[0], vs[1], vs[2], vs[3], vs[4] = p.limitText, all[remStart:remEnd], reset.in(all), all[:rateEnd], v.Policy
	h[canonical[fLimit]] = vs[0:1:1]
	h[canonical[fRemaining]] = vs[1:2:2]
	h[canonical[fReset]] = vs[2:3:3]
	h[canonical[fRateLimit]] = vs[3:4:4]
	h[canonical[fPolicy]] = vs[4:5:5]
}

// fields holds at most six fields.
type fields struct {
	ids    [nFields]int
	values [nFields]string
}

// span is where a value lies in the text fields.build carves, or when
// end is 0, the value itself.
type span struct {
	start, end int
	text       string
}

// number returns the decimal text of n: one of smallInts, or else
// appended to buf.
func number(buf []byte, n int64) ([]byte, span) {
	if 0 <= n && n < nSmall {
		return buf, span{text: smallInts[n]}
	}
	start := len(buf)
	buf = strconv.AppendInt(buf, n, 10)
	return buf, span{start: start, end: len(buf)}
}

func (f *fields) build(a *arena.Arena, style Style, v *Values, p *Prepared) int {
	if p != nil && (p.limit != v.Limit || p.name != v.Name) {
		p = nil
	}
	legacy, draft := style == Both || style == Legacy, style == Both || style == Draft
	// The values that vary are built on the stack (every number fits in
	// 20 bytes and names are short), then copied out in one piece; the
	// others were computed once (Prepared, smallInts).
	var stack [192]byte
	buf := stack[:0]
	var limit, remaining, reset, rateLimit, retry span
	rem := int64(max(v.Remaining, 0))
	if draft {
		rateLimit.start = len(buf)
		if p != nil {
			buf = append(buf, p.prefix...)
		} else {
			buf = AppendQuoted(buf, v.Name)
			buf = append(buf, ";r="...)
		}
		remaining.start = len(buf)
		buf = strconv.AppendInt(buf, rem, 10)
		remaining.end = len(buf)
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, Seconds(v.Next), 10)
		if v.Others != "" {
			buf = append(buf, ", "...)
			buf = append(buf, v.Others...)
		}
		rateLimit.end = len(buf)
	}
	if legacy {
		if p != nil {
			limit.text = p.limitText
		} else {
			buf, limit = number(buf, int64(v.Limit))
		}
		if !draft {
			buf, remaining = number(buf, rem)
		}
		buf, reset = number(buf, Seconds(v.Reset))
	}
	if v.RetryAfter > 0 {
		buf, retry = number(buf, Seconds(v.RetryAfter))
	}
	all := a.String(buf)
	n := 0
	if legacy {
		f.ids[0], f.values[0] = fLimit, limit.in(all)
		f.ids[1], f.values[1] = fRemaining, remaining.in(all)
		f.ids[2], f.values[2] = fReset, reset.in(all)
		n = 3
	}
	if draft {
		f.ids[n], f.values[n] = fRateLimit, rateLimit.in(all)
		n++
	}
	if v.RetryAfter > 0 {
		f.ids[n], f.values[n] = fRetryAfter, retry.in(all)
		n++
	}
	if draft && v.Policy != "" {
		f.ids[n], f.values[n] = fPolicy, v.Policy
		n++
	}
	return n
}

// in returns the value sp marks in all.
func (sp span) in(all string) string {
	if sp.end == 0 {
		return sp.text
	}
	return all[sp.start:sp.end]
}

// AppendQuoted appends s as a structured-field string: in double quotes,
// with backslash and double quote escaped. Other bytes outside printable
// ASCII cannot be sent and are replaced by '?'.
func AppendQuoted(dst []byte, s string) []byte {
	dst = append(dst, '"')
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			dst = append(dst, '\\', c)
		case c < 0x20 || c > 0x7e:
			dst = append(dst, '?')
		default:
			dst = append(dst, c)
		}
	}
	return append(dst, '"')
}
