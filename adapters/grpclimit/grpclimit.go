// Package grpclimit rate-limits Go gRPC servers with a sluice Limiter: the
// same rules, stores, keys and failure policies as the HTTP middleware.
//
//	lim, err := middleware.NewRules([]middleware.Rule{
//		{Name: "per-client", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerSecond(50)}},
//		{Name: "search", Path: "/shop.Catalog/Search", Key: keyfunc.Header("x-api-key"),
//			Limits: []middleware.Limit{middleware.PerMinute(100)}},
//	})
//	...
//	s := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(grpclimit.UnaryServerInterceptor(lim, grpclimit.Options{})),
//		grpc.ChainStreamInterceptor(grpclimit.StreamServerInterceptor(lim, grpclimit.Options{})),
//	)
//
// Rules see a call as a request (a keyfunc.Request, see Request) whose
// method is POST, whose path and route are the full method name
// ("/shop.Catalog/Search"), whose remote address is the peer's, and
// whose headers are the call's metadata: keyfunc.RemoteIP keys by the
// peer, keyfunc.ClientIP by the client behind trusted proxies (from the
// x-forwarded-for metadata, only when the peer is a trusted proxy),
// keyfunc.Header and keyfunc.APIKey by metadata, keyfunc.User by the
// context the server's authentication interceptor filled, and
// keyfunc.Route by the full method.
//
// A refused call fails with codes.ResourceExhausted, a google.rpc.RetryInfo
// detail saying when to retry, and the rate-limit fields (RateLimit,
// RateLimit-Policy, Retry-After, in the Limiter's header style, names in
// lower case) as response header metadata; an admitted call gets the
// fields too. A call that cannot be decided fails with InvalidArgument
// (no key for it) or Unavailable (the store failed and the policy is
// FailClosed, or no rule applies and the Limiter denies such calls).
//
// A stream counts as one request when it opens. Options.Messages, a
// Limiter of its own, also decides each message the client sends on it:
// the stream's RecvMsg returns ResourceExhausted for a message over its
// limit, which ends the stream when the handler returns the error, as
// handlers do with the errors of Recv.
// Concurrency slots (Rule.Concurrency) are held until the call returns or
// the stream ends.
//
// A call of a rule with usage limits (Rule.Usage, such as an LLM's tokens)
// is charged its estimate when admitted, and settles what it used when the
// handler returns or the stream ends: from the handler with
// middleware.Settle and the context it was given (the stream's Context),
// or in a trailer named as the rule's Usage.Header (in lower case), set
// with grpc.SetTrailer or the stream's SetTrailer, which the client never
// sees. A stream whose client went away settles what the handler reports
// all the same. A rule that counts by outcome (Rule.Count) sees the call's
// status as the HTTP status gRPC gateways give it (OK 200,
// InvalidArgument 400, Unauthenticated 401, PermissionDenied 403, NotFound
// 404, ResourceExhausted 429, Unimplemented 501, Unavailable 503,
// DeadlineExceeded 504, others 500).
//
// docs/grpc.md shows the interceptors beside sluice-rls (module
// adapters/envoyrls), and docs/usage.md the life of a usage limit.
package grpclimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// MessageMethod is the method of the requests Options.Messages decides,
// one per message a client sends on a stream.
const MessageMethod = "MESSAGE"

// Options configure the interceptors. The zero value limits every call
// with the Limiter alone.
type Options struct {
	// Skip, when it reports true, lets the call through unlimited: health
	// checks and reflection, say. fullMethod is as in
	// grpc.UnaryServerInfo.
	Skip func(ctx context.Context, fullMethod string) bool

	// Messages, when not nil, decides each message the client sends on a
	// stream, after the stream was admitted by the interceptor's Limiter:
	// its rules see the message as a Request of method MessageMethod
	// with the stream's path, peer and metadata. For a message it denies,
	// RecvMsg returns ResourceExhausted (with RetryInfo). It may share
	// the store of the interceptor's Limiter.
	Messages *middleware.Limiter
}

