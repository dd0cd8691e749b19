package sluicegin_test

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/internal/limitertest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func init() { gin.SetMode(gin.TestMode) }

func TestNewPanicsWithoutLimiter(t *testing.T) {
	t.Parallel()
	defer func() {
		if msg, _ := recover().(string); !strings.HasPrefix(msg, "sluicegin: ") {
			t.Errorf("recover() = %q, want a sluicegin panic", msg)
		}
	}()
	sluicegin.New(sluicegin.Config{})
}

// TestUse checks the limiter mounted with Use: Gin matches the route before
// it runs the chain, so keyfunc.Route keys by the pattern there too.
func TestUse(t *testing.T) {
	t.Parallel()
	r := gin.New()
	r.Use(sluicegin.New(sluicegin.Config{Limiter: limitertest.New(t, 1, keyfunc.Route())}))
	reached := 0
	r.GET("/users/:id", func(c *gin.Context) { reached++ })
	for i, want := range []int{200, 429} {
		rec := limitertest.Get(r, "/users/"+strconv.Itoa(i))
		if rec.Code != want {
			t.Errorf("request %d: status %d, want %d", i, rec.Code, want)
		}
	}
	if reached != 1 {
		t.Errorf("handler reached %d times, want 1", reached)
	}
}

func TestCustomHandlers(t *testing.T) {
	t.Parallel()
	var gotRes middleware.Result
	var gotErr error
	cfg := sluicegin.Config{
		Limiter: limitertest.New(t, 1, keyfunc.Header("X-Tenant")),
		DenyHandler: func(c *gin.Context) {
			res, ok := sluicegin.ResultFrom(c)
			if !ok {
				t.Error("ResultFrom in DenyHandler reported false")
			}
			gotRes = res
			c.String(http.StatusTeapot, "slow down")
		},
		ErrorHandler: func(c *gin.Context, err error) {
			gotErr = err
			c.String(http.StatusUnauthorized, "who are you")
		},
	}
	r := gin.New()
	r.Use(sluicegin.New(cfg))
	r.GET("/", func(c *gin.Context) {
		if _, ok := sluicegin.ResultFrom(c); ok {
			t.Error("ResultFrom outside DenyHandler reported true")
		}
		c.String(http.StatusOK, "ok")
	})

	if rec := limitertest.Get(r, "/", "X-Tenant", "a"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "0" {
		t.Errorf("first request: %d %v", rec.Code, rec.Header())
	}
	rec := limitertest.Get(r, "/", "X-Tenant", "a")
	if rec.Code != http.StatusTeapot || rec.Body.String() != "slow down" || rec.Header().Get("Retry-After") == "" {
		t.Errorf("denied request: %d %v %q", rec.Code, rec.Header(), rec.Body)
	}
	if gotRes.Allowed || gotRes.Limit.Requests != 1 || gotRes.RetryAfter <= 0 {
		t.Errorf("DenyHandler saw %+v", gotRes)
	}
	rec = limitertest.Get(r, "/")
	if rec.Code != http.StatusUnauthorized || rec.Body.String() != "who are you" {
		t.Errorf("request without key: %d %q", rec.Code, rec.Body)
	}
	if !errors.Is(gotErr, keyfunc.ErrNoKey) {
		t.Errorf("ErrorHandler saw %v, want ErrNoKey", gotErr)
	}
}

// TestRemoteAddrIsPeer checks that the key is the peer, whatever Gin's own
// client-IP settings make of X-Forwarded-For.
func TestRemoteAddrIsPeer(t *testing.T) {
	t.Parallel()
	var keys []string
	key := func(r keyfunc.Request) (string, error) {
		k, err := keyfunc.RemoteIP()(r)
		keys = append(keys, k)
		return k, err
	}
	r := gin.New() // trusts every proxy by default
	r.Use(sluicegin.New(sluicegin.Config{Limiter: limitertest.New(t, 10, key)}))
	r.GET("/", func(c *gin.Context) {})
	limitertest.Get(r, "/", "X-Forwarded-For", "203.0.113.9", "X-Real-IP", "203.0.113.8")
	if len(keys) != 1 || keys[0] != "ip:192.0.2.1" { // httptest.NewRequest's peer
		t.Errorf("keys = %q, want [ip:192.0.2.1]", keys)
	}
}
