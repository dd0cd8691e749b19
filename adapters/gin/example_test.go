package sluicegin_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/gin-gonic/gin"

	sluicegin "github.com/sluicehq/sluice/adapters/gin"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func ExampleNew() {
	lim, err := middleware.New(middleware.PerMinute(2), keyfunc.RemoteIP())
	if err != nil {
		panic(err)
	}
	defer lim.Close()

	r := gin.New()
	r.Use(sluicegin.New(sluicegin.Config{
		Limiter: lim,
		Skip:    func(c *gin.Context) bool { return c.FullPath() == "/healthz" },
	}))
	r.GET("/", func(c *gin.Context) { c.String(http.StatusOK, "hello\n") })

	for range 3 {
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
}
