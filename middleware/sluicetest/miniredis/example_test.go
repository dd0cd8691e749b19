package sluiceminiredis_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	sluiceminiredis "github.com/sluicehq/sluice/middleware/sluicetest/miniredis"
)

// A handler limited on the Redis store, tested on miniredis: the store
// decides on miniredis's clock (TIME), which the test sets.
func Example() {
	m := miniredis.NewMiniRedis()
	if err := m.Start(); err != nil {
		panic(err)
	}
	defer m.Close()
	start := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(start)
	sluiceminiredis.Enable(m) // the struct library miniredis lacks

	client := redis.NewClient(&redis.Options{Addr: m.Addr()})
	defer client.Close()
	// Generous limits: miniredis compiles each script on its first run.
	store, err := middleware.NewRedisStore(client, middleware.RedisConfig{Timeout: 5 * time.Second, StallThreshold: 2 * time.Second})
	if err != nil {
		panic(err)
	}
	defer store.Close()
	// The deny cache counts in this process's time, which SetTime does not
	// move: off, so that every request asks the store.
	lim, err := middleware.New(middleware.PerMinute(2).SlidingLog(), keyfunc.RemoteIP(),
		middleware.WithStore(store), middleware.WithDenyCache(0))
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	get := func() {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			fmt.Println(rec.Code, "Retry-After:", ra)
			return
		}
		fmt.Println(rec.Code)
	}

	get()
	get()
	get()
	m.SetTime(start.Add(time.Minute))
	get()
	// Output:
	// 200
	// 200
	// 429 Retry-After: 60
	// 200
}
