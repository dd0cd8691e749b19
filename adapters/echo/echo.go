package sluiceecho

import (
	"errors"
	"net/http"
	"sync"

	"github.com/labstack/echo/v4"
	echomw "github.com/labstack/echo/v4/middleware"

	"github.com/sluicehq/sluice/middleware"
)

// Config configures RateLimiterWithConfig.
type Config struct {
	// Skipper, when it reports true, lets the request through unlimited and
	// without rate-limit headers. Default: echo's middleware.DefaultSkipper.
	Skipper echomw.Skipper

	// Limiter decides every request. Required.
	Limiter *middleware.Limiter

	// DenyHandler answers a denied request, whose decision is res. The
	// rate-limit headers and Retry-After are already set. Its error is
	// returned to Echo. Default: DefaultDenyHandler.
	DenyHandler func(c echo.Context, res middleware.Result) error

	// ErrorHandler answers a request the Limiter could not decide: a
	// missing key (errors.Is(err, keyfunc.ErrNoKey)) or a store failure
	// under middleware.FailClosed (errors.Is(err, middleware.ErrStore)).
	// Its error is returned to Echo. Default: DefaultErrorHandler.
	ErrorHandler func(c echo.Context, err error) error
}

// DefaultConfig is the default Config, without its required Limiter.
var DefaultConfig = Config{
	Skipper:      echomw.DefaultSkipper,
	DenyHandler:  DefaultDenyHandler,
	ErrorHandler: DefaultErrorHandler,
}

// RateLimiter returns Echo middleware that rate-limits requests with l and
// the defaults of DefaultConfig. It panics if l is nil.
func RateLimiter(l *middleware.Limiter) echo.MiddlewareFunc {
	cfg := DefaultConfig
	cfg.Limiter = l
	return RateLimiterWithConfig(cfg)
}

// RateLimiterWithConfig returns Echo middleware that rate-limits requests
// with cfg.Limiter: an allowed request continues with rate-limit headers
// set, a denied one gets cfg.DenyHandler and one that cannot be decided
// cfg.ErrorHandler. Nil fields take their value from DefaultConfig.
//
// RateLimiterWithConfig panics if cfg.Limiter is nil.
func RateLimiterWithConfig(cfg Config) echo.MiddlewareFunc {
	if cfg.Limiter == nil {
		panic("sluiceecho: RateLimiterWithConfig expects a Config with a non-nil Limiter")
	}
	if cfg.Skipper == nil {
		cfg.Skipper = DefaultConfig.Skipper
	}
	if cfg.DenyHandler == nil {
		cfg.DenyHandler = DefaultConfig.DenyHandler
	}
	if cfg.ErrorHandler == nil {
		cfg.ErrorHandler = DefaultConfig.ErrorHandler
	}
	l := cfg.Limiter
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if cfg.Skipper(c) {
				return next(c)
			}
			req := requests.Get().(*request)
			req.c = c
			res, err := l.Decide(req)
			req.c = nil
			requests.Put(req)
			if err != nil {
				return cfg.ErrorHandler(c, err)
			}
			l.WriteHeaders(c.Response().Header(), &res)
			if !res.Allowed {
				return cfg.DenyHandler(c, res)
			}
			// Concurrency slots are given back, a rule that counts by
			// outcome charged by the status, and usage limits settled,
			// once next returns; a panic counts as 500.
			status := 0
			defer func() { res.Finish(status) }()
			if ctx := c.Request().Context(); middleware.ContextWithResult(ctx, &res) != ctx {
				// Usage limits: handlers settle through the request's
				// context, or the usage header, taken before the header
				// is sent (or, as a trailer, when they return). settled
				// is a copy, so that res stays on the stack.
				c.SetRequest(c.Request().WithContext(middleware.ContextWithResult(ctx, &res)))
				settled, resp := res, c.Response()
				resp.Before(func() { _ = settled.SettleFrom(resp.Header()) })
				defer func() { _ = settled.SettleFrom(resp.Header()) }()
			}
			err = next(c)
			status = statusOf(c, err)
			return err
		}
	}
}

// statusOf is the status the client gets for a request whose handlers
// returned err: what was written if the response is committed, else the
// status Echo's error handler answers err with (an *echo.HTTPError's code,
// 500 for other errors), else 200.
func statusOf(c echo.Context, err error) int {
	if r := c.Response(); r.Committed || err == nil {
		if r.Status == 0 {
			return http.StatusOK
		}
		return r.Status
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		return he.Code
	}
	return http.StatusInternalServerError
}

// requests recycles the keyfunc.Request values: an echo.Context is an
// interface, two words, so wrapping one for Decide would allocate.
var requests = sync.Pool{New: func() any { return new(request) }}

// DefaultDenyHandler answers middleware.DenyStatus (429 Too Many Requests,
// or a concurrency limit's 503) with middleware.DenyBody, as
// middleware.DefaultDenyHandler does for net/http.
func DefaultDenyHandler(c echo.Context, res middleware.Result) error {
	return writeJSON(c, middleware.DenyStatus(&res), middleware.DenyBody(&res))
}

// DefaultErrorHandler answers with middleware.ErrorResponse (400 for a
// missing key, 503 otherwise), as middleware.DefaultErrorHandler does.
func DefaultErrorHandler(c echo.Context, err error) error {
	status, body := middleware.ErrorResponse(err)
	return writeJSON(c, status, body)
}

func writeJSON(c echo.Context, status int, body []byte) error {
	c.Response().Header().Set(echo.HeaderXContentTypeOptions, "nosniff")
	return c.Blob(status, middleware.ContentTypeJSON, body)
}
