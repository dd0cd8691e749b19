package adapters_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/labstack/echo/v4"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	sluicefiber "github.com/sluicehq/sluice/adapters/fiber"
	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/middleware"
)

// routes are the patterns every front end serves, in net/http syntax; each
// answers GET and POST with okBody, /status/{code} with that status, and
// /panic panics: each front end then answers 500 with panicBody, from a
// recovery middleware in front of everything.
var routes = []string{"/hello", "/users/{id}", "/search", "/health", "/status/{code}", "/panic", "/usage/{how}/{n}"}

// usageOf returns what a /usage/{how}/{n} route does: settle n through the
// request's context (how "ctx") or report it in the usageHeader response
// field (how "header", whose n need not be a number), or nothing for other
// paths.
func usageOf(path string) (how, n string) {
	rest, ok := strings.CutPrefix(path, "/usage/")
	if !ok {
		return "", ""
	}
	how, n, _ = strings.Cut(rest, "/")
	return how, n
}

// settle settles n units through ctx (how "ctx"), or reports n in the
// usage header through set (how "header"); a handler of each front end
// calls it.
func settle(ctx context.Context, how, n string, set func(name, value string)) {
	switch how {
	case "ctx":
		units, _ := strconv.Atoi(n)
		_ = middleware.Settle(ctx, units)
	case "header":
		set(usageHeader, n)
	}
}

// statusOf returns the status a route answers: the code of /status/{code},
// else 200.
func statusOf(path string) int {
	if s, ok := strings.CutPrefix(path, "/status/"); ok {
		if n, err := strconv.Atoi(s); err == nil && n >= 200 && n <= 599 {
			return n
		}
	}
	return http.StatusOK
}

const panicBody = "recovered\n"

// skipPath is the path a scenario with skip set exempts through each front
// end's own skip hook (WithSkip for net/http).
const skipPath = "/health"

const (
	okBody        = "ok\n"
	okContentType = "text/plain; charset=utf-8"
	userHeader    = "X-Test-User"
	usageHeader   = "X-Usage"
)

// userKey is where the test authentication middleware of every front end
// puts the user named by the X-Test-User header, in the request's context.
type userKey struct{}

func userFrom(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(userKey{}).(string)
	return u, ok
}

// frontEnd serves routes on a loopback listener, each behind the test
// authentication middleware and then the limiter, mounted on the route so
// that the route pattern is known to the limiter in every framework.
type frontEnd struct {
	name string
	// serve starts a server and returns its base URL. newLimiter builds the
	// limiter with the scenario's options plus extra; skip tells whether
	// the front end's skip hook should be set.
	serve func(t *testing.T, newLimiter func(extra ...middleware.Option) *middleware.Limiter, skip bool) string
}

var frontEnds = []frontEnd{
	{"net/http", serveHTTP},
	{"gin", serveGin},
	{"echo", serveEcho},
	{"fiber", serveFiber},
}

// colonPattern turns "/users/{id}" into "/users/:id".
func colonPattern(p string) string {
	return strings.NewReplacer("{", ":", "}", "").Replace(p)
}

func serveHTTP(t *testing.T, newLimiter func(...middleware.Option) *middleware.Limiter, skip bool) string {
	var opts []middleware.Option
	if skip {
		opts = append(opts, middleware.WithSkip(func(r *http.Request) bool { return r.URL.Path == skipPath }))
	}
	lim := newLimiter(opts...)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("handler failed")
		}
		how, n := usageOf(r.URL.Path)
		settle(r.Context(), how, n, w.Header().Set)
		w.Header().Set("Content-Type", okContentType)
		w.WriteHeader(statusOf(r.URL.Path))
		_, _ = w.Write([]byte(okBody))
	})
	auth := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u := r.Header.Get(userHeader); u != "" {
				r = r.WithContext(context.WithValue(r.Context(), userKey{}, u))
			}
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	for _, p := range routes {
		mux.Handle(p, auth(lim.Handler(ok)))
	}
	recovery := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if recover() != nil {
				w.Header().Set("Content-Type", okContentType)
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = w.Write([]byte(panicBody))
			}
		}()
		mux.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(recovery)
	t.Cleanup(srv.Close)
	return srv.URL
}

