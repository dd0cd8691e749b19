package config

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
)

// The fields of the hash that holds a rules document in Redis.
const (
	redisDocField     = "doc"
	redisVersionField = "version"
)

// RedisSource reads a rules document from a hash at Key in Redis, with
// the fields doc (the document) and version, as PublishRedis writes it.
// Each Load reads the version first and the document only when the
// version changed. It is a Notifier: PublishRedis announces each new
// version on the pub/sub channel named Key, so that every app server
// reloads within moments, and polling catches what a dropped subscription
// missed.
//
// A RedisSource is safe for concurrent use.
type RedisSource struct {
	// Client reads the document and subscribes to the channel: a
	// *redis.Client, *redis.ClusterClient or *redis.Ring. Required.
	Client redis.UniversalClient

	// Key is the hash's key, and the channel's name. Required.
	Key string

	mu      sync.Mutex
	version string // of the last document returned
}

// Name returns "redis:" and the key.
func (s *RedisSource) Name() string { return "redis:" + s.Key }

// keyShape says what a rules document's key must hold, for the errors of
// a key that holds something else.
const keyShape = "a hash with the field doc (the rules document) and the field version (any text that changes with the document), " +
	"as config.PublishRedis or the redis-cli recipe of docs/rules-sources.md writes it"

// errNoDocument is returned when the key holds no document.
var errNoDocument = errors.New("no rules document at the key: want " + keyShape)

// shapeError explains err, an error of reading key, if the key holds
// another type than a hash.
func (s *RedisSource) shapeError(ctx context.Context, err error) error {
	if !redis.HasErrorPrefix(err, "WRONGTYPE") {
		return err
	}
	if t, terr := s.Client.Type(ctx, s.Key).Result(); terr == nil {
		return fmt.Errorf("key %s holds a %s, want %s", s.Key, t, keyShape)
	}
	return fmt.Errorf("key %s holds another type than a hash (%w), want %s", s.Key, err, keyShape)
}

// Load reads the document if its version changed since the last Load.
func (s *RedisSource) Load(ctx context.Context) ([]byte, string, error) {
	s.mu.Lock()
	last := s.version
	s.mu.Unlock()
	if last != "" {
		v, err := s.Client.HGet(ctx, s.Key, redisVersionField).Result()
		switch {
		case errors.Is(err, redis.Nil):
			return nil, "", errNoDocument
		case err != nil:
			return nil, "", s.shapeError(ctx, err)
		case v == last:
			return nil, "", ErrNotModified
		}
	}
	vals, err := s.Client.HMGet(ctx, s.Key, redisDocField, redisVersionField).Result()
	if err != nil {
		return nil, "", s.shapeError(ctx, err)
	}
	doc, ok1 := vals[0].(string)
	version, ok2 := vals[1].(string)
	if !ok1 || !ok2 {
		return nil, "", errNoDocument
	}
	s.mu.Lock()
	s.version = version
	s.mu.Unlock()
	return []byte(doc), version, nil
}

// Changes subscribes to the channel named Key and signals each message
// on it. go-redis resubscribes after a dropped connection; messages sent
// meanwhile are lost, which polling makes up for.
func (s *RedisSource) Changes(ctx context.Context) <-chan struct{} {
	out := make(chan struct{}, 1)
	ps := s.Client.Subscribe(ctx, s.Key)
	go func() {
		defer ps.Close()
		msgs := ps.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case _, ok := <-msgs:
				if !ok {
					return
				}
				select {
				case out <- struct{}{}:
				default:
				}
			}
		}
	}()
	return out
}

// publishScript stores a document and its version and announces the
// version, in one step: no app server can read the new version with the
// old document, and none is told of a version before it is stored.
var publishScript = keyguard.Script(`
redis.call('HSET', KEYS[1], 'doc', ARGV[1], 'version', ARGV[2])
redis.call('PUBLISH', KEYS[1], ARGV[2])
return 1
`)

// PublishRedis checks data with Parse (as the RedisSource of key names it,
// with env, which should be the app servers'), then stores it at key and
// announces it to every RedisSource of key, atomically. A document that
// does not load is not stored, and PublishRedis returns Parse's error. It
// returns the version stored: its Document.Version.
func PublishRedis(ctx context.Context, client redis.Scripter, key string, data []byte, env Env) (string, error) {
	if key == "" {
		return "", errors.New("config: PublishRedis: empty key")
	}
	if len(data) > MaxFileSize {
		return "", &Error{File: "redis:" + key, Msg: fmt.Sprintf("document larger than %d bytes", MaxFileSize)}
	}
	cfg, err := Parse(data, "redis:"+key, env)
	if err != nil {
		return "", err
	}
	version := cfg.Version()
	if err := publishScript.Run(ctx, client, []string{key}, data, version).Err(); err != nil {
		return "", fmt.Errorf("config: PublishRedis: %w", err)
	}
	return version, nil
}
