package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redispipe"
)

//go:embed top.lua
var topSrc string

var topScript = keyguard.Script(topSrc)

// Top-client summaries: each app server publishes, for each rule, one
// opaque payload (the middleware's encoding of its summaries) with a TTL;
// readers merge the payloads of the servers that published within it.
// A rule's summaries are two keys in one hash slot,
// "<prefix>{top:<16 hex digits>}servers" (a sorted set of servers by the
// instant they published) and "...}payloads" (a hash of server to
// payload), named by a hash of the rule so that any rule name fits.
// Payloads hold client keys in plain text.

// TopSummary is one server's payload for a rule, as CollectTop returns it.
type TopSummary struct {
	Server  string
	Payload []byte
	// Age is how long ago the server published it, by the Redis clock.
	Age time.Duration
}

// topKeys returns the keys of rule's summaries.
func (s *Store) topKeys(rule string) []string {
	sum := sha256.Sum256([]byte(rule))
	tag := s.prefix + "{top:" + hex.EncodeToString(sum[:8]) + "}"
	return []string{tag + "servers", tag + "payloads"}
}

// PublishTop stores server's payload for rule for ttl (on the Redis
// clock unless now is set), dropping the servers whose payloads are older
// than ttl.
func (s *Store) PublishTop(ctx context.Context, now time.Time, rule, server string, payload []byte, ttl time.Duration) error {
	arg, err := nowArg(now)
	if err != nil {
		return err
	}
	if ttl < time.Millisecond || server == "" {
		return fmt.Errorf("redisstore: publish top: ttl %s and server %q: want at least 1ms and a name", ttl, server)
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	if _, err := s.evalQuiet(ctx, topScript, s.topKeys(rule), "put", arg, ttl.Milliseconds(), server, payload); err != nil {
		return fmt.Errorf("redisstore: publish top: %w", err)
	}
	return nil
}

// CollectTop returns the payloads for rule of the servers that published
// within ttl (on the Redis clock unless now is set).
func (s *Store) CollectTop(ctx context.Context, now time.Time, rule string, ttl time.Duration) ([]TopSummary, error) {
	arg, err := nowArg(now)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.evalQuiet(ctx, topScript, s.topKeys(rule), "get", arg, max(ttl.Milliseconds(), 1))
	if err != nil {
		return nil, fmt.Errorf("redisstore: collect top: %w", err)
	}
	r, ok := v.([]any)
	if !ok || len(r)%3 != 1 {
		return nil, fmt.Errorf("redisstore: collect top: reply %T", v)
	}
	at, err := intAt(r, 0)
	if err != nil {
		return nil, fmt.Errorf("redisstore: collect top: %w", err)
	}
	out := make([]TopSummary, 0, len(r)/3)
	for i := 1; i < len(r); i += 3 {
		name, ok1 := r[i].(string)
		published, err := intAt(r, i+1)
		payload, ok2 := r[i+2].(string)
		if !ok1 || !ok2 || err != nil {
			return nil, errors.New("redisstore: collect top: malformed reply")
		}
		out = append(out, TopSummary{Server: name, Payload: []byte(payload), Age: time.Duration(max(at-published, 0)) * time.Millisecond})
	}
	return out, nil
}

// Servers returns the health of the Redis servers the store has sent to
// (nil for a client the store does not pipeline, whose health it does
// not follow).
func (s *Store) Servers() []redispipe.ServerState {
	if s.pipe == nil {
		return nil
	}
	return s.pipe.Servers()
}
