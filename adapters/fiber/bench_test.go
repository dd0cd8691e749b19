package sluicefiber_test

import (
	"net"
	"testing"
	"time"

	"github.com/gofiber/fiber/v2"
	"github.com/gofiber/fiber/v2/middleware/limiter"
	"github.com/valyala/fasthttp"

	sluicefiber "github.com/sluicehq/sluice/adapters/fiber"
	"github.com/sluicehq/sluice/internal/limitertest"
	"github.com/sluicehq/sluice/keyfunc"
)

// BenchmarkFiber measures a request to a Fiber route without a limiter,
// with sluicefiber and with Fiber's own limiter (fixed window, memory
// storage), on the allow path: one hot key (the request's peer) under a
// limit it never reaches. The app's handler runs on one reused
// fasthttp.RequestCtx, without a network.
func BenchmarkFiber(b *testing.B) {
	cases := []struct {
		name string
		mw   func(b *testing.B) []fiber.Handler
	}{
		{"baseline", func(*testing.B) []fiber.Handler { return nil }},
		{"sluice", func(b *testing.B) []fiber.Handler {
			return []fiber.Handler{sluicefiber.New(sluicefiber.Config{Limiter: limitertest.New(b, 1e9, keyfunc.RemoteIP())})}
		}},
		{"fiber-limiter", func(*testing.B) []fiber.Handler {
			return []fiber.Handler{limiter.New(limiter.Config{Max: 1e9, Expiration: time.Minute})}
		}},
	}
	for _, bc := range cases {
		b.Run(bc.name, func(b *testing.B) {
			app := fiber.New()
			app.Get("/users/:id", append(bc.mw(b), func(c *fiber.Ctx) error { return c.SendString("ok") })...)
			h := app.Handler()
			var req fasthttp.Request
			req.SetRequestURI("/users/42")
			var ctx fasthttp.RequestCtx
			ctx.Init(&req, &net.TCPAddr{IP: net.IPv4(192, 0, 2, 1), Port: 1234}, nil)
			b.ReportAllocs()
			for b.Loop() {
				ctx.Response.Reset()
				h(&ctx)
				if ctx.Response.StatusCode() != fiber.StatusOK {
					b.Fatalf("status %d", ctx.Response.StatusCode())
				}
			}
		})
	}
}
