package config_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware/config"
)

// openRedis opens a Reloader on the document at key.
func openRedis(t *testing.T, client redis.UniversalClient, key string, so config.SourceOptions) (*config.Reloader, error) {
	t.Helper()
	rl, err := config.OpenSource(context.Background(), &config.RedisSource{Client: client, Key: key}, config.Env{}, so)
	if err == nil {
		t.Cleanup(func() { rl.Limiter().Close() })
	}
	return rl, err
}

// waitFor polls cond until it holds or d passes, and reports how long it
// took.
func waitFor(d time.Duration, cond func() bool) (time.Duration, bool) {
	start := time.Now()
	for !cond() {
		if time.Since(start) > d {
			return time.Since(start), false
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(start), true
}

// TestRedisSourcePubSub publishes a new document to three app servers that
// poll only every minute: pub/sub brings it to all three within a second.
// A document written without an announcement arrives by polling; one that
// does not load is refused by PublishRedis and, written behind its back,
// leaves the good rules in force.
func TestRedisSourcePubSub(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	client := srv.Client(t, nil)
	key := srv.Prefix(t) + "rules"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := config.PublishRedis(ctx, client, key, []byte(rulesDoc(1)), config.Env{}); err != nil {
		t.Fatal(err)
	}
	var rls []*config.Reloader
	for range 3 {
		rl, err := openRedis(t, client, key, config.SourceOptions{Interval: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		go rl.Watch(ctx, 0, nil)
		rls = append(rls, rl)
	}
	if _, ok := waitFor(5*time.Second, func() bool {
		n, _ := client.PubSubNumSub(ctx, key).Result()
		return n[key] == 3
	}); !ok {
		t.Fatal("the three servers did not subscribe")
	}
	version, err := config.PublishRedis(ctx, client, key, []byte(rulesDoc(3)), config.Env{})
	if err != nil {
		t.Fatal(err)
	}
	for i, rl := range rls {
		took, ok := waitFor(time.Second, func() bool { return rl.Document().Version() == version })
		if !ok {
			t.Fatalf("server %d: new rules not in force after %v", i, took)
		}
		if got := admitted(rl.Limiter(), 4, "192.0.2.1"); got != 3 {
			t.Errorf("server %d: %d admitted, want 3", i, got)
		}
		if st := rl.Status(); st.SourceVersion != version || st.Err != nil {
			t.Errorf("server %d: status %+v", i, st)
		}
	}

	// A bad document: PublishRedis refuses it, naming the key and line.
	_, err = config.PublishRedis(ctx, client, key, []byte("rules:\n  - name: api\n    key: nobody\n"), config.Env{})
	if err == nil || !strings.HasPrefix(err.Error(), "redis:"+key+":3: rules[0].key: unknown key name") {
		t.Errorf("PublishRedis(bad) = %v", err)
	}
	// Written and announced behind its back, it leaves the rules in force.
	client.HSet(ctx, key, "doc", "rules: [", "version", "bad")
	client.Publish(ctx, key, "bad")
	for i, rl := range rls {
		if _, ok := waitFor(time.Second, func() bool { return rl.Status().SourceVersion == "bad" }); !ok {
			t.Fatalf("server %d: bad document not read", i)
		}
		if st := rl.Status(); st.Version != version || st.Err == nil || !strings.Contains(st.Err.Error(), "redis:"+key+":1:") {
			t.Errorf("server %d: status %+v", i, st)
		}
	}

	// Polling as a backstop: a change nobody announces arrives within
	// the poll interval.
	if _, err := openRedis(t, client, key+"-2", config.SourceOptions{}); err == nil || !strings.Contains(err.Error(), "no rules document") {
		t.Errorf("no document yet: %v", err)
	}
	if _, err := config.PublishRedis(ctx, client, key+"-2", []byte(rulesDoc(1)), config.Env{}); err != nil {
		t.Fatal(err)
	}
	poller, err := openRedis(t, client, key+"-2", config.SourceOptions{Interval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	go poller.Watch(ctx, 0, nil)
	client.HSet(ctx, key+"-2", "doc", rulesDoc(5), "version", "quiet")
	if took, ok := waitFor(time.Second, func() bool { return poller.Document().Rules[0].Limits[0].Requests == 5 }); !ok || took > 300*time.Millisecond {
		t.Errorf("unannounced change in force after %v (%v), want within the 100 ms poll interval", took, ok)
	}
}

// TestRedisSourceDown starts with Redis down, with and without a saved
// copy, and keeps the rules in force while Redis is down later.
func TestRedisSourceDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	client := srv.Client(t, &redis.Options{MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	key := srv.Prefix(t) + "rules"
	ctx := context.Background()
	if _, err := config.PublishRedis(ctx, client, key, []byte(rulesDoc(2)), config.Env{}); err != nil {
		t.Fatal(err)
	}
	cache := filepath.Join(t.TempDir(), "rules.yaml")
	rl, err := openRedis(t, client, key, config.SourceOptions{CachePath: cache, Timeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if tried, err := rl.Check(); !tried || err == nil || !strings.HasPrefix(err.Error(), "config: redis:"+key+": ") {
		t.Errorf("Redis down: Check() = %v, %v", tried, err)
	}
	if got := admitted(rl.Limiter(), 3, "192.0.2.1"); got != 2 {
		t.Errorf("Redis down: %d admitted, want 2", got)
	}
	if rl2, err := openRedis(t, client, key, config.SourceOptions{CachePath: cache, Timeout: 500 * time.Millisecond}); err != nil || !rl2.Status().FromCache {
		t.Errorf("restart with a saved copy: %v", err)
	}
	_, err = openRedis(t, client, key, config.SourceOptions{Timeout: 500 * time.Millisecond})
	if err == nil || !strings.HasPrefix(err.Error(), "config: redis:"+key+": ") || !strings.Contains(err.Error(), "no SourceOptions.CachePath") {
		t.Errorf("restart without a copy: %v", err)
	}
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
}

// TestRedisCLIRecipe runs the redis-cli command of docs/rules-sources.md
// that publishes a rules file, for real, and checks that app servers
// watching the key take the new rules.
func TestRedisCLIRecipe(t *testing.T) {
	t.Parallel()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli is not installed")
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "rules-sources.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "<!-- publish-recipe -->\n```sh\n")
	recipe, _, ok2 := strings.Cut(after, "\n```")
	if !ok || !ok2 {
		t.Fatal("docs/rules-sources.md has no publish recipe")
	}
	args, file, ok := strings.Cut(strings.TrimPrefix(recipe, "redis-cli "), " < ")
	if !ok {
		t.Fatalf("recipe %q: want redis-cli ... < FILE", recipe)
	}
	// The script is the one quoted argument; the key and the file are
	// this test's.
	pre, rest, _ := strings.Cut(args, ` "`)
	script, post, _ := strings.Cut(rest, `" `)
	fields := strings.Fields(post)
	if pre != "-x EVAL" || len(fields) != 2 || fields[0] != "1" || fields[1] != "sluice:rules" || file != "rules.yaml" {
		t.Fatalf("recipe %q does not have the expected form", recipe)
	}

	srv := redistest.Standalone(t)
	client := srv.Client(t, nil)
	key := srv.Prefix(t) + "rules"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	publish := func(doc string) string {
		t.Helper()
		host, port, _ := strings.Cut(srv.Addr(), ":")
		cmd := exec.Command(cli, "-h", host, "-p", port, "-x", "EVAL", script, "1", key)
		cmd.Stdin = strings.NewReader(doc)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v\n%s", cmd, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	publish(rulesDoc(1))
	rl, err := openRedis(t, client, key, config.SourceOptions{Interval: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if got := admitted(rl.Limiter(), 3, "192.0.2.1"); got != 1 {
		t.Errorf("first document: %d admitted, want 1", got)
	}
	go rl.Watch(ctx, 0, nil)
	if _, ok := waitFor(5*time.Second, func() bool {
		n, _ := client.PubSubNumSub(ctx, key).Result()
		return n[key] == 1
	}); !ok {
		t.Fatal("the server did not subscribe")
	}
	version := publish(rulesDoc(3))
	if took, ok := waitFor(time.Second, func() bool { return rl.Status().SourceVersion == version }); !ok {
		t.Fatalf("the published document was not in force after %v", took)
	}
	if got := admitted(rl.Limiter(), 4, "192.0.2.2"); got != 3 {
		t.Errorf("second document: %d admitted, want 3", got)
	}
}

// TestRedisSourceWrongType: a key that holds something else than the hash
// of a rules document fails with an error that says what it holds and
// what it must hold.
func TestRedisSourceWrongType(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	client := srv.Client(t, nil)
	key := srv.Prefix(t) + "rules"
	if err := client.Set(context.Background(), key, rulesDoc(1), 0).Err(); err != nil {
		t.Fatal(err)
	}
	_, err := openRedis(t, client, key, config.SourceOptions{})
	if err == nil {
		t.Fatal("a string key loaded as rules")
	}
	for _, want := range []string{key + " holds a string", "want a hash with the field doc", "field version"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if _, err := openRedis(t, client, key+"-none", config.SourceOptions{}); err == nil || !strings.Contains(err.Error(), "want a hash with the field doc") {
		t.Errorf("a missing key: %v", err)
	}
}
