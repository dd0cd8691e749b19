package redisprobe_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redisprobe"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestProbe runs the probe on a real server, as users whose ACLs take
// commands away from sluice would: each command the scripts need that the
// server refuses is named; a server that has everything passes, and
// nothing is written.
func TestProbe(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	admin := srv.Client(t, nil)
	p := srv.Prefix(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		acl  string   // the rules of the probe's user; "" for the default user
		want []string // parts of the error; nil for none
	}{
		{"everything", "", nil},
		{"no HRANDFIELD", "+@all -hrandfield", []string{"HRANDFIELD with WITHVALUES (Redis 6.2)"}},
		{"no PEXPIRE", "+@all -pexpire", []string{"PEXPIRE with GT and NX (Redis 7.0)"}},
		{"no ZADD, no TIME", "+@all -zadd -time", []string{"TIME in scripts", "ZADD with GT"}},
		{"no scripts", "+@all -@scripting", []string{"permission to run scripts", "NOPERM"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := &redis.Options{}
			if tc.acl != "" {
				user := "probe-" + strings.ReplaceAll(tc.name, " ", "-")
				args := []any{"ACL", "SETUSER", user, "reset", "on", ">pw", "~*", "&*"}
				for _, r := range strings.Fields(tc.acl) {
					args = append(args, r)
				}
				if err := admin.Do(ctx, args...).Err(); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { admin.Do(context.Background(), "ACL", "DELUSER", user) })
				opts.Username, opts.Password = user, "pw"
			}
			err := redisprobe.Check(ctx, srv.Client(t, opts), p)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Check: %v", err)
				}
				return
			}
			var perr *redisprobe.Error
			if !errors.As(err, &perr) {
				t.Fatalf("Check: %v, want a *redisprobe.Error", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Check: %v\nwant it to name %q", err, w)
				}
			}
		})
	}
	if n, err := admin.Exists(ctx, redisprobe.Key(p)).Result(); err != nil || n != 0 {
		t.Fatalf("EXISTS %s: %d, %v: the probe wrote", redisprobe.Key(p), n, err)
	}
}

// TestProbeNoAnswer checks that a server that cannot be reached is not
// refused, and that the probe gives up within its Timeout.
func TestProbeNoAnswer(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	c := srv.Client(t, &redis.Options{MaxRetries: -1})
	srv.Stop()
	start := time.Now()
	if err := redisprobe.Check(context.Background(), c, "sluice:"); err != nil {
		t.Fatalf("Check of a stopped server: %v, want nil", err)
	}
	if d := time.Since(start); d > redisprobe.Timeout+time.Second {
		t.Fatalf("Check took %v, more than its Timeout %v and a second", d, redisprobe.Timeout)
	}
}