func serveGin(t *testing.T, newLimiter func(...middleware.Option) *middleware.Limiter, skip bool) string {
	cfg := sluicegin.Config{Limiter: newLimiter()}
	if skip {
		cfg.Skip = func(c *gin.Context) bool { return c.Request.URL.Path == skipPath }
	}
	limit := sluicegin.New(cfg)
	auth := func(c *gin.Context) {
		if u := c.GetHeader(userHeader); u != "" {
			c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), userKey{}, u))
		}
	}
	ok := func(c *gin.Context) {
		if c.Request.URL.Path == "/panic" {
			panic("handler failed")
		}
		how, n := usageOf(c.Request.URL.Path)
		settle(c.Request.Context(), how, n, c.Header)
		c.Data(statusOf(c.Request.URL.Path), okContentType, []byte(okBody))
	}
	r := gin.New()
	r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) {
		c.Data(http.StatusInternalServerError, okContentType, []byte(panicBody))
	}))
	for _, p := range routes {
		r.GET(colonPattern(p), auth, limit, ok)
		r.POST(colonPattern(p), auth, limit, ok)
	}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return srv.URL
}

func serveEcho(t *testing.T, newLimiter func(...middleware.Option) *middleware.Limiter, skip bool) string {
	cfg := sluiceecho.DefaultConfig
	cfg.Limiter = newLimiter()
	if skip {
		cfg.Skipper = func(c echo.Context) bool { return c.Request().URL.Path == skipPath }
	}
	limit := sluiceecho.RateLimiterWithConfig(cfg)
	auth := func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			if u := c.Request().Header.Get(userHeader); u != "" {
				c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), userKey{}, u)))
			}
			return next(c)
		}
	}
	ok := func(c echo.Context) error {
		if c.Request().URL.Path == "/panic" {
			panic("handler failed")
		}
		how, n := usageOf(c.Request().URL.Path)
		settle(c.Request().Context(), how, n, c.Response().Header().Set)
		return c.Blob(statusOf(c.Request().URL.Path), okContentType, []byte(okBody))
	}
	e := echo.New()
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) (err error) {
			defer func() {
				if recover() != nil {
					err = c.Blob(http.StatusInternalServerError, okContentType, []byte(panicBody))
				}
			}()
			return next(c)
		}
	})
	for _, p := range routes {
		e.Match([]string{http.MethodGet, http.MethodPost}, colonPattern(p), ok, auth, limit)
	}
	srv := httptest.NewServer(e)
	t.Cleanup(srv.Close)
	return srv.URL
}

func serveFiber(t *testing.T, newLimiter func(...middleware.Option) *middleware.Limiter, skip bool) string {
	cfg := sluicefiber.Config{Limiter: newLimiter()}
	if skip {
		cfg.Next = func(c *fiber.Ctx) bool { return c.Path() == skipPath }
	}
	limit := sluicefiber.New(cfg)
	auth := func(c *fiber.Ctx) error {
		if u := c.Get(userHeader); u != "" {
			// Copy: the header's bytes are reused after the request.
			c.SetUserContext(context.WithValue(c.UserContext(), userKey{}, strings.Clone(u)))
		}
		return c.Next()
	}
	ok := func(c *fiber.Ctx) error {
		if c.Path() == "/panic" {
			panic("handler failed")
		}
		how, n := usageOf(c.Path())
		settle(c.UserContext(), how, n, c.Set)
		c.Set(fiber.HeaderContentType, okContentType)
		return c.Status(statusOf(c.Path())).SendString(okBody)
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(func(c *fiber.Ctx) (err error) {
		defer func() {
			if recover() != nil {
				c.Set(fiber.HeaderContentType, okContentType)
				err = c.Status(http.StatusInternalServerError).SendString(panicBody)
			}
		}()
		return c.Next()
	})
	for _, p := range routes {
		app.Add(http.MethodGet, colonPattern(p), auth, limit, ok)
		app.Add(http.MethodPost, colonPattern(p), auth, limit, ok)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln) }()
	t.Cleanup(func() {
		if err := app.Shutdown(); err != nil {
			t.Errorf("fiber shutdown: %v", err)
		}
		_ = ln.Close() // in case Shutdown ran before the server started
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("fiber: %v", err)
		}
	})
	return "http://" + ln.Addr().String()
}
