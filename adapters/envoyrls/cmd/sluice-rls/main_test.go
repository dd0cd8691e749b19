package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/middleware/config"
)

const doc = "domain: cmd\ndescriptors:\n  - key: client\n    rate_limit: {unit: minute, requests_per_unit: 3}\n"

// syncBuffer is a log sink safe for concurrent use.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the command with args on loopback ports and returns a
// connection to its gRPC listener and the address of its HTTP one.
func start(t *testing.T, args ...string) (*grpc.ClientConn, string, *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	type addrs struct{ g, h string }
	readyc := make(chan addrs, 1)
	done := make(chan error, 1)
	logs := &syncBuffer{}
	args = append([]string{"-grpc-addr", "127.0.0.1:0", "-http-addr", "127.0.0.1:0"}, args...)
	go func() { done <- run(ctx, args, logs, func(g, h string) { readyc <- addrs{g, h} }) }()
	var a addrs
	select {
	case a = <-readyc:
	case err := <-done:
		cancel()
		t.Fatalf("run: %v\n%s", err, logs)
	case <-time.After(10 * time.Second):
		cancel()
		t.Fatalf("not ready after 10s\n%s", logs)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
	})
	conn, err := grpc.NewClient("passthrough:///"+a.g, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn, a.h, logs
}

func remaining(t *testing.T, c rlsv3.RateLimitServiceClient, client string) (rlsv3.RateLimitResponse_Code, uint32, uint32) {
	t.Helper()
	resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "cmd",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: client}}}}})
	if err != nil {
		t.Fatal(err)
	}
	st := resp.Statuses[0]
	return resp.OverallCode, st.GetCurrentLimit().GetRequestsPerUnit(), st.LimitRemaining
}

// TestCommand runs sluice-rls on a file, counting in memory: it answers
// the rate limit service, health checks and reflection, serves /metrics,
// and reloads the file when it changes.
func TestCommand(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rl.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	conn, httpAddr, logs := start(t, "-config", path, "-poll", "20ms")
	c := rlsv3.NewRateLimitServiceClient(conn)
	for i, want := range []uint32{2, 1, 0} {
		if code, _, rem := remaining(t, c, "a"); code != rlsv3.RateLimitResponse_OK || rem != want {
			t.Fatalf("call %d: %v, %d remaining, want OK, %d", i+1, code, rem, want)
		}
	}
	if code, _, _ := remaining(t, c, "a"); code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("call 4: %v, want OVER_LIMIT", code)
	}

	h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v, %v", h, err)
	}
	stream, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	rr, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, s := range rr.GetListServicesResponse().GetService() {
		services = append(services, s.Name)
	}
	if !strings.Contains(strings.Join(services, " "), "envoy.service.ratelimit.v3.RateLimitService") {
		t.Errorf("reflection lists %v", services)
	}
	_ = stream.CloseSend()

	resp, err := http.Get("http://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`sluice_decisions_total{outcome="allowed",rule="cmd.client"} 3`, `sluice_decisions_total{outcome="denied",rule="cmd.client"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A new limit, picked up by the poll; the count carries on.
	if err := os.WriteFile(path, []byte(strings.Replace(doc, "3}", "5}", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, limit, rem := remaining(t, c, "b")
		if limit == 5 {
			if code != rlsv3.RateLimitResponse_OK {
				t.Fatalf("after reload: %v", code)
			}
			break
		}
		_ = rem
		if time.Now().After(deadline) {
			t.Fatalf("limit still %d 5s after the file changed\n%s", limit, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The reload is logged just after the new rules are in force.
	for !strings.Contains(logs.String(), "rules reloaded") {
		if time.Now().After(deadline) {
			t.Fatalf("no reload logged:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestCommandRedis runs sluice-rls on Redis with its descriptor file in
// Redis: a document published with config.PublishRedis is in force soon
// after, and counters live in Redis.
func TestCommandRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	client := srv.Client(t, nil)
	prefix := srv.Prefix(t)
	key := prefix + "rules"
	env := config.Env{RateLimitService: true}
	if _, err := config.PublishRedis(context.Background(), client, key, []byte(doc), env); err != nil {
		t.Fatal(err)
	}
	conn, _, logs := start(t, "-config", "redis:///"+key, "-redis", srv.Addr(), "-redis-prefix", prefix, "-failure", "closed", "-timeout", "1s",
		"-poll", "200ms", // a backstop for an announcement sent before the subscription is up
		"-redis-stall", "-1ms") // a busy machine's slow answers are not an outage here
	c := rlsv3.NewRateLimitServiceClient(conn)
	if !strings.Contains(logs.String(), "store ready") {
		t.Errorf("no warm-up logged:\n%s", logs)
	}
	if code, limit, rem := remaining(t, c, "a"); code != rlsv3.RateLimitResponse_OK || limit != 3 || rem != 2 {
		t.Fatalf("first call: %v, limit %d, remaining %d", code, limit, rem)
	}
	if n := countKeys(t, client, prefix); n == 0 {
		t.Error("no counter in Redis")
	}
	if _, err := config.PublishRedis(context.Background(), client, key, []byte(strings.Replace(doc, "3}", "7}", 1)), env); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, limit, _ := remaining(t, c, "a"); limit == 7 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("published limit not in force after 5s\n%s", logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func countKeys(t *testing.T, c *redis.Client, prefix string) int {
	t.Helper()
	keys, err := c.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return len(keys)
}
