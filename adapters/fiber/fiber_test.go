package sluicefiber_test

import (
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/gofiber/fiber/v2"

	sluicefiber "github.com/sluicehq/sluice/adapters/fiber"
	"github.com/sluicehq/sluice/internal/limitertest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func do(t *testing.T, app *fiber.App, target string, header ...string) (*http.Response, string) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := app.Test(req, -1)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(body)
}

func TestNewPanicsWithoutLimiter(t *testing.T) {
	t.Parallel()
	for name, build := range map[string]func(){
		"no config":  func() { sluicefiber.New() },
		"no limiter": func() { sluicefiber.New(sluicefiber.Config{}) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			defer func() {
				if msg, _ := recover().(string); !strings.HasPrefix(msg, "sluicefiber: ") {
					t.Errorf("recover() = %q, want a sluicefiber panic", msg)
				}
			}()
			build()
		})
	}
}

// TestRoute checks what keyfunc.Route sees: the pattern of the route the
// limiter is registered on, and under Use the Use prefix, since Fiber runs
// Use handlers before it matches the final route.
func TestRoute(t *testing.T) {
	t.Parallel()
	var routes []string
	key := func(r keyfunc.Request) (string, error) {
		routes = append(routes, r.Route())
		return keyfunc.Route()(r)
	}
	app := fiber.New()
	app.Use("/api", sluicefiber.New(sluicefiber.Config{Limiter: limitertest.New(t, 10, key)}))
	app.Get("/api/users/:id", sluicefiber.New(sluicefiber.Config{Limiter: limitertest.New(t, 10, key)}), func(c *fiber.Ctx) error {
		return nil
	})
	do(t, app, "/api/users/7")
	if want := []string{"/api", "/api/users/:id"}; strings.Join(routes, " ") != strings.Join(want, " ") {
		t.Errorf("routes = %q, want %q", routes, want)
	}
}

func TestCustomHandlers(t *testing.T) {
	t.Parallel()
	var gotRes middleware.Result
	var gotErr error
	app := fiber.New()
	app.Use(sluicefiber.New(sluicefiber.Config{
		Limiter: limitertest.New(t, 1, keyfunc.Header("X-Tenant")),
		Next:    func(c *fiber.Ctx) bool { return c.Path() == "/healthz" },
		LimitReached: func(c *fiber.Ctx) error {
			res, ok := sluicefiber.ResultFrom(c)
			if !ok {
				t.Error("ResultFrom in LimitReached reported false")
			}
			gotRes = res
			return c.Status(fiber.StatusTeapot).SendString("slow down")
		},
		ErrorHandler: func(c *fiber.Ctx, err error) error {
			gotErr = err
			return fiber.ErrUnauthorized
		},
	}))
	app.Get("/*", func(c *fiber.Ctx) error {
		if _, ok := sluicefiber.ResultFrom(c); ok {
			t.Error("ResultFrom outside LimitReached reported true")
		}
		return c.SendString("ok")
	})

	if resp, _ := do(t, app, "/", "X-Tenant", "a"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("first request: %d %v", resp.StatusCode, resp.Header)
	}
	resp, body := do(t, app, "/", "X-Tenant", "a")
	if resp.StatusCode != http.StatusTeapot || body != "slow down" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("denied request: %d %v %q", resp.StatusCode, resp.Header, body)
	}
	if gotRes.Allowed || gotRes.Limit.Requests != 1 || gotRes.RetryAfter <= 0 {
		t.Errorf("LimitReached saw %+v", gotRes)
	}
	if resp, _ := do(t, app, "/"); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("request without key: %d", resp.StatusCode)
	}
	if !errors.Is(gotErr, keyfunc.ErrNoKey) {
		t.Errorf("ErrorHandler saw %v, want ErrNoKey", gotErr)
	}
	if resp, _ := do(t, app, "/healthz"); resp.StatusCode != http.StatusOK || resp.Header.Get("X-RateLimit-Limit") != "" {
		t.Errorf("skipped request: %d %v", resp.StatusCode, resp.Header)
	}
}

// TestRemoteAddrIsPeer checks, on a real connection, that the key is the
// TCP peer and not c.IP(), which reads Config.ProxyHeader when it is set.
func TestRemoteAddrIsPeer(t *testing.T) {
	t.Parallel()
	keys := make(chan string, 1)
	key := func(r keyfunc.Request) (string, error) {
		k, err := keyfunc.RemoteIP()(r)
		keys <- k
		return k, err
	}
	app := fiber.New(fiber.Config{DisableStartupMessage: true, ProxyHeader: fiber.HeaderXForwardedFor})
	app.Use(sluicefiber.New(sluicefiber.Config{Limiter: limitertest.New(t, 10, key)}))
	ips := make(chan string, 1)
	app.Get("/", func(c *fiber.Ctx) error { ips <- strings.Clone(c.IP()); return nil })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- app.Listener(ln) }()
	defer func() {
		_ = app.Shutdown()
		_ = ln.Close()
		<-done
	}()

	req, err := http.NewRequest(http.MethodGet, "http://"+ln.Addr().String()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := <-keys; got != "ip:127.0.0.1" {
		t.Errorf("key = %q, want ip:127.0.0.1", got)
	}
	if ip := <-ips; ip != "203.0.113.9" {
		t.Errorf("c.IP() = %q; the test no longer shows the difference", ip)
	}
}

// TestValues checks that every line of a repeated header reaches the key
// function, in order.
func TestValues(t *testing.T) {
	t.Parallel()
	var got []string
	key := func(r keyfunc.Request) (string, error) {
		got = append(got, r.Values("X-Forwarded-For")...)
		got = append(got, strconv.Itoa(len(r.Values("X-Missing"))))
		return "k", nil
	}
	app := fiber.New()
	app.Use(sluicefiber.New(sluicefiber.Config{Limiter: limitertest.New(t, 10, key)}))
	app.Get("/", func(c *fiber.Ctx) error { return nil })
	do(t, app, "/", "X-Forwarded-For", "192.0.2.1", "X-Forwarded-For", "192.0.2.2, 192.0.2.3")
	if want := []string{"192.0.2.1", "192.0.2.2, 192.0.2.3", "0"}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("Values = %q, want %q", got, want)
	}
}
