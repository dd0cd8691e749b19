package grpclimit_test

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/adapters/grpclimit"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testclock"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// t0 is 40 s into a minute: fixed windows of a minute renew 20 s later.
var t0 = time.Date(2030, 1, 1, 12, 0, 40, 0, time.UTC)

// stores are the stores the interceptors are tested on.
var stores = []struct {
	name string
	make func(t *testing.T) middleware.Store
}{
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
		// Never taken as down for being slow: the machine may be busy.
		return redisStore(t, srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), Timeout: time.Second, StallThreshold: -1})
	}},
}

func redisStore(t *testing.T, c redis.Scripter, cfg middleware.RedisConfig) middleware.Store {
	s, err := middleware.NewRedisStore(c, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore(s) })
	return s
}

func closeStore(s middleware.Store) {
	if c, ok := s.(io.Closer); ok {
		_ = c.Close()
	}
}

// service is a TestService whose calls can be held until released.
type service struct {
	testpb.UnimplementedTestServiceServer
	entered chan struct{} // receives when a held call starts
	release chan struct{} // a held call returns when this is closed or receives
}

func (s *service) EmptyCall(context.Context, *testpb.Empty) (*testpb.Empty, error) {
	return &testpb.Empty{}, nil
}

func (s *service) UnaryCall(ctx context.Context, _ *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	if len(md.Get("hold")) > 0 {
		s.entered <- struct{}{}
		<-s.release
	}
	usage(ctx, md, func(t metadata.MD) { _ = grpc.SetTrailer(ctx, t) })
	return &testpb.SimpleResponse{}, nil
}

// usage reports the call's usage as its metadata asks: "settle: n" through
// middleware.Settle and ctx, "trailer: n" in the usage trailer.
func usage(ctx context.Context, md metadata.MD, setTrailer func(metadata.MD)) {
	if v := md.Get("settle"); len(v) > 0 {
		n, _ := strconv.Atoi(v[0])
		_ = middleware.Settle(ctx, n)
	}
	if v := md.Get("trailer"); len(v) > 0 {
		setTrailer(metadata.Pairs(usageTrailer, v[0], "other", "kept"))
	}
}

// usageTrailer is the usage trailer of the rules with usage limits.
const usageTrailer = "x-usage-tokens"

// FullDuplexCall answers each message with an empty one. With a
// "per-message: n" metadata it reports n units per message it received
// when the stream ends, whether the client closed it or went away: in the
// usage trailer if the call's metadata has "trailer", else through
// middleware.Settle.
func (s *service) FullDuplexCall(stream testpb.TestService_FullDuplexCallServer) error {
	if md, _ := metadata.FromIncomingContext(stream.Context()); len(md.Get("per-message")) > 0 {
		per, _ := strconv.Atoi(md.Get("per-message")[0])
		received := 0
		defer func() {
			if len(md.Get("trailer")) > 0 {
				stream.SetTrailer(metadata.Pairs(usageTrailer, strconv.Itoa(per*received)))
				return
			}
			_ = middleware.Settle(stream.Context(), per*received)
		}()
		for {
			if _, err := stream.Recv(); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
			received++
			if err := stream.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
				return err
			}
		}
	}
	for {
		if _, err := stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{}); err != nil {
			return err
		}
	}
}

// start serves the TestService behind the interceptors of lim on a
// loopback port, after the unary interceptors before, and returns a
// client.
func start(t *testing.T, lim *middleware.Limiter, o grpclimit.Options, before ...grpc.UnaryServerInterceptor) (testpb.TestServiceClient, *service) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ChainUnaryInterceptor(append(before, grpclimit.UnaryServerInterceptor(lim, o))...),
		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, o)))
	svc := &service{entered: make(chan struct{}, 4), release: make(chan struct{})}
	testpb.RegisterTestServiceServer(g, svc)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return testpb.NewTestServiceClient(conn), svc
}

func newLimiter(t *testing.T, store middleware.Store, clk *testclock.Clock, rules ...middleware.Rule) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.NewRules(rules, middleware.WithStore(store), middleware.WithClock(clk.Now))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	return lim
}

