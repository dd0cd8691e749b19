package outbound

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/middleware"
)

// Defaults of Options.
const (
	// DefaultMaxWait bounds how long a request waits for its turn when
	// Options.MaxWait is 0 (on top of its context's deadline).
	DefaultMaxWait = 30 * time.Second
	// DefaultMaxPause caps a pause the upstream asks for when
	// Options.MaxPause is 0: a Retry-After of ten years pauses for 15
	// minutes, after which the requests in flight find out whether the
	// upstream still refuses.
	DefaultMaxPause = 15 * time.Minute
	// DefaultMaxWaiting bounds the requests waiting in one Transport at
	// once when Options.MaxWaiting is 0.
	DefaultMaxWaiting = 10_000
)

// Options configure a Transport. The zero value sends through
// http.DefaultTransport with the defaults.
type Options struct {
	// Base sends the requests the limiter admits; nil means
	// http.DefaultTransport.
	Base http.RoundTripper
	// MaxWait is the longest a request waits for its turn, on top of its
	// context's deadline: a request that would wait longer fails at once
	// with a WaitError (ErrTooLong), unsent. 0 means DefaultMaxWait; a
	// negative MaxWait never waits.
	MaxWait time.Duration
	// MaxPause caps the pause an upstream can ask for (Retry-After, or a
	// reset with no budget left); 0 means DefaultMaxPause.
	MaxPause time.Duration
	// MaxWaiting bounds how many requests wait for their turn at once in
	// the Transport; one more fails at once (ErrTooManyWaiting). 0 means
	// DefaultMaxWaiting.
	MaxWaiting int
	// IgnoreUpstream, when set, reads none of the upstream's rate-limit
	// fields: no pauses, no lowered budgets; the Limiter alone decides.
	IgnoreUpstream bool
}

// Transport is an http.RoundTripper that sends a request through its base
// transport only once its Limiter admits it, waiting for its turn when it
// must, and that adapts the Limiter to what the upstream answers (see the
// package documentation). It is safe for concurrent use.
type Transport struct {
	lim      *middleware.Limiter
	base     http.RoundTripper
	maxWait  time.Duration
	maxPause time.Duration
	ignore   bool
	queues   queues
	follow   follower
}

// New returns a Transport that rate-limits the requests it sends with lim.
// lim must be made with middleware.WithPauses unless o.IgnoreUpstream is
// set: pauses are how a 429 with Retry-After reaches every waiting
// request. It returns an error for a nil Limiter, a Limiter without
// pauses, or a bad option.
func New(lim *middleware.Limiter, o Options) (*Transport, error) {
	switch {
	case lim == nil:
		return nil, errors.New("outbound: nil Limiter")
	case !o.IgnoreUpstream && !lim.PausesEnabled():
		return nil, errors.New("outbound: the Limiter was made without middleware.WithPauses(), so a 429 with Retry-After could not pause the requests waiting: add the option (or set IgnoreUpstream)")
	case o.MaxPause < 0:
		return nil, fmt.Errorf("outbound: MaxPause %s is negative", o.MaxPause)
	case o.MaxWaiting < 0:
		return nil, fmt.Errorf("outbound: MaxWaiting %d is negative", o.MaxWaiting)
	}
	t := &Transport{lim: lim, base: o.Base, maxWait: o.MaxWait, maxPause: o.MaxPause, ignore: o.IgnoreUpstream}
	if t.base == nil {
		t.base = http.DefaultTransport
	}
	if t.maxWait == 0 {
		t.maxWait = DefaultMaxWait
	}
	if t.maxPause == 0 {
		t.maxPause = DefaultMaxPause
	}
	t.queues.max = o.MaxWaiting
	if t.queues.max == 0 {
		t.queues.max = DefaultMaxWaiting
	}
	return t, nil
}

// RoundTrip sends req once the Limiter admits it. A request the Limiter
// cannot admit in time is not sent: RoundTrip closes its body and returns
// a *WaitError; one it cannot decide (no key, or the store failed and the
// Limiter fails closed) likewise, with the Limiter's error. The response's
// body must be closed, as always: closing it ends the request for the
// Limiter (Result.Finish), giving back its concurrency slots.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	res, err := t.admit(req)
	if err != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, err
	}
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		res.Done()
		t.queues.slotFreed()
		return nil, err
	}
	if !t.ignore && res.Applied {
		t.heard(req, &res, resp)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil {
		t.finish(&res, resp.StatusCode)
		return resp, nil
	}
	resp.Body = &body{ReadCloser: resp.Body, t: t, res: res, status: resp.StatusCode}
	return resp, nil
}

