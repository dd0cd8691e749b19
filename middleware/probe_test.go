package middleware_test

import (
	"context"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware"
)

// TestNewRedisStoreRefusesLackingServer checks that a server that lacks a
// command the scripts need is refused when the store is made, with an
// error naming the command, rather than failing every decision (which
// the failure policy would turn into admitting everyone). The server
// lacks it here because its ACL takes PEXPIRE away from the store's user,
// as Redis 6.2 lacks PEXPIRE's GT.
func TestNewRedisStoreRefusesLackingServer(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	ctx := context.Background()
	if err := srv.Client(t, nil).Do(ctx, "ACL", "SETUSER", "nopexpire", "on", ">pw", "~*", "&*", "+@all", "-pexpire").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := middleware.NewRedisStore(srv.Client(t, &redis.Options{Username: "nopexpire", Password: "pw"}), middleware.RedisConfig{Prefix: srv.Prefix(t)})
	if err == nil || !strings.Contains(err.Error(), "PEXPIRE with GT and NX (Redis 7.0)") {
		t.Fatalf("NewRedisStore on a server without PEXPIRE: %v", err)
	}
	s, err := middleware.NewRedisStore(srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t)})
	if err != nil {
		t.Fatalf("NewRedisStore on a server with everything: %v", err)
	}
	s.Close()
}