func withMD(kv ...string) context.Context {
	return metadata.AppendToOutgoingContext(context.Background(), kv...)
}

// TestUnary limits unary calls by peer address and by route, and checks
// what a refused call gets: ResourceExhausted, RetryInfo and the fields.
func TestUnary(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(t0)
			lim := newLimiter(t, st.make(t), clk,
				middleware.Rule{Name: "unary", Path: "/grpc.testing.TestService/UnaryCall", Key: keyfunc.RemoteIP(),
					Limits: []middleware.Limit{middleware.PerMinute(3).FixedWindow()}})
			c, _ := start(t, lim, grpclimit.Options{})
			for i, want := range []string{`"unary";r=2;t=20`, `"unary";r=1;t=20`, `"unary";r=0;t=20`} {
				var hdr metadata.MD
				if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}, grpc.Header(&hdr)); err != nil {
					t.Fatalf("call %d: %v", i+1, err)
				}
				if got := hdr.Get("ratelimit"); len(got) != 1 || got[0] != want {
					t.Errorf("call %d: ratelimit %q, want %q", i+1, got, want)
				}
			}
			var hdr metadata.MD
			_, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}, grpc.Header(&hdr))
			s := status.Convert(err)
			if s.Code() != codes.ResourceExhausted {
				t.Fatalf("call 4: %v, want ResourceExhausted", err)
			}
			var retry *errdetails.RetryInfo
			for _, d := range s.Details() {
				if ri, ok := d.(*errdetails.RetryInfo); ok {
					retry = ri
				}
			}
			if retry == nil || retry.RetryDelay.AsDuration() != 20*time.Second {
				t.Errorf("call 4: RetryInfo %v, want 20s", retry)
			}
			if got := hdr.Get("retry-after"); len(got) != 1 || got[0] != "20" {
				t.Errorf("call 4: retry-after %q, want 20", got)
			}
			if got := hdr.Get("ratelimit-policy"); len(got) != 1 || got[0] != `"unary";q=3;w=60` {
				t.Errorf("call 4: ratelimit-policy %q", got)
			}
			// Another method is not limited by the route's rule.
			for range 5 {
				if _, err := c.EmptyCall(context.Background(), &testpb.Empty{}); err != nil {
					t.Fatalf("EmptyCall: %v", err)
				}
			}
			clk.Add(20 * time.Second)
			if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("after 20s: %v", err)
			}
		})
	}
}

