package sluicefiber_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gofiber/fiber/v2"

	sluicefiber "github.com/sluicehq/sluice/adapters/fiber"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func ExampleNew() {
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP())
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	app := fiber.New()
	app.Use(sluicefiber.New(sluicefiber.Config{
		Limiter: lim,
		Next:    func(c *fiber.Ctx) bool { return c.Path() == "/healthz" },
	}))
	app.Get("/", func(c *fiber.Ctx) error { return c.SendString("hello\n") })

	for range 3 {
		resp, err := app.Test(httptest.NewRequest(http.MethodGet, "/", nil))
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
}
