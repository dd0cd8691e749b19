package redispipe_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
)

var incr = redis.NewScript(`
local n = redis.call('INCR', KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return n`)

func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: 128})
	defer client.Close()
	p, err := redispipe.New(client, redispipe.Config{
		OnStateChange: func(dest string, up bool, cause error) {
			log.Printf("redis %s up=%v: %v", dest, up, cause)
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer p.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	n, err := p.Run(ctx, incr, []string{"hits:{client-42}"}, 60_000)
	switch {
	case errors.Is(err, redispipe.ErrUnavailable):
		// The server is down or hung: decide without it, at once.
	case err != nil:
		log.Print(err)
	default:
		log.Print(n.(int64))
	}
}