// TestKeys keys calls by API key (metadata), by the client behind a
// trusted proxy, by the full method and by the user an authentication
// interceptor found, and refuses a call without a key.
func TestKeys(t *testing.T) {
	t.Parallel()
	clk := testclock.New(t0)
	behind, err := keyfunc.TrustedProxies("X-Forwarded-For", "127.0.0.0/8")
	if err != nil {
		t.Fatal(err)
	}
	lim := newLimiter(t, stores[0].make(t), clk,
		middleware.Rule{Name: "by-key", Path: "/grpc.testing.TestService/UnaryCall", Key: keyfunc.APIKey("X-Api-Key", []byte("secret")),
			Limits: []middleware.Limit{middleware.PerMinute(1).FixedWindow()}},
		middleware.Rule{Name: "by-client", Path: "/grpc.testing.TestService/EmptyCall", Key: behind,
			Limits: []middleware.Limit{middleware.PerMinute(1).FixedWindow()}})
	c, _ := start(t, lim, grpclimit.Options{})
	code := func(ctx context.Context, unary bool) codes.Code {
		var err error
		if unary {
			_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{})
		} else {
			_, err = c.EmptyCall(ctx, &testpb.Empty{})
		}
		return status.Code(err)
	}
	steps := []struct {
		what  string
		ctx   context.Context
		unary bool
		want  codes.Code
	}{
		{"key a", withMD("x-api-key", "a"), true, codes.OK},
		{"key a again", withMD("x-api-key", "a"), true, codes.ResourceExhausted},
		{"key b", withMD("x-api-key", "b"), true, codes.OK},
		{"no key", context.Background(), true, codes.InvalidArgument},
		{"client 192.0.2.1", withMD("x-forwarded-for", "192.0.2.1"), false, codes.OK},
		{"client 192.0.2.1 again", withMD("x-forwarded-for", "192.0.2.1"), false, codes.ResourceExhausted},
		{"client 192.0.2.2", withMD("x-forwarded-for", "192.0.2.2"), false, codes.OK},
		{"the proxy itself", context.Background(), false, codes.OK},
		{"the proxy itself again", context.Background(), false, codes.ResourceExhausted},
	}
	for _, s := range steps {
		if got := code(s.ctx, s.unary); got != s.want {
			t.Errorf("%s: %v, want %v", s.what, got, s.want)
		}
	}

	// The full method is the route: one count per method.
	lim = newLimiter(t, stores[0].make(t), clk,
		middleware.Rule{Name: "per-method", Key: keyfunc.Route(), Limits: []middleware.Limit{middleware.PerMinute(1).FixedWindow()}})
	c, _ = start(t, lim, grpclimit.Options{})
	for _, s := range []struct {
		unary bool
		want  codes.Code
	}{{true, codes.OK}, {false, codes.OK}, {true, codes.ResourceExhausted}, {false, codes.ResourceExhausted}} {
		if got := code(context.Background(), s.unary); got != s.want {
			t.Errorf("per method, unary %v: %v, want %v", s.unary, got, s.want)
		}
	}
	// The user an authentication interceptor chained before put in the
	// context.
	type userKey struct{}
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("authorization")) > 0 {
			ctx = context.WithValue(ctx, userKey{}, md.Get("authorization")[0])
		}
		return h(ctx, req)
	}
	lim = newLimiter(t, stores[0].make(t), clk,
		middleware.Rule{Name: "per-user", Key: keyfunc.User(func(ctx context.Context) (string, bool) {
			u, ok := ctx.Value(userKey{}).(string)
			return u, ok
		}), Limits: []middleware.Limit{middleware.PerMinute(1).FixedWindow()}})
	c, _ = start(t, lim, grpclimit.Options{}, auth)
	for _, s := range []struct {
		ctx  context.Context
		want codes.Code
	}{
		{withMD("authorization", "alice"), codes.OK},
		{withMD("authorization", "alice"), codes.ResourceExhausted},
		{withMD("authorization", "bob"), codes.OK},
		{context.Background(), codes.InvalidArgument},
	} {
		if got := code(s.ctx, true); got != s.want {
			t.Errorf("per user %v: %v, want %v", s.ctx, got, s.want)
		}
	}

	if r := grpclimit.NewRequest(context.Background(), "/grpc.testing.TestService/EmptyCall"); r.Route() != r.Path() || r.Method() != "POST" {
		t.Errorf("Request: route %q, path %q, method %q", r.Route(), r.Path(), r.Method())
	}
}

