package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/adaptor"
	"github.com/labstack/echo/v4"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	sluicefiber "github.com/sluicehq/sluice/adapters/fiber"
	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/middleware"
)

// The example's routes and their bodies, the same for every framework.
var exampleRoutes = []struct{ method, path, body string }{
	{http.MethodGet, "/", "hello"},
	{http.MethodGet, "/search", "no results"},
	{http.MethodGet, "/api/data", `{"data":[1,2,3]}`},
	{http.MethodGet, "/api/search", `{"results":[]}`},
	{http.MethodPost, "/api/login", `{"token":"demo"}`},
	{http.MethodPost, "/login", ""}, // login.go
	{http.MethodPost, "/api/upload", `{"stored":true}`},
	{http.MethodGet, "/api/quote", `{"price":42}`},
	{http.MethodPost, "/api/export", `{"export":"queued"}`},
	{http.MethodGet, "/api/report", `{"report":"daily"}`},
	{http.MethodGet, "/api/slow", `{"slow":true}`},
	{http.MethodGet, "/api/smooth", `{"smooth":true}`},
	{http.MethodGet, "/api/burst", `{"burst":true}`},
	{http.MethodGet, "/api/work", `{"work":"done"}`},
	{http.MethodPost, "/v1/chat", ""}, // chat.go
}

// maxSlow bounds the wait of /api/slow.
const maxSlow = 10 * time.Second

// slow waits for the ms query parameter of /api/slow and /api/work (at
// most maxSlow), or until ctx is done: it stands for an expensive request.
func slow(ctx context.Context, path, ms string) {
	if path != "/api/slow" && path != "/api/work" {
		return
	}
	n, err := strconv.Atoi(ms)
	if err != nil || n <= 0 {
		return
	}
	t := time.NewTimer(min(time.Duration(n)*time.Millisecond, maxSlow))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// serveFunc serves lim's routes on ln until ctx is done, and metrics, when
// not nil, on /metrics, which no rule limits.
type serveFunc func(ctx context.Context, ln net.Listener, lim *middleware.Limiter, metrics http.Handler) error

// metricsPath is where the example serves its metrics.
const metricsPath = "/metrics"

var frameworks = map[string]serveFunc{
	"nethttp": serveNetHTTP,
	"gin":     serveGin,
	"echo":    serveEcho,
	"fiber":   serveFiber,
}

func serveNetHTTP(ctx context.Context, ln net.Listener, lim *middleware.Limiter, metrics http.Handler) error {
	mux := http.NewServeMux()
	for _, rt := range exampleRoutes {
		pattern := rt.method + " " + rt.path
		if rt.path == "/" {
			pattern += "{$}"
		}
		body := rt.body
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/chat" {
				w.Header().Set("Content-Type", "text/event-stream")
				body, _ := io.ReadAll(io.LimitReader(r.Body, 1<<20))
				chat(r.Context(), w, http.NewResponseController(w).Flush, promptTokens(strconv.Itoa(len(body))), completionTokens(r.URL.Query().Get("tokens")))
				return
			}
			if r.URL.Path == "/login" {
				status, body := login(r.PostFormValue("password"))
				w.WriteHeader(status)
				fmt.Fprintln(w, body)
				return
			}
			slow(r.Context(), r.URL.Path, r.URL.Query().Get("ms"))
			fmt.Fprintln(w, body)
		})
	}
	var h http.Handler = demoAuth(lim.Handler(mux))
	if metrics != nil {
		outer := http.NewServeMux()
		outer.Handle(metricsPath, metrics)
		outer.Handle("/", h)
		h = outer
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: readHeaderTimeout}
	return serveHTTP(ctx, srv, ln)
}

