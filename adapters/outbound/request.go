package outbound

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/keyfunc"
)

// Request is the keyfunc.Request the transport gives its Limiter for an
// outgoing request: its method, its URL's path and query, and its headers;
// Header("Host") is the host the request goes to. Its Context is the
// request's, bounded by the transport's maximum wait. It has no remote
// address (keyfunc.RemoteIP finds no key) and no route. Key functions and
// rules' CostFunc and Match may read the *http.Request itself
// (HTTPRequest).
type Request struct {
	req *http.Request
	ctx context.Context
}

var _ keyfunc.QueryRequest = (*Request)(nil)

// Context is the request's context, with the deadline of the wait.
func (r *Request) Context() context.Context { return r.ctx }

// Method is the request's method ("GET" when empty, as net/http sends it).
func (r *Request) Method() string {
	if r.req.Method == "" {
		return http.MethodGet
	}
	return r.req.Method
}

// Path is the path of the request's URL.
func (r *Request) Path() string { return r.req.URL.Path }

// Route is "": an outgoing request matched no route of this server.
func (r *Request) Route() string { return "" }

// RemoteAddr is "": an outgoing request has no peer yet.
func (r *Request) RemoteAddr() string { return "" }

// Header returns the first value of the named header; "Host" gives the
// host the request goes to.
func (r *Request) Header(name string) string {
	if strings.EqualFold(name, "Host") {
		return host(r.req)
	}
	return r.req.Header.Get(name)
}

// Values returns the values of the named header; "Host" gives the host
// the request goes to.
func (r *Request) Values(name string) []string {
	if strings.EqualFold(name, "Host") {
		return []string{host(r.req)}
	}
	return r.req.Header.Values(name)
}

// Query returns the first value of the named query parameter of the
// request's URL.
func (r *Request) Query(name string) string { return r.req.URL.Query().Get(name) }

// HTTPRequest returns the outgoing *http.Request behind r, when r is the
// Request of an outbound transport: for key functions, CostFunc and Match
// that need more than keyfunc.Request shows. The request must not be
// changed.
func HTTPRequest(r keyfunc.Request) (*http.Request, bool) {
	if or, ok := r.(*Request); ok {
		return or.req, true
	}
	return nil, false
}

// host is the host (and port, if any) req goes to, in lower case: its Host
// field when set, else its URL's.
func host(req *http.Request) string {
	h := req.Host
	if h == "" && req.URL != nil {
		h = req.URL.Host
	}
	return strings.ToLower(h)
}

// maxKeyLen is the longest value Host and FromContext put into a key as
// is; a longer one is hashed.
const maxKeyLen = 128

// boundedKey is prefix:value with value escaped, or prefix#hash for a long
// value.
func boundedKey(prefix, v string) string {
	if len(v) > maxKeyLen {
		return prefix + "#" + keyfunc.Hash(v)
	}
	return prefix + ":" + keyfunc.Escape(v)
}

var errNoHost = fmt.Errorf("outbound: request without a host: %w", keyfunc.ErrNoKey)

// Host returns a key function that keys an outgoing request by the host
// it goes to, with its port if the URL has one: "host:api.github.com",
// "host:127.0.0.1:8080". A rule keyed by Host gives each upstream a budget
// of its own. On a request that is not an outgoing one it keys by the
// Host header.
func Host() keyfunc.Func {
	return func(r keyfunc.Request) (string, error) {
		h := r.Header("Host")
		if h == "" {
			return "", errNoHost
		}
		return boundedKey("host", strings.ToLower(h)), nil
	}
}

type ctxKey struct{ name string }

var (
	keyKey  = &ctxKey{"key"}
	costKey = &ctxKey{"cost"}
)

// WithKey returns a copy of ctx that carries key, for FromContext: the
// tenant a request is made for, say, when the upstream gives each tenant a
// budget of its own.
func WithKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyKey, key)
}

var errNoContextKey = fmt.Errorf("outbound: no key in the request's context (WithKey): %w", keyfunc.ErrNoKey)

// FromContext returns a key function that keys a request by the key
// WithKey put into its context: "ctx:tenant-42" (the value escaped as
// keyfunc.Escape does, or hashed, "ctx#<hash>", when longer than 128
// bytes). A request without one has no key (keyfunc.ErrNoKey). Combine it
// with Host for a budget per tenant and upstream:
// keyfunc.Join(outbound.Host(), outbound.FromContext()).
func FromContext() keyfunc.Func {
	return func(r keyfunc.Request) (string, error) {
		v, _ := r.Context().Value(keyKey).(string)
		if v == "" {
			return "", errNoContextKey
		}
		return boundedKey("ctx", v), nil
	}
}

// WithCost returns a copy of ctx that carries a request's cost, for Cost:
// the tokens an LLM request is expected to use, say.
func WithCost(ctx context.Context, units int) context.Context {
	return context.WithValue(ctx, costKey, units)
}

// Cost is a CostFunc for rules of outgoing requests: the cost WithCost put
// into the request's context, or 1. Give it to a rule whose limits count
// units other than requests (tokens, bytes) as its CostFunc.
func Cost(r keyfunc.Request) int {
	if n, ok := r.Context().Value(costKey).(int); ok && n > 0 {
		return n
	}
	return 1
}
