package sluicegin

import (
	"bufio"
	"net"

	"github.com/gin-gonic/gin"

	"github.com/sluicehq/sluice/middleware"
)

// Config configures New.
type Config struct {
	// Limiter decides every request. Required.
	Limiter *middleware.Limiter

	// Skip, when it reports true, lets the request through unlimited and
	// without rate-limit headers. Optional.
	Skip func(c *gin.Context) bool

	// DenyHandler answers a denied request. The rate-limit headers and
	// Retry-After are already set, ResultFrom(c) gives the decision, and
	// the chain is aborted after it returns. Default: DefaultDenyHandler.
	DenyHandler gin.HandlerFunc

	// ErrorHandler answers a request the Limiter could not decide: a
	// missing key (errors.Is(err, keyfunc.ErrNoKey)) or a store failure
	// under middleware.FailClosed (errors.Is(err, middleware.ErrStore)).
	// The chain is aborted after it returns. Default: DefaultErrorHandler.
	ErrorHandler func(c *gin.Context, err error)
}

// New returns Gin middleware that rate-limits requests with cfg.Limiter:
// an allowed request continues with rate-limit headers set, a denied one
// gets cfg.DenyHandler and one that cannot be decided cfg.ErrorHandler.
//
// New panics if cfg.Limiter is nil.
func New(cfg Config) gin.HandlerFunc {
	if cfg.Limiter == nil {
		panic("sluicegin: New expects a Config with a non-nil Limiter")
	}
	l, skip, deny, onError := cfg.Limiter, cfg.Skip, cfg.DenyHandler, cfg.ErrorHandler
	if deny == nil {
		deny = DefaultDenyHandler
	}
	if onError == nil {
		onError = DefaultErrorHandler
	}
	return func(c *gin.Context) {
		if skip != nil && skip(c) {
			c.Next()
			return
		}
		res, err := l.Decide(request{c})
		if err != nil {
			onError(c, err)
			c.Abort()
			return
		}
		l.WriteHeaders(c.Writer.Header(), &res)
		if !res.Allowed {
			// A copy, so that res itself stays off the heap when allowed.
			denied := res
			c.Set(resultKey, &denied)
			deny(c)
			c.Abort()
			return
		}
		// Concurrency slots are given back, a rule that counts by outcome
		// charged by the status, and usage limits settled, once the
		// handlers return; a panic counts as 500.
		status := 0
		defer func() { res.Finish(status) }()
		if ctx := c.Request.Context(); middleware.ContextWithResult(ctx, &res) != ctx {
			// Usage limits: handlers settle through the request's
			// context, or the usage header, taken before the header is
			// sent (or, as a trailer, when they return).
			c.Request = c.Request.WithContext(middleware.ContextWithResult(ctx, &res))
			w := &usageWriter{ResponseWriter: c.Writer, res: res}
			c.Writer = w
			defer func() { _ = w.res.SettleFrom(w.ResponseWriter.Header()) }()
		}
		c.Next()
		status = c.Writer.Status()
	}
}

// usageWriter takes the usage header of a request with usage limits
// (middleware.Usage.Header) off the response before its header is sent.
// res is a copy of the request's Result, so that the Result itself stays
// on the stack: both share what the request owes.
type usageWriter struct {
	gin.ResponseWriter
	res   middleware.Result
	taken bool
}

func (w *usageWriter) take() {
	if !w.taken {
		w.taken = true
		_ = w.res.SettleFrom(w.ResponseWriter.Header())
	}
}

func (w *usageWriter) WriteHeaderNow() { w.take(); w.ResponseWriter.WriteHeaderNow() }

func (w *usageWriter) Write(b []byte) (int, error) { w.take(); return w.ResponseWriter.Write(b) }

func (w *usageWriter) WriteString(s string) (int, error) {
	w.take()
	return w.ResponseWriter.WriteString(s)
}

func (w *usageWriter) Flush() { w.take(); w.ResponseWriter.Flush() }

func (w *usageWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.take()
	return w.ResponseWriter.Hijack()
}

type contextKey struct{ name string }

// resultKey is a pointer so that it fits in an interface without allocating.
var resultKey = &contextKey{"sluicegin.result"}

// ResultFrom returns the decision on a denied request; a DenyHandler reads
// it to build its response. It reports false outside a DenyHandler.
func ResultFrom(c *gin.Context) (middleware.Result, bool) {
	v, _ := c.Get(resultKey)
	res, ok := v.(*middleware.Result)
	if !ok {
		return middleware.Result{}, false
	}
	return *res, true
}

// DefaultDenyHandler answers middleware.DenyStatus (429 Too Many Requests,
// or a concurrency limit's 503) with middleware.DenyBody, as
// middleware.DefaultDenyHandler does for net/http.
func DefaultDenyHandler(c *gin.Context) {
	res, _ := ResultFrom(c)
	writeJSON(c, middleware.DenyStatus(&res), middleware.DenyBody(&res))
}

// DefaultErrorHandler answers with middleware.ErrorResponse (400 for a
// missing key, 503 otherwise), as middleware.DefaultErrorHandler does.
func DefaultErrorHandler(c *gin.Context, err error) {
	status, body := middleware.ErrorResponse(err)
	writeJSON(c, status, body)
}

func writeJSON(c *gin.Context, status int, body []byte) {
	c.Header("X-Content-Type-Options", "nosniff")
	c.Data(status, middleware.ContentTypeJSON, body)
}
