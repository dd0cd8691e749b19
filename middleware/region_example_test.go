package middleware_test

import (
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// An app server in eu-west-1, with its region's Redis and the Redis of
// the two other regions: 100 requests a minute per address across the
// regions, at most 60 of them in one region, and 3 one-time passwords an
// hour decided in us-east-1. (Not run: it needs Redis servers.)
func ExampleNewRegionStore() {
	local := redis.NewClient(&redis.Options{Addr: "redis.eu-west-1.internal:6379"})
	store, err := middleware.NewRegionStore(middleware.RegionConfig{
		Region: "eu-west-1",
		Redis:  local,
		Peers: map[string]redis.UniversalClient{
			"us-east-1":      redis.NewClient(&redis.Options{Addr: "redis.us-east-1.internal:6379"}),
			"ap-southeast-1": redis.NewClient(&redis.Options{Addr: "redis.ap-southeast-1.internal:6379"}),
		},
		Home: "us-east-1",
	})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	lim, err := middleware.NewRules([]middleware.Rule{
		{Name: "global", Key: keyfunc.RemoteIP(), Scope: middleware.ScopeGlobal, SyncInterval: 250 * time.Millisecond,
			Limits: []middleware.Limit{middleware.PerMinute(100).FixedWindow()}},
		{Name: "per-region", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(60)}},
		{Name: "otp", Path: "/login/otp", Key: keyfunc.RemoteIP(), Scope: middleware.ScopeGlobalStrict,
			Limits: []middleware.Limit{middleware.PerHour(3).FixedWindow()}},
	}, middleware.WithStore(store), middleware.WithObserver(&middleware.Hooks{
		OnRegion: func(e middleware.RegionEvent) {
			if e.Kind == middleware.RegionPeerUnreachable {
				log.Printf("region %s unreachable: it counts as its share", e.Peer)
			}
		},
	}))
	if err != nil {
		log.Fatal(err)
	}
	defer lim.Close()
}

func ExampleParseScope() {
	for _, s := range []string{"region", "global", "global_strict", "world"} {
		sc, err := middleware.ParseScope(s)
		fmt.Println(sc, err)
	}
	// Output:
	// region <nil>
	// global <nil>
	// global_strict <nil>
	// region unknown scope "world" (want region, global or global_strict)
}
