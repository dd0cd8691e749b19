package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

// rulesSource returns the Source of a -config value that names a rules
// service: an http:// or https:// URL, or redis://host:port/db?key=NAME
// (any other redis:// URL parameter is go-redis's). It returns a nil
// Source for a path. close releases what the source holds.
func rulesSource(spec string) (src config.Source, close func() error, err error) {
	close = func() error { return nil }
	switch {
	case strings.HasPrefix(spec, "http://"), strings.HasPrefix(spec, "https://"):
		return &config.HTTPSource{URL: spec}, close, nil
	case strings.HasPrefix(spec, "redis://"), strings.HasPrefix(spec, "rediss://"):
		u, err := url.Parse(spec)
		if err != nil {
			return nil, nil, fmt.Errorf("-config: %w", err)
		}
		q := u.Query()
		key := q.Get("key")
		if key == "" {
			return nil, nil, fmt.Errorf("-config %s: want the key of the rules document, as in redis://localhost:6379/0?key=sluice:rules", u.Redacted())
		}
		q.Del("key")
		u.RawQuery = q.Encode()
		opts, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, nil, fmt.Errorf("-config %s: %w", u.Redacted(), err)
		}
		client := redis.NewClient(opts)
		return &config.RedisSource{Client: client, Key: key}, client.Close, nil
	}
	return nil, close, nil
}

// openRules opens the rules named by -config: a file, watched every
// second, or a rules service, polled every poll. cache, when not empty,
// keeps the last good document of a rules service for restarts during its
// outages.
func openRules(ctx context.Context, spec string, poll time.Duration, cache string, opts []middleware.Option) (rl *config.Reloader, watchEvery time.Duration, close func() error, err error) {
	src, close, err := rulesSource(spec)
	if err != nil {
		return nil, 0, nil, err
	}
	if src == nil {
		rl, err := config.Open(spec, demoEnv, opts...)
		return rl, time.Second, close, err
	}
	rl, err = config.OpenSource(ctx, src, demoEnv, config.SourceOptions{Interval: poll, CachePath: cache}, opts...)
	if err != nil {
		close()
		return nil, 0, nil, err
	}
	return rl, poll, close, nil
}
