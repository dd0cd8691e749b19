package config_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/middleware/config"
)

// Rules from a rules service over HTTP, polled every 10 s by each app
// server, with the last good document saved for restarts during an
// outage of the service. Here the service is a test server, and the
// Envoy-style document it serves limits each client address to 10
// requests a second.
func ExampleOpenSource() {
	service := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "domain: edge\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	}))
	defer service.Close()
	dir, _ := os.MkdirTemp("", "sluice-example")
	defer os.RemoveAll(dir)

	src := &config.HTTPSource{URL: service.URL + "/rules.yaml"}
	rl, err := config.OpenSource(context.Background(), src, config.Env{}, config.SourceOptions{
		Interval:  10 * time.Second,
		CachePath: filepath.Join(dir, "rules.yaml"),
		OnStatus: func(st config.Status) {
			// Export st.LoadedAt, st.Failures and st.Err to metrics.
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer rl.Limiter().Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go rl.Watch(ctx, 0, func(err error) {
		if err != nil {
			log.Printf("rules not reloaded; the rules in force stay: %v", err)
		}
	})

	for _, r := range rl.Document().Rules {
		fmt.Println(r.Name, r.Limits)
	}
	fmt.Println(rl.Status().Err)
	// Output:
	// edge.remote_address [10/1s fixed_window]
	// <nil>
}

// A deploy tool publishes a new rules document to Redis: every app server
// whose RedisSource reads the key reloads it within moments.
func ExamplePublishRedis() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	doc, err := os.ReadFile("rules.yaml")
	if err != nil {
		log.Fatal(err)
	}
	// env must be the app servers' own, so that the document is checked
	// as they will load it.
	version, err := config.PublishRedis(context.Background(), client, "sluice:rules", doc, config.Env{})
	if err != nil {
		log.Fatal(err) // redis:sluice:rules:7: rules[1].limits[0].window: bad duration "5x"
	}
	log.Printf("published version %s", version)

	// On each app server:
	//
	//	src := &config.RedisSource{Client: client, Key: "sluice:rules"}
	//	rl, err := config.OpenSource(ctx, src, env, config.SourceOptions{})
	//	go rl.Watch(ctx, 0, rl.LogReloads(logger))
}
