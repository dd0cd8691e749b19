package sluicefiber

import (
	"errors"

	"github.com/gofiber/fiber/v2"

	"github.com/sluicehq/sluice/middleware"
)

// Config configures New.
type Config struct {
	// Next, when it reports true, lets the request through unlimited and
	// without rate-limit headers. Optional. Default: nil.
	Next func(c *fiber.Ctx) bool

	// Limiter decides every request. Required.
	Limiter *middleware.Limiter

	// LimitReached answers a denied request. The rate-limit headers and
	// Retry-After are already set and ResultFrom(c) gives the decision.
	// Default: DefaultLimitReached.
	LimitReached fiber.Handler

	// ErrorHandler answers a request the Limiter could not decide: a
	// missing key (errors.Is(err, keyfunc.ErrNoKey)) or a store failure
	// under middleware.FailClosed (errors.Is(err, middleware.ErrStore)).
	// Default: DefaultErrorHandler.
	ErrorHandler func(c *fiber.Ctx, err error) error
}

// ConfigDefault is the default Config, without its required Limiter.
var ConfigDefault = Config{
	LimitReached: DefaultLimitReached,
	ErrorHandler: DefaultErrorHandler,
}

func configDefault(config ...Config) Config {
	if len(config) < 1 {
		return ConfigDefault
	}
	cfg := config[0]
	if cfg.LimitReached == nil {
		cfg.LimitReached = ConfigDefault.LimitReached
	}
	if cfg.ErrorHandler == nil {
		cfg.ErrorHandler = ConfigDefault.ErrorHandler
	}
	return cfg
}

// New returns a Fiber handler that rate-limits requests with the Limiter of
// config: an allowed request continues with rate-limit headers set, a
// denied one gets LimitReached and one that cannot be decided ErrorHandler.
// Nil fields take their value from ConfigDefault.
//
// New panics if no Config with a non-nil Limiter is given.
func New(config ...Config) fiber.Handler {
	cfg := configDefault(config...)
	if cfg.Limiter == nil {
		panic("sluicefiber: New expects a Config with a non-nil Limiter")
	}
	l := cfg.Limiter
	return func(c *fiber.Ctx) error {
		if cfg.Next != nil && cfg.Next(c) {
			return c.Next()
		}
		res, err := l.Decide(request{c})
		if err != nil {
			return cfg.ErrorHandler(c, err)
		}
		l.WriteHeaders(c, &res)
		if !res.Allowed {
			// A copy, so that res itself stays off the heap when allowed.
			denied := res
			c.Locals(resultKey, &denied)
			return cfg.LimitReached(c)
		}
		// Concurrency slots are given back, and a rule that counts by
		// outcome charged by the status, once the handlers return; a
		// panic counts as 500. A body streamed with SetBodyStreamWriter is
		// written after that, outside the slot, and counts by the status
		// set before.
		status := 0
		defer func() { res.Finish(status) }()
		usage := false
		if ctx := c.UserContext(); middleware.ContextWithResult(ctx, &res) != ctx {
			// Usage limits: handlers settle through the user context, or
			// the usage header, which Fiber sends only once they return.
			// A body streamed with SetBodyStreamWriter is written after
			// that: its writer settles through the context it kept, at
			// once.
			c.SetUserContext(middleware.ContextWithResult(ctx, &res))
			usage = true
		}
		err = c.Next()
		if usage {
			_ = res.SettleFrom(responseHeader{c})
		}
		status = statusOf(c, err)
		return err
	}
}

// responseHeader is the header of c's response, not yet sent, for
// middleware.Result.SettleFrom.
type responseHeader struct{ c *fiber.Ctx }

func (h responseHeader) Get(key string) string { return h.c.GetRespHeader(key) }

func (h responseHeader) Del(key string) { h.c.Response().Header.Del(key) }

// statusOf is the status the client gets for a request whose handlers
// returned err: the status Fiber's default error handler answers err with
// (a *fiber.Error's code, 500 for other errors), else the response's.
func statusOf(c *fiber.Ctx, err error) int {
	if err != nil {
		var fe *fiber.Error
		if errors.As(err, &fe) {
			return fe.Code
		}
		return fiber.StatusInternalServerError
	}
	return c.Response().StatusCode()
}

type contextKey struct{ name string }

// resultKey is a pointer so that it fits in an interface without allocating.
var resultKey = &contextKey{"sluicefiber.result"}

// ResultFrom returns the decision on a denied request; a LimitReached
// handler reads it to build its response. It reports false elsewhere.
func ResultFrom(c *fiber.Ctx) (middleware.Result, bool) {
	res, ok := c.Locals(resultKey).(*middleware.Result)
	if !ok {
		return middleware.Result{}, false
	}
	return *res, true
}

// DefaultLimitReached answers middleware.DenyStatus (429 Too Many
// Requests, or a concurrency limit's 503) with middleware.DenyBody, as
// middleware.DefaultDenyHandler does for net/http.
func DefaultLimitReached(c *fiber.Ctx) error {
	res, _ := ResultFrom(c)
	return writeJSON(c, middleware.DenyStatus(&res), middleware.DenyBody(&res))
}

// DefaultErrorHandler answers with middleware.ErrorResponse (400 for a
// missing key, 503 otherwise), as middleware.DefaultErrorHandler does.
func DefaultErrorHandler(c *fiber.Ctx, err error) error {
	status, body := middleware.ErrorResponse(err)
	return writeJSON(c, status, body)
}

func writeJSON(c *fiber.Ctx, status int, body []byte) error {
	c.Set(fiber.HeaderContentType, middleware.ContentTypeJSON)
	c.Set(fiber.HeaderXContentTypeOptions, "nosniff")
	return c.Status(status).Send(body)
}