// TestStream counts a stream once when it opens, limits its messages with
// Options.Messages, and holds a concurrency slot until the stream ends.
func TestStream(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(t0)
			store := st.make(t)
			lim := newLimiter(t, store, clk,
				middleware.Rule{Name: "streams", Path: "/grpc.testing.TestService/FullDuplexCall", Key: keyfunc.RemoteIP(),
					Limits: []middleware.Limit{middleware.PerMinute(3).FixedWindow()}, Concurrency: 2})
			msgs := newLimiter(t, store, clk,
				middleware.Rule{Name: "messages", Methods: []string{grpclimit.MessageMethod}, Key: keyfunc.RemoteIP(),
					Limits: []middleware.Limit{middleware.PerMinute(8).FixedWindow()}})
			c, _ := start(t, lim, grpclimit.Options{Messages: msgs})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			open := func() (testpb.TestService_FullDuplexCallClient, error) {
				s, err := c.FullDuplexCall(ctx)
				if err != nil {
					return nil, err
				}
				// The interceptor runs when the first message arrives at
				// the latest; its answer comes with the first reply.
				if err := s.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
					return s, err
				}
				_, err = s.Recv()
				return s, err
			}
			s1, err := open()
			if err != nil {
				t.Fatalf("stream 1: %v", err)
			}
			if hdr, err := s1.Header(); err != nil || len(hdr.Get("ratelimit")) != 1 || hdr.Get("ratelimit")[0] != `"streams";r=2;t=20` {
				t.Errorf("stream 1: header %v, %v; want ratelimit \"streams\";r=2;t=20", hdr, err)
			}
			s2, err := open()
			if err != nil {
				t.Fatalf("stream 2: %v", err)
			}
			// Both slots held: a third stream is refused while they run.
			if _, err := open(); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("stream 3 with 2 open: %v, want ResourceExhausted", err)
			}
			// Messages: 2 so far, 8 a minute in all.
			for i := range 6 {
				if err := s1.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
					t.Fatal(err)
				}
				if _, err := s1.Recv(); err != nil {
					t.Fatalf("message %d: %v", i+3, err)
				}
			}
			if err := s1.Send(&testpb.StreamingOutputCallRequest{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s1.Recv(); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("message 9: %v, want ResourceExhausted", err)
			}
			// s1 ended with its error: its slot is free, and the stream
			// counted once however many messages it carried.
			_ = s2.CloseSend()
			if _, err := s2.Recv(); err != io.EOF {
				t.Fatalf("stream 2 end: %v", err)
			}
			clk.Add(time.Minute) // a new minute for the messages
			s4, err := open()
			if err != nil {
				t.Fatalf("stream 4 once the others ended: %v", err)
			}
			_ = s4.CloseSend()
			if _, err := s4.Recv(); err != io.EOF {
				t.Fatalf("stream 4 end: %v", err)
			}
		})
	}
}

// TestUnaryConcurrency holds a slot while a unary call runs and gives it
// back when the call returns.
func TestUnaryConcurrency(t *testing.T) {
	t.Parallel()
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			clk := testclock.New(t0)
			lim := newLimiter(t, st.make(t), clk,
				middleware.Rule{Name: "one-at-a-time", Key: keyfunc.RemoteIP(), Concurrency: 1})
			c, svc := start(t, lim, grpclimit.Options{})
			done := make(chan error, 1)
			go func() {
				_, err := c.UnaryCall(withMD("hold", "1"), &testpb.SimpleRequest{})
				done <- err
			}()
			<-svc.entered
			if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); status.Code(err) != codes.ResourceExhausted {
				t.Fatalf("second call while the first runs: %v, want ResourceExhausted", err)
			}
			svc.release <- struct{}{}
			if err := <-done; err != nil {
				t.Fatalf("held call: %v", err)
			}
			if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); err != nil {
				t.Fatalf("call after the first returned: %v", err)
			}
		})
	}
}

// TestSkipAndFailure checks Options.Skip, and that a call fails with
// Unavailable when the store fails under FailClosed.
func TestSkipAndFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	// Down only when it cannot be reached: a busy machine's slow answer
	// to the first call is not an outage.
	store := redisStore(t, srv.Client(t, nil), middleware.RedisConfig{Prefix: srv.Prefix(t), Timeout: time.Second, StallThreshold: -1})
	lim, err := middleware.NewRules([]middleware.Rule{{Name: "all", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(100).FixedWindow()}}},
		middleware.WithStore(store), middleware.WithFailurePolicy(middleware.FailClosed))
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	c, _ := start(t, lim, grpclimit.Options{Skip: func(_ context.Context, m string) bool {
		return m == "/grpc.testing.TestService/EmptyCall"
	}})
	if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); err != nil {
		t.Fatal(err)
	}
	srv.Kill()
	if _, err := c.UnaryCall(context.Background(), &testpb.SimpleRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("Redis down, fail closed: %v, want Unavailable", err)
	}
	if _, err := c.EmptyCall(context.Background(), &testpb.Empty{}); err != nil {
		t.Fatalf("skipped call with Redis down: %v", err)
	}
}
