// Package headers writes the rate-limit response headers. Every front end
// (net/http, Gin, Echo, Fiber) uses this one writer, so clients see the same
// fields whatever serves them.
//
// Two families of fields exist:
//
//   - the widespread X-RateLimit-Limit, X-RateLimit-Remaining and
//     X-RateLimit-Reset. X-RateLimit-Reset has no standard meaning; sluice
//     sends the number of seconds until the limit is whole again, rounded up
//     (delta-seconds, as the IETF draft does), never a Unix time.
//   - the IETF draft (draft-ietf-httpapi-ratelimit-headers-10) fields
//     RateLimit-Policy: "name";q=100;w=60 (quota q per window of w seconds,
//     one item per policy that applied) and RateLimit: "name";r=42;t=18
//     (r units remaining of the named policy, and t, as the draft defines
//     it, the seconds until additional quota is made available: on an
//     allowed response until r next grows, 0 when the quota is whole; on a
//     denial the Retry-After of a one-unit request).
//
// The X-RateLimit-* fields and RateLimit describe the binding policy (the
// one that denied, or the one with the fewest units left); a request
// limited in several units at once (requests and an LLM's tokens) lists
// the other policies after it in RateLimit (Values.Others), and
// RateLimit-Policy lists every policy that applied.
//
// Retry-After, in delta-seconds rounded up, is sent only on a denial. It is
// the wait for the denied request itself, whose cost may be more than one
// unit, so on a denial t may be less than Retry-After, never more.
//
// docs/headers.md shows the fields of allowed and denied responses, the
// styles (Style) and the 429 body.
package headers

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/headerwrite"
)

// Header names. Header names are case-insensitive; net/http and fasthttp
// send them in canonical form (X-Ratelimit-Limit, Ratelimit).
const (
	Limit           = "X-RateLimit-Limit"
	Remaining       = "X-RateLimit-Remaining"
	Reset           = "X-RateLimit-Reset"
	RetryAfter      = "Retry-After"
	RateLimit       = "RateLimit"
	RateLimitPolicy = "RateLimit-Policy"
)

// Setter sets a response header, replacing any value it had. http.Header and
// *fiber.Ctx satisfy it.
type Setter interface {
	Set(key, value string)
}

// Style selects which fields Write sends.
type Style uint8

// The styles. The zero value is Both.
const (
	// Both sends the X-RateLimit-* fields and the IETF draft fields.
	Both Style = iota
	// Legacy sends X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset.
	Legacy
	// Draft sends RateLimit-Policy and RateLimit.
	Draft
	// None sends no rate-limit fields except Retry-After on a denial.
	None
)

var styleNames = [...]string{Both: "both", Legacy: "legacy", Draft: "draft", None: "none"}

// String returns the style's name: "both", "legacy", "draft" or "none".
func (s Style) String() string {
	if int(s) < len(styleNames) {
		return styleNames[s]
	}
	return "Style(" + strconv.Itoa(int(s)) + ")"
}

// ParseStyle returns the style named s ("both", "legacy", "draft" or
// "none", in any case).
func ParseStyle(s string) (Style, error) {
	for i, n := range styleNames {
		if strings.EqualFold(s, n) {
			return Style(i), nil
		}
	}
	return 0, fmt.Errorf("headers: unknown style %q (want both, legacy, draft or none)", s)
}

// Policy describes one limit for the RateLimit-Policy field.
type Policy struct {
	// Name identifies the policy; it is sent as a quoted string.
	Name string
	// Quota is the number of requests (units) per window.
	Quota int
	// Window is the window's length; it is sent in whole seconds, rounded up.
	Window time.Duration
}

// appendPolicy appends p in the form "name";q=100;w=60 to dst.
func appendPolicy(dst []byte, p Policy) []byte {
	dst = headerwrite.AppendQuoted(dst, p.Name)
	dst = append(dst, ";q="...)
	dst = strconv.AppendInt(dst, int64(p.Quota), 10)
	dst = append(dst, ";w="...)
	return strconv.AppendInt(dst, Seconds(p.Window), 10)
}

// FormatPolicies returns the value of the RateLimit-Policy field for ps,
// items separated by ", ". Callers with fixed policies compute it once.
func FormatPolicies(ps ...Policy) string {
	var b []byte
	for i, p := range ps {
		if i > 0 {
			b = append(b, ", "...)
		}
		b = appendPolicy(b, p)
	}
	return string(b)
}

// Values is what Write reports: the binding (most restrictive) policy.
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
	// Policy is the RateLimit-Policy value (see FormatPolicies), listing
	// every policy that applied. Empty omits the field.
	Policy string
	// Others, when not empty, lists the RateLimit items of the other
	// policies that applied ("chat-tokens";r=9500;t=3), sent after the
	// binding one's in the RateLimit field: a request limited in two
	// units at once (requests and tokens) reports both.
	Others string
}

// Seconds converts d to whole seconds, rounded up; negative durations give 0.
func Seconds(d time.Duration) int64 { return headerwrite.Seconds(d) }

// Write sets the fields of style from v on s, replacing earlier values.
// Retry-After is set whenever v.RetryAfter is positive, whatever the style.
//
// Write allocates a fraction of an allocation per response: the values
// that vary are carved from shared chunks of memory and share their bytes
// (with both styles, X-RateLimit-Remaining's value is the number inside
// RateLimit's). When s is an http.Header, each field is set to its own
// one-element slice, which a later Add copies rather than extends in
// place.
func Write(s Setter, style Style, v *Values) {
	headerwrite.Write(s, headerwrite.Style(style), (*headerwrite.Values)(v), nil)
}
