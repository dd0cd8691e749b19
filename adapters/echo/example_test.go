package sluiceecho_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/labstack/echo/v4"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func ExampleRateLimiter() {
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP())
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	e := echo.New()
	e.Use(sluiceecho.RateLimiter(lim))
	e.GET("/", func(c echo.Context) error { return c.String(http.StatusOK, "hello\n") })

	for range 3 {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
}

// This example answers denied requests through Echo's HTTPErrorHandler
// instead of with the default JSON body.
func ExampleRateLimiterWithConfig() {
	lim, err := middleware.New(middleware.PerMinute(1), keyfunc.RemoteIP())
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	cfg := sluiceecho.DefaultConfig
	cfg.Limiter = lim
	cfg.Skipper = func(c echo.Context) bool { return c.Path() == "/healthz" }
	cfg.DenyHandler = func(c echo.Context, res middleware.Result) error {
		return echo.NewHTTPError(http.StatusTooManyRequests, "slow down")
	}

	e := echo.New()
	e.Use(sluiceecho.RateLimiterWithConfig(cfg))
	e.GET("/", func(c echo.Context) error { return c.String(http.StatusOK, "hello\n") })

	for range 2 {
		rec := httptest.NewRecorder()
		e.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Print(rec.Code, " ", rec.Body.String())
	}
	// Output:
	// 200 hello
	// 429 {"message":"slow down"}
}