// Waiting returns how many requests wait for their turn in the Transport
// now.
func (t *Transport) Waiting() int { return t.queues.len() }

// admit waits until the Limiter admits req, and returns its Result.
func (t *Transport) admit(req *http.Request) (middleware.Result, error) {
	start := time.Now()
	ctx := req.Context()
	if t.maxWait > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, start.Add(t.maxWait))
		defer cancel()
	}
	r := &Request{req: req, ctx: ctx}
	var p *place
	defer func() { t.queues.leave(p) }()
	waited := false
	for {
		res, err := t.lim.Decide(r)
		if err != nil {
			if errors.Is(err, middleware.ErrGaveUp) {
				// It left a leaky bucket's queue before its turn.
				return res, t.ended(&res, start, req)
			}
			return res, fmt.Errorf("outbound: %w", err)
		}
		if res.Allowed {
			if waited || res.Delay > 0 {
				t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundWaited, Rule: res.Rule, Duration: time.Since(start)})
			}
			return res, nil
		}
		if res.RetryAfter < 0 {
			return res, &WaitError{Rule: res.Rule, RetryAfter: -1, Waited: time.Since(start), Err: ErrTooCostly}
		}
		wake := time.Now().Add(res.RetryAfter)
		if dl, ok := ctx.Deadline(); t.maxWait < 0 || ok && wake.After(dl) {
			return res, t.tooLong(&res, start)
		}
		if id := (queueID{res.Rule, res.Key()}); p == nil || p.id != id {
			t.queues.leave(p)
			if p = t.queues.join(id); p == nil {
				return res, &WaitError{Rule: res.Rule, RetryAfter: res.RetryAfter, Waited: time.Since(start), Paused: res.Paused, Err: ErrTooManyWaiting}
			}
		}
		var freed <-chan struct{}
		if res.Concurrency {
			// A slot may come back before RetryAfter, when a request
			// of this Transport ends.
			freed = t.queues.whenFreed()
		}
		if err := waitTurn(ctx, p, wake, freed); err != nil {
			return res, t.ended(&res, start, req)
		}
		waited = true
	}
}

// waitTurn waits until p is first in its queue and wake has come (or
// freed is closed), or ctx is done.
func waitTurn(ctx context.Context, p *place, wake time.Time, freed <-chan struct{}) error {
	select {
	case <-p.turn:
	case <-ctx.Done():
		return ctx.Err()
	}
	d := time.Until(wake)
	if d <= 0 {
		return nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-freed:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// tooLong is the error of a request whose turn would come after its
// deadline, reported to the observers.
func (t *Transport) tooLong(res *middleware.Result, start time.Time) error {
	return t.report(&WaitError{Rule: res.Rule, RetryAfter: res.RetryAfter, Waited: time.Since(start), Paused: res.Paused, Err: ErrTooLong})
}

// ended is the error of a request whose wait ended before its turn,
// reported to the observers: the error of the caller's context, or
// ErrTooLong when only the maximum wait ran out.
func (t *Transport) ended(res *middleware.Result, start time.Time, req *http.Request) error {
	err := context.Cause(req.Context())
	if err == nil {
		err = ErrTooLong
	}
	return t.report(&WaitError{Rule: res.Rule, RetryAfter: res.RetryAfter, Waited: time.Since(start), Paused: res.Paused, Err: err})
}

func (t *Transport) report(e *WaitError) error {
	t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundGaveUp, Rule: e.Rule, Duration: e.Waited})
	return e
}

// finish ends a request for the Limiter (Result.Finish), and lets the
// requests that wait for a concurrency slot try again.
func (t *Transport) finish(res *middleware.Result, status int) {
	res.Finish(status)
	t.queues.slotFreed()
}

// body ends the request for the Limiter when the response's body is
// closed.
type body struct {
	io.ReadCloser
	t      *Transport
	once   sync.Once
	res    middleware.Result
	status int
}

func (b *body) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() { b.t.finish(&b.res, b.status) })
	return err
}