// UnaryServerInterceptor returns an interceptor that decides each unary
// call with lim before the handler runs.
func UnaryServerInterceptor(lim *middleware.Limiter, o Options) grpc.UnaryServerInterceptor {
	if lim == nil {
		panic("sluice: grpclimit: nil Limiter")
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if o.Skip != nil && o.Skip(ctx, info.FullMethod) {
			return handler(ctx, req)
		}
		res, err := admit(lim, NewRequest(ctx, info.FullMethod), func(md metadata.MD) { _ = grpc.SetHeader(ctx, md) })
		if err != nil {
			return nil, err
		}
		// Slots are given back, and usage settled, once the handler
		// returns; a panic counts as 500.
		code := 0
		defer func() { res.Finish(code) }()
		resp, err := handler(settling(ctx, &res), req)
		code = httpStatus(err)
		return resp, err
	}
}

// StreamServerInterceptor returns an interceptor that decides each stream
// with lim when it opens, and each message the client sends on it with
// o.Messages when set.
func StreamServerInterceptor(lim *middleware.Limiter, o Options) grpc.StreamServerInterceptor {
	if lim == nil {
		panic("sluice: grpclimit: nil Limiter")
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		if o.Skip != nil && o.Skip(ctx, info.FullMethod) {
			return handler(srv, ss)
		}
		res, err := admit(lim, NewRequest(ctx, info.FullMethod), func(md metadata.MD) { _ = ss.SetHeader(md) })
		if err != nil {
			return err
		}
		code := 0 // a panic, if the handler does not return
		defer func() { res.Finish(code) }()
		if sctx := settling(ctx, &res); sctx != ctx {
			ss = &usageStream{ServerStream: ss, ctx: sctx, res: res}
		}
		if o.Messages != nil {
			ss = &limitedStream{ServerStream: ss, lim: o.Messages, req: &Request{ctx: ctx, method: MessageMethod, full: info.FullMethod}}
		}
		err = handler(srv, ss)
		code = httpStatus(err)
		return err
	}
}

// settling returns the context a handler of a call with usage limits gets:
// one through which middleware.Settle reaches res, and whose transport
// stream takes the usage trailer (see trailerTap). It is ctx itself for a
// call with no usage to settle.
func settling(ctx context.Context, res *middleware.Result) context.Context {
	sctx := middleware.ContextWithResult(ctx, res)
	if sctx == ctx {
		return ctx
	}
	if ts := grpc.ServerTransportStreamFromContext(ctx); ts != nil {
		sctx = grpc.NewContextWithServerTransportStream(sctx, &trailerTap{ServerTransportStream: ts, res: *res})
	}
	return sctx
}

// trailerTap takes the usage trailer (Usage.Header) off the trailer
// metadata a handler sets with grpc.SetTrailer, and settles the call with
// it. res is a copy of the call's Result, sharing what it owes.
type trailerTap struct {
	grpc.ServerTransportStream
	res middleware.Result
}

func (t *trailerTap) SetTrailer(md metadata.MD) error {
	_ = t.res.SettleFrom(mdHeader(md))
	return t.ServerTransportStream.SetTrailer(md)
}

// usageStream is the stream a handler of a stream with usage limits gets:
// its Context reaches the usage through middleware.Settle, and SetTrailer
// takes the usage trailer.
type usageStream struct {
	grpc.ServerStream
	ctx context.Context
	res middleware.Result
}

func (s *usageStream) Context() context.Context { return s.ctx }

func (s *usageStream) SetTrailer(md metadata.MD) {
	_ = s.res.SettleFrom(mdHeader(md))
	s.ServerStream.SetTrailer(md)
}

// mdHeader reads and removes metadata as middleware.Result.SettleFrom
// needs, keys in lower case.
type mdHeader metadata.MD

