package adapters_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/gofiber/fiber/v2"
	fiberrecover "github.com/gofiber/fiber/v2/middleware/recover"
	"github.com/labstack/echo/v4"

	sluiceecho "github.com/sluicehq/sluice/adapters/echo"
	sluicefiber "github.com/sluicehq/sluice/adapters/fiber"
	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// hub is what the concurrency routes of a test server do: /hold and
// /shadow wait until the test releases them (or the request's context
// ends), /panic panics, /stream writes a chunk, waits, writes another.
type hub struct {
	entered chan string
	release chan struct{}
}

func newHub() *hub { return &hub{entered: make(chan string, 64), release: make(chan struct{})} }

func (h *hub) wait(ctx context.Context, path string) {
	h.entered <- path
	select {
	case <-h.release:
	case <-ctx.Done():
	}
}

var concurrencyPaths = []string{"/hold", "/panic", "/stream", "/shadow"}

func concurrencyRules() []middleware.Rule {
	return []middleware.Rule{
		{Name: "hold", Path: "/hold", Key: keyfunc.RemoteIP(), Concurrency: 2},
		{Name: "panic", Path: "/panic", Key: keyfunc.RemoteIP(), Concurrency: 1},
		{Name: "stream", Path: "/stream", Key: keyfunc.RemoteIP(), Concurrency: 1},
		{Name: "shadow", Path: "/shadow", Key: keyfunc.RemoteIP(), Concurrency: 1, Shadow: true},
	}
}

func concurrencyServers() map[string]func(t *testing.T, lim *middleware.Limiter, h *hub) string {
	return map[string]func(t *testing.T, lim *middleware.Limiter, h *hub) string{
		"net/http": func(t *testing.T, lim *middleware.Limiter, h *hub) string {
			mux := http.NewServeMux()
			for _, p := range concurrencyPaths {
				mux.Handle(p, lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch p {
					case "/panic":
						panic(http.ErrAbortHandler) // net/http recovers it quietly
					case "/stream":
						io.WriteString(w, "one\n")
						w.(http.Flusher).Flush()
						h.wait(r.Context(), p)
						io.WriteString(w, "two\n")
					default:
						h.wait(r.Context(), p)
						io.WriteString(w, "ok\n")
					}
				})))
			}
			srv := httptest.NewServer(mux)
			t.Cleanup(srv.Close)
			return srv.URL
		},
		"gin": func(t *testing.T, lim *middleware.Limiter, h *hub) string {
			r := gin.New()
			r.Use(gin.CustomRecoveryWithWriter(io.Discard, func(c *gin.Context, _ any) { c.AbortWithStatus(500) }))
			r.Use(sluicegin.New(sluicegin.Config{Limiter: lim}))
			for _, p := range concurrencyPaths {
				r.GET(p, func(c *gin.Context) {
					switch p {
					case "/panic":
						panic("boom")
					case "/stream":
						c.Writer.WriteString("one\n")
						c.Writer.Flush()
						h.wait(c.Request.Context(), p)
						c.Writer.WriteString("two\n")
					default:
						h.wait(c.Request.Context(), p)
						c.String(200, "ok\n")
					}
				})
			}
			srv := httptest.NewServer(r)
			t.Cleanup(srv.Close)
			return srv.URL
		},
		"echo": func(t *testing.T, lim *middleware.Limiter, h *hub) string {
			e := echo.New()
			e.Use(func(next echo.HandlerFunc) echo.HandlerFunc { // recover, outside the limiter
				return func(c echo.Context) (err error) {
					defer func() {
						if recover() != nil {
							err = c.NoContent(500)
						}
					}()
					return next(c)
				}
			})
			e.Use(sluiceecho.RateLimiter(lim))
			for _, p := range concurrencyPaths {
				e.GET(p, func(c echo.Context) error {
					switch p {
					case "/panic":
						panic("boom")
					case "/stream":
						c.Response().WriteHeader(200)
						io.WriteString(c.Response(), "one\n")
						c.Response().Flush()
						h.wait(c.Request().Context(), p)
						_, err := io.WriteString(c.Response(), "two\n")
						return err
					default:
						h.wait(c.Request().Context(), p)
						return c.String(200, "ok\n")
					}
				})
			}
			srv := httptest.NewServer(e)
			t.Cleanup(srv.Close)
			return srv.URL
		},
		"fiber": func(t *testing.T, lim *middleware.Limiter, h *hub) string {
			app := fiber.New(fiber.Config{DisableStartupMessage: true})
			app.Use(fiberrecover.New())
			app.Use(sluicefiber.New(sluicefiber.Config{Limiter: lim}))
			for _, p := range concurrencyPaths {
				app.Get(p, func(c *fiber.Ctx) error {
					switch p {
					case "/panic":
						panic("boom")
					case "/stream":
						// Fasthttp writes a streamed body after the handler
						// returned, outside the slot; a handler that holds
						// its slot while it works writes before returning.
						h.wait(context.Background(), p)
						return c.SendString("one\ntwo\n")
					default:
						// Fasthttp gives no sign that a client went away;
						// the handler ends when released.
						h.wait(context.Background(), p)
						return c.SendString("ok\n")
					}
				})
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			go func() { _ = app.Listener(ln) }()
			t.Cleanup(func() { _ = app.Shutdown() })
			return "http://" + ln.Addr().String()
		},
	}
}

