package envoyrls_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/adapters/envoyrls"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
	"github.com/sluicehq/sluice/middleware/config"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// t0 is 10 s into a minute: a fixed window of a minute renews 50 s later.
var t0 = time.Date(2030, 1, 1, 12, 0, 10, 0, time.UTC)

// backend makes the store of a test.
type backend struct {
	name  string
	store func(t *testing.T) middleware.Store
}

// backends are the stores every conformance test runs on: memory, a real
// standalone Redis and a real Redis Cluster, shared by the tests of the
// binary, each test under its own key prefix.
var backends = []backend{
	{"memory", func(t *testing.T) middleware.Store {
		s, err := middleware.NewMemoryStore(middleware.MemoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { closeStore(s) })
		return s
	}},
	{"redis", func(t *testing.T) middleware.Store {
		srv := redistest.Shared(t)
		return patientStore(t, srv.Client(t, nil), srv.Prefix(t))
	}},
	{"cluster", func(t *testing.T) middleware.Store {
		c := redistest.SharedCluster(t)
		return patientStore(t, c.Client(t, nil), c.Prefix(t))
	}},
}

// patientStore is a Redis store for tests of what is decided, not of
// outages: a server is never taken as down for being slow (the machine
// may be busy), and a decision may take a second.
func patientStore(t *testing.T, client redis.Scripter, prefix string) middleware.Store {
	return redisStore(t, client, middleware.RedisConfig{Prefix: prefix, Timeout: time.Second, StallThreshold: -1})
}

func redisStore(t *testing.T, client redis.Scripter, cfg middleware.RedisConfig) middleware.Store {
	t.Helper()
	s, err := middleware.NewRedisStore(client, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(s) })
	return s
}

// closeStore closes s if it can be closed.
func closeStore(s middleware.Store) {
	if c, ok := s.(interface{ Close() error }); ok {
		_ = c.Close()
	}
}

// rls is a rate limit service on a loopback port and a client of it.
type rls struct {
	client    rlsv3.RateLimitServiceClient
	clock     *testclock.Clock
	reloaders []*config.Reloader
	paths     []string
}

// startRLS serves the descriptor files docs with store, on a fake clock
// set to t0, through a real gRPC server on loopback.
func startRLS(t *testing.T, store middleware.Store, opts envoyrls.Options, extra []middleware.Option, docs ...string) *rls {
	t.Helper()
	r := &rls{clock: testclock.New(t0)}
	dir := t.TempDir()
	var domains []envoyrls.Domain
	for i, doc := range docs {
		p := filepath.Join(dir, "rls"+string(rune('a'+i))+".yaml")
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		o := append([]middleware.Option{middleware.WithStore(store), middleware.WithClock(r.clock.Now)}, extra...)
		rl, err := config.Open(p, config.Env{RateLimitService: true}, o...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rl.Limiter().Close() })
		r.reloaders = append(r.reloaders, rl)
		r.paths = append(r.paths, p)
		domains = append(domains, rl)
	}
	srv, err := envoyrls.NewServer(opts, domains...)
	if err != nil {
		t.Fatal(err)
	}
	r.client = serve(t, srv.Register)
	return r
}

// serve starts a gRPC server on a loopback port with what register
// registers, and returns a client connection's RateLimitService client.
func serve(t *testing.T, register func(grpc.ServiceRegistrar), sopts ...grpc.ServerOption) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(serveConn(t, register, sopts...))
}

func serveConn(t *testing.T, register func(grpc.ServiceRegistrar), sopts ...grpc.ServerOption) *grpc.ClientConn {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(sopts...)
	register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// desc builds a descriptor from "key=value" pairs; a last element "+N"
// sets the descriptor's own hits_addend to N.
func desc(pairs ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for _, p := range pairs {
		if n, ok := strings.CutPrefix(p, "+"); ok {
			var v uint64
			for _, c := range n {
				v = v*10 + uint64(c-'0')
			}
			d.HitsAddend = wrapperspb.UInt64(v)
			continue
		}
		k, v, _ := strings.Cut(p, "=")
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

// call sends one ShouldRateLimit and fails the test on a gRPC error.
func (r *rls) call(t *testing.T, domain string, hits uint32, descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := r.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descs, HitsAddend: hits})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// outcomes counts the outcomes an Observer is told of.
type outcomes struct {
	middleware.NopObserver
	failedOpen, allowed, denied atomic.Int64
}

func (o *outcomes) Decided(_ keyfunc.Request, res *middleware.Result) {
	switch res.Outcome {
	case middleware.OutcomeFailedOpen:
		o.failedOpen.Add(1)
	case middleware.OutcomeAllowed:
		o.allowed.Add(1)
	case middleware.OutcomeDenied:
		o.denied.Add(1)
	}
}