func (m mdHeader) Get(key string) string {
	if vs := metadata.MD(m).Get(key); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

func (m mdHeader) Del(key string) { metadata.MD(m).Delete(key) }

// httpStatus is the HTTP status of a call that ended with err, as gRPC
// gateways map codes, for rules that count by outcome.
func httpStatus(err error) int {
	switch status.Code(err) {
	case codes.OK:
		return http.StatusOK
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Canceled:
		return 499
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// admit decides r with lim and sends the rate-limit fields as header
// metadata with setHeader; it returns the status error of a call that may
// not proceed.
func admit(lim *middleware.Limiter, r *Request, setHeader func(metadata.MD)) (middleware.Result, error) {
	res, err := lim.Decide(r)
	if err != nil {
		return res, decideError(err)
	}
	md := metadata.MD{}
	lim.WriteHeaders(mdSetter(md), &res)
	if len(md) > 0 {
		setHeader(md)
	}
	if res.Allowed {
		return res, nil
	}
	return res, denied(&res, md)
}

// decideError is the status of a call that could not be decided.
func decideError(err error) error {
	if errors.Is(err, keyfunc.ErrNoKey) {
		return status.Error(codes.InvalidArgument, "rate limit: no key for the call")
	}
	return status.Error(codes.Unavailable, "rate limit: the limiter could not decide the call")
}

// denied is the status of a call the Limiter refused.
func denied(res *middleware.Result, md metadata.MD) error {
	if res.Outcome == middleware.OutcomeUnmatched {
		return status.Error(codes.Unavailable, "rate limit: no rule applies to the call")
	}
	code := codes.ResourceExhausted
	if middleware.DenyStatus(res) == http.StatusServiceUnavailable {
		code = codes.Unavailable
	}
	st := status.New(code, "rate limit exceeded: "+res.Policy)
	if res.RetryAfter > 0 {
		// Whole seconds, as Retry-After says: a client that retries at
		// once after a sub-second delay would be turned away again.
		d := time.Duration((res.RetryAfter + time.Second - 1) / time.Second * time.Second)
		if ds, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(d)}); err == nil {
			st = ds
		}
	}
	return st.Err()
}

// mdSetter sets metadata from the header writer's Set.
type mdSetter metadata.MD

func (m mdSetter) Set(key, value string) { metadata.MD(m).Set(key, value) }

// limitedStream decides each message the client sends.
type limitedStream struct {
	grpc.ServerStream
	lim *middleware.Limiter
	req *Request
}

func (s *limitedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	res, err := s.lim.Decide(s.req)
	if err != nil {
		return decideError(err)
	}
	res.Done() // a message holds no slot beyond its decision
	if !res.Allowed {
		return denied(&res, nil)
	}
	return nil
}

// Request is the keyfunc.Request of a gRPC call, as the interceptors
// present it to a Limiter's rules and key functions.
type Request struct {
	ctx    context.Context
	method string
	full   string
	md     metadata.MD
	mdRead bool
}

// NewRequest returns the Request of the call whose context is ctx and
// whose full method name is fullMethod ("/package.Service/Method").
func NewRequest(ctx context.Context, fullMethod string) *Request {
	return &Request{ctx: ctx, method: http.MethodPost, full: fullMethod}
}

// Context returns the call's context.
func (r *Request) Context() context.Context { return r.ctx }

// Method returns "POST" for a call, and MessageMethod for a message of a
// stream.
func (r *Request) Method() string { return r.method }

// Path returns the full method name.
func (r *Request) Path() string { return r.full }

// Route returns the full method name.
func (r *Request) Route() string { return r.full }

// RemoteAddr returns the peer's address, "" when unknown.
func (r *Request) RemoteAddr() string {
	if p, ok := peer.FromContext(r.ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return ""
}

func (r *Request) metadata() metadata.MD {
	if !r.mdRead {
		r.md, _ = metadata.FromIncomingContext(r.ctx)
		r.mdRead = true
	}
	return r.md
}

// Header returns the first value of the metadata key name (in any case).
func (r *Request) Header(name string) string {
	if vs := r.Values(name); len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// Values returns the values of the metadata key name (in any case).
func (r *Request) Values(name string) []string {
	md := r.metadata()
	if md == nil {
		return nil
	}
	if vs, ok := md[name]; ok {
		return vs
	}
	return md[strings.ToLower(name)]
}