func serveGin(ctx context.Context, ln net.Listener, lim *middleware.Limiter, metrics http.Handler) error {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(func(c *gin.Context) { // demo authentication, as demoAuth
		if u := c.GetHeader("X-User"); u != "" {
			c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), userKey{}, u))
		}
	})
	if metrics != nil {
		r.GET(metricsPath, gin.WrapH(metrics)) // before the limiter
	}
	r.Use(sluicegin.New(sluicegin.Config{Limiter: lim}))
	for _, rt := range exampleRoutes {
		body := rt.body
		r.Handle(rt.method, rt.path, func(c *gin.Context) {
			if c.Request.URL.Path == "/v1/chat" {
				c.Header("Content-Type", "text/event-stream")
				body, _ := io.ReadAll(io.LimitReader(c.Request.Body, 1<<20))
				flush := func() error { c.Writer.Flush(); return nil }
				chat(c.Request.Context(), c.Writer, flush, promptTokens(strconv.Itoa(len(body))), completionTokens(c.Query("tokens")))
				return
			}
			if c.Request.URL.Path == "/login" {
				status, body := login(c.PostForm("password"))
				c.String(status, body+"\n")
				return
			}
			slow(c.Request.Context(), c.Request.URL.Path, c.Query("ms"))
			c.String(http.StatusOK, body+"\n")
		})
	}
	srv := &http.Server{Handler: r, ReadHeaderTimeout: readHeaderTimeout}
	return serveHTTP(ctx, srv, ln)
}

func serveEcho(ctx context.Context, ln net.Listener, lim *middleware.Limiter, metrics http.Handler) error {
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // demo authentication
		return func(c echo.Context) error {
			if u := c.Request().Header.Get("X-User"); u != "" {
				c.SetRequest(c.Request().WithContext(context.WithValue(c.Request().Context(), userKey{}, u)))
			}
			return next(c)
		}
	})
	cfg := sluiceecho.DefaultConfig
	cfg.Limiter = lim
	cfg.Skipper = func(c echo.Context) bool { return c.Path() == metricsPath }
	e.Use(sluiceecho.RateLimiterWithConfig(cfg))
	if metrics != nil {
		e.GET(metricsPath, echo.WrapHandler(metrics))
	}
	for _, rt := range exampleRoutes {
		body := rt.body
		e.Add(rt.method, rt.path, func(c echo.Context) error {
			if c.Request().URL.Path == "/v1/chat" {
				c.Response().Header().Set("Content-Type", "text/event-stream")
				body, _ := io.ReadAll(io.LimitReader(c.Request().Body, 1<<20))
				flush := func() error { c.Response().Flush(); return nil }
				chat(c.Request().Context(), c.Response(), flush, promptTokens(strconv.Itoa(len(body))), completionTokens(c.QueryParam("tokens")))
				return nil
			}
			if c.Request().URL.Path == "/login" {
				status, body := login(c.FormValue("password"))
				return c.String(status, body+"\n")
			}
			slow(c.Request().Context(), c.Request().URL.Path, c.QueryParam("ms"))
			return c.String(http.StatusOK, body+"\n")
		})
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: readHeaderTimeout}
	return serveHTTP(ctx, srv, ln)
}

func serveFiber(ctx context.Context, ln net.Listener, lim *middleware.Limiter, metrics http.Handler) error {
	app := fiber.New(fiber.Config{DisableStartupMessage: true})
	app.Use(func(c *fiber.Ctx) error { // demo authentication
		if u := c.Get("X-User"); u != "" {
			// Copy: Fiber reuses the buffer behind c.Get's result.
			c.SetUserContext(context.WithValue(c.UserContext(), userKey{}, string([]byte(u))))
		}
		return c.Next()
	})
	if metrics != nil {
		app.Get(metricsPath, adaptor.HTTPHandler(metrics)) // before the limiter
	}
	app.Use(sluicefiber.New(sluicefiber.Config{Limiter: lim}))
	for _, rt := range exampleRoutes {
		body := rt.body
		app.Add(rt.method, rt.path, func(c *fiber.Ctx) error {
			if c.Path() == "/v1/chat" {
				// Fiber writes a streamed body once the handler has
				// returned: the stream settles through the context it
				// keeps, after the request ended, at once.
				ctx, prompt, n := c.UserContext(), promptTokens(strconv.Itoa(len(c.Body()))), completionTokens(c.Query("tokens"))
				c.Set("Content-Type", "text/event-stream")
				c.Context().SetBodyStreamWriter(func(w *bufio.Writer) {
					chat(ctx, w, w.Flush, prompt, n)
				})
				return nil
			}
			if c.Path() == "/login" {
				status, body := login(c.FormValue("password"))
				return c.Status(status).SendString(body + "\n")
			}
			slow(c.UserContext(), c.Path(), c.Query("ms"))
			return c.SendString(body + "\n")
		})
	}
	go func() {
		<-ctx.Done()
		_ = app.Shutdown()
	}()
	return app.Listener(ln)
}