// TestConcurrencyFrontEnds runs the concurrency limits through every front
// end: at most N in flight with a short Retry-After for the others, slots
// given back after a panic, after the client goes away and after a
// streamed response, and a shadow limit that never denies.
func TestConcurrencyFrontEnds(t *testing.T) {
	t.Parallel()
	for name, serve := range concurrencyServers() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			lim, err := middleware.NewRules(concurrencyRules())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { lim.Close() })
			h := newHub()
			base := serve(t, lim, h)
			client := &http.Client{Timeout: 10 * time.Second}
			get := func(ctx context.Context, path string) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, "GET", base+path, nil)
				return client.Do(req)
			}
			status := func(path string) (int, string, string) {
				t.Helper()
				res, err := get(context.Background(), path)
				if err != nil {
					t.Fatalf("GET %s: %v", path, err)
				}
				defer res.Body.Close()
				body, _ := io.ReadAll(res.Body)
				return res.StatusCode, res.Header.Get("Retry-After"), string(body)
			}
			// Two held, the third denied.
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if code, _, _ := status("/hold"); code != 200 {
						t.Errorf("held request: %d", code)
					}
				}()
			}
			<-h.entered
			<-h.entered
			code, retry, body := status("/hold")
			if code != 429 || retry != "1" || !strings.Contains(body, `"too many requests in flight"`) {
				t.Errorf("third /hold: %d, Retry-After %q, %q; want 429, 1", code, retry, body)
			}
			// Shadow: over its limit of 1, still served.
			wg.Add(1)
			go func() {
				defer wg.Done()
				status("/shadow")
			}()
			<-h.entered
			wg.Add(1)
			go func() {
				defer wg.Done()
				if code, _, _ := status("/shadow"); code != 200 {
					t.Errorf("shadow over its limit: %d, want 200", code)
				}
			}()
			<-h.entered
			close(h.release)
			wg.Wait()
			h.release = make(chan struct{})

			// Panics give their slot back: the limit is 1, so a second
			// panic would get 429 if the first had kept it.
			for i := range 3 {
				res, err := get(context.Background(), "/panic")
				if err != nil {
					continue // net/http drops the connection of a panicking handler
				}
				res.Body.Close()
				if res.StatusCode == 429 {
					t.Fatalf("panic %d: 429, the slot was not given back", i)
				}
			}

			// A streamed response holds its slot until it ends.
			streamDone := make(chan string, 1)
			go func() {
				res, err := get(context.Background(), "/stream")
				if err != nil {
					streamDone <- err.Error()
					return
				}
				defer res.Body.Close()
				b, _ := io.ReadAll(bufio.NewReader(res.Body))
				streamDone <- string(b)
			}()
			<-h.entered
			if code, _, _ := status("/stream"); code != 429 {
				t.Errorf("second /stream while the first streams: %d, want 429", code)
			}
			close(h.release)
			if b := <-streamDone; b != "one\ntwo\n" {
				t.Errorf("stream body %q", b)
			}
			h.release = make(chan struct{})

			// A client that goes away: its slot comes back once the
			// handler returns (at once where the handler sees it).
			ctx, cancel := context.WithCancel(context.Background())
			gone := make(chan error, 2)
			for range 2 {
				go func() {
					res, err := get(ctx, "/hold")
					if err == nil {
						res.Body.Close()
					}
					gone <- err
				}()
			}
			<-h.entered
			<-h.entered
			cancel()
			<-gone
			<-gone
			if name == "fiber" {
				close(h.release)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, err := lim.Decide(keyfunc.FromHTTP(httptest.NewRequest("GET", "/hold", nil)))
				if err == nil && res.Allowed {
					res.Done()
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the slots of requests whose clients went away did not come back")
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
}
