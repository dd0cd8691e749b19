package middleware_test

import (
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// Rules in lease and write-back mode on the Redis store, shared by every
// app server: each decides in memory and keeps the fleet's count in Redis
// in the background. (Not run: it needs a Redis server.)
func Example_fleetMode() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store, err := middleware.NewRedisStore(client, middleware.RedisConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	lim, err := middleware.NewRules([]middleware.Rule{
		// Never more than 600 a minute across the fleet; slices of at most
		// 20 leased by each server.
		{Name: "feed", Path: "/api/feed", Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{middleware.PerMinute(600)}, Sync: middleware.SyncLease, Lease: 20},
		// At most servers × 10 over 1000 a minute, plus what the fleet
		// admits in 200 ms.
		{Name: "events", Path: "/api/events", Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{middleware.PerMinute(1000)}, Sync: middleware.SyncWriteBack,
			SyncInterval: 200 * time.Millisecond, MaxUnsynced: 10},
	}, middleware.WithStore(store), middleware.WithObserver(&middleware.Hooks{
		OnSynced: func(e middleware.SyncEvent) {
			if e.Kind == middleware.SyncFlushed && e.Err != nil {
				log.Printf("fleet sync: %v", e.Err)
			}
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close() // pushes what is unsynced and gives back what is leased
}

func ExampleParseSyncMode() {
	for _, s := range []string{"exact", "lease", "write_back", "writeback"} {
		m, err := middleware.ParseSyncMode(s)
		fmt.Println(m, err)
	}
	// Output:
	// exact <nil>
	// lease <nil>
	// write_back <nil>
	// exact unknown sync mode "writeback" (want exact, lease or write_back)
}
