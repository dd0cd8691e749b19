package middleware_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// A token budget: 1,000 tokens a minute per API key beside 60 requests,
// each request charged an estimate of 100 on arrival and settling, once
// its work is done, the tokens it used. The third request takes the key
// past its budget, a debt: the fourth is refused until it is waited off.
func ExampleSettle() {
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name: "chat", Key: keyfunc.Header("X-API-Key"),
		Limits: []middleware.Limit{middleware.PerMinute(60)},
		Usage: &middleware.Usage{
			Unit: "tokens", Limits: []middleware.Limit{middleware.PerMinute(1000)}, Estimate: 100, Max: 800,
		},
	}}, middleware.WithClock(func() time.Time { return time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) }))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		used, _ := strconv.Atoi(r.URL.Query().Get("used")) // what the work turned out to cost
		if err := middleware.Settle(r.Context(), used); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
	}))

	for _, used := range []int{300, 500, 700, 10} {
		req := httptest.NewRequest("POST", "/v1/chat?used="+strconv.Itoa(used), nil)
		req.Header.Set("X-API-Key", "k1")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("RateLimit"))
	}
	// Output:
	// 200 "chat";r=59;t=120, "chat-tokens";r=900;t=61
	// 200 "chat";r=58;t=90, "chat-tokens";r=600;t=61
	// 200 "chat";r=57;t=80, "chat-tokens";r=100;t=61
	// 429 "chat-tokens";r=0;t=81, "chat";r=57;t=80
}
