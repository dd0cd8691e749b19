package middleware

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/keyfunc"
)

// ContentTypeJSON is the Content-Type of the default responses.
const ContentTypeJSON = "application/json; charset=utf-8"

// DenyBody returns the default body of a 429 response for res, for example
//
//	{"error":"rate limit exceeded","policy":"default","limit":100,"window_seconds":60,"retry_after_seconds":3}
//
// retry_after_seconds is Retry-After's value; it is left out when waiting
// would not help (the request costs more than the limit).
//
// A request denied by a concurrency limit gets
//
//	{"error":"too many requests in flight","policy":"reports","limit":2,"retry_after_seconds":1}
//
// A request a Deny rule turns away gets
//
//	{"error":"request denied by rule","policy":"blocklist"}
//
// and one that no rule applies to, under UnmatchedDeny,
//
//	{"error":"no rate-limit rule applies to the request"}
func DenyBody(res *Result) []byte {
	if res.Outcome == OutcomeUnmatched {
		return []byte(unmatchedBody)
	}
	b := make([]byte, 0, 128)
	if res.blocked {
		b = append(b, `{"error":"request denied by rule","policy":`...)
		b = strconv.AppendQuote(b, res.Policy)
		return append(b, "}\n"...)
	}
	if res.Concurrency {
		b = append(b, `{"error":"too many requests in flight","policy":`...)
		b = strconv.AppendQuote(b, res.Policy)
		b = append(b, `,"limit":`...)
		b = strconv.AppendInt(b, int64(res.Limit.Requests), 10)
		b = append(b, `,"retry_after_seconds":`...)
		b = strconv.AppendInt(b, headers.Seconds(res.RetryAfter), 10)
		return append(b, "}\n"...)
	}
	switch {
	case res.RetryAfter < 0:
		b = append(b, `{"error":"request cost exceeds the rate limit"`...)
	case res.Banned:
		b = append(b, `{"error":"banned for exceeding the rate limit"`...)
	default:
		b = append(b, `{"error":"rate limit exceeded"`...)
	}
	b = append(b, `,"policy":`...)
	b = strconv.AppendQuote(b, res.Policy)
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, int64(res.Limit.Capacity()), 10)
	b = append(b, `,"window_seconds":`...)
	b = strconv.AppendInt(b, headers.Seconds(res.Limit.Span()), 10)
	if res.RetryAfter >= 0 {
		b = append(b, `,"retry_after_seconds":`...)
		b = strconv.AppendInt(b, headers.Seconds(res.RetryAfter), 10)
	}
	return append(b, "}\n"...)
}

// DefaultDenyHandler answers a denied request with DenyStatus (429 Too Many
// Requests, or a concurrency limit's 503) and DenyBody as JSON. The
// rate-limit headers are already set.
func DefaultDenyHandler(w http.ResponseWriter, r *http.Request) {
	res, _ := ResultFromContext(r.Context())
	writeJSON(w, DenyStatus(&res), DenyBody(&res))
}

// DenyStatus returns the status of a denied request: 429 Too Many
// Requests, or 503 Service Unavailable for a concurrency limit whose rule
// asks for it (Rule.ConcurrencyStatus) and for a request no rule applies to
// under UnmatchedDeny.
func DenyStatus(res *Result) int {
	if res.status != 0 {
		return res.status
	}
	return http.StatusTooManyRequests
}

// ErrorResponse returns the status and JSON body DefaultErrorHandler sends
// for err: 400 Bad Request when the request had no key, 503 Service
// Unavailable otherwise. The body never includes err's text, which may
// describe internals.
func ErrorResponse(err error) (status int, body []byte) {
	if errors.Is(err, keyfunc.ErrNoKey) {
		return http.StatusBadRequest, []byte(`{"error":"request has no rate-limit key (for example a missing API key)"}` + "\n")
	}
	return http.StatusServiceUnavailable, []byte(`{"error":"rate limiter unavailable"}` + "\n")
}

// DefaultErrorHandler answers a request that could not be decided with
// ErrorResponse.
func DefaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	status, body := ErrorResponse(err)
	writeJSON(w, status, body)
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", ContentTypeJSON)
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
