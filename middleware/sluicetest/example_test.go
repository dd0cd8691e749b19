package sluicetest_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/gin-gonic/gin"

	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/sluicetest"
)

// A net/http handler limited to five requests a minute per client: the
// sixth request in the minute gets 429 with Retry-After 60, and once the
// clock has moved a minute on, the client is let through again. Nothing
// sleeps and no server listens.
func Example() {
	clock := sluicetest.NewClock(time.Time{})
	lim, err := middleware.New(middleware.PerMinute(5).SlidingLog(), keyfunc.RemoteIP(), clock.Option())
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))
	get := func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		f, err := sluicetest.ReadFields(rec.Result())
		if err != nil {
			panic(err)
		}
		left, _ := f.Left()
		fmt.Printf("%d left=%d retry-after=%v\n", f.Status, left, f.RetryAfter)
	}

	for range 6 {
		get()
	}
	clock.Advance(time.Minute)
	get()
	// Output:
	// 200 left=4 retry-after=0s
	// 200 left=3 retry-after=0s
	// 200 left=2 retry-after=0s
	// 200 left=1 retry-after=0s
	// 200 left=0 retry-after=0s
	// 429 left=0 retry-after=1m0s
	// 200 left=4 retry-after=0s
}

// The same test of a Gin handler, through the Gin adapter. Spend uses up
// the client's first five requests without going through the router.
func Example_gin() {
	gin.SetMode(gin.ReleaseMode)
	clock := sluicetest.NewClock(time.Time{})
	lim, err := middleware.New(middleware.PerMinute(5).FixedWindow(), keyfunc.RemoteIP(), clock.Option())
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	r := gin.New()
	r.Use(sluicegin.New(sluicegin.Config{Limiter: lim}))
	r.GET("/orders", func(c *gin.Context) { c.String(http.StatusOK, "[]") })

	req := httptest.NewRequest(http.MethodGet, "/orders", nil)
	sluicetest.Spend(tbOf("Example_gin"), lim, req, 5)

	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("Retry-After"), rec.Header().Get("RateLimit"))

	clock.Advance(time.Minute)
	rec = httptest.NewRecorder()
	r.ServeHTTP(rec, req)
	fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	// Output:
	// 429 60 "default";r=0;t=60
	// 200 4
}

// Remaining and Reset read and forget a client's budget, as the admin
// handler does for support staff.
func ExampleRemaining() {
	clock := sluicetest.NewClock(time.Time{})
	lim, err := middleware.New(middleware.PerMinute(5), keyfunc.RemoteIP(), clock.Option())
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	tb := tbOf("ExampleRemaining")
	req := httptest.NewRequest(http.MethodGet, "/", nil)

	fmt.Println("admitted before the first 429:", sluicetest.Exhaust(tb, lim, req))
	fmt.Println("remaining:", sluicetest.Remaining(tb, lim, req))
	sluicetest.Reset(tb, lim, req)
	fmt.Println("after Reset:", sluicetest.Remaining(tb, lim, req))
	// Output:
	// admitted before the first 429: 5
	// remaining: 0
	// after Reset: 5
}
