package config_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/middleware/config"
)

func ExampleParse() {
	const file = `rules:
  - name: api
    match: {path: "/api/*"}
    key: ip
    limits: [{requests: 100, window: 1m}]
  - name: login
    match: {path: "/api/login", methods: [POST]}
    key: ip
    limits: [{requests: 5, window: 5x}]
`
	_, err := config.Parse([]byte(file), "rules.yaml", config.Env{})
	fmt.Println(err)
	// Output:
	// rules.yaml:9: rules[1].limits[0].window: bad duration "5x"
}

// The rules file of a server, reloaded when it changes and on SIGHUP.
func ExampleOpen() {
	env := config.Env{
		// user_id and user_or_ip count signed-in users by what the
		// authentication middleware stored in the request's context.
		User: func(ctx context.Context) (string, bool) {
			u, ok := ctx.Value(userKey{}).(string)
			return u, ok
		},
	}
	rl, err := config.Open("rules.yaml", env)
	if err != nil {
		log.Fatal(err) // rules.yaml:7: rules[1].limits[0].window: bad duration "5x"
	}
	defer rl.Limiter().Close()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	go rl.Watch(ctx, 2*time.Second, func(err error) {
		if err != nil {
			log.Printf("rules not reloaded: %v", err)
			return
		}
		log.Printf("rules reloaded: %d rules", len(rl.Document().Rules))
	})
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		for range hup {
			if err := rl.Reload(); err != nil {
				log.Printf("rules not reloaded: %v", err)
			}
		}
	}()

	mux := http.NewServeMux()
	srv := &http.Server{Addr: ":8080", Handler: rl.Limiter().Handler(mux)}
	go func() {
		<-ctx.Done()
		srv.Shutdown(context.Background())
	}()
	if err := srv.ListenAndServe(); err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
