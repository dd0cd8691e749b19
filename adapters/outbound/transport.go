package outbound

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
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
	// fields: no pauses, no lowered budgets, nothing learned; the Limiter
	// alone decides.
	IgnoreUpstream bool
	// NoLearning, when set, learns nothing of the upstream's limit (no
	// quota followed, no cut on a refusal: middleware.Limiter.Learn is
	// not called); the upstream's Retry-After and resets still pause.
	NoLearning bool
	// Margin is how many units a budget stays below a quota the upstream
	// announces: 0 measures it from the spread of the answers' durations
	// (see the package documentation), a negative Margin keeps none.
	Margin int
	// Usage, when set, reads from a response what its request used, for
	// the rules with usage limits (middleware.Rule.Usage: an LLM
	// provider's tokens): the units, and whether it found them. It is
	// called when the response's body is closed, once its trailers are
	// read, and settles the request (middleware.Result.Settle) unless the
	// request was settled already (Settle, or a rule's Usage.Header).
	Usage func(resp *http.Response) (units int, ok bool)
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
	noLearn  bool
	margin   int
	usage    func(*http.Response) (int, bool)
	queues   queues
	windows  windows
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
	t := &Transport{lim: lim, base: o.Base, maxWait: o.MaxWait, maxPause: o.MaxPause, ignore: o.IgnoreUpstream,
		noLearn: o.NoLearning, margin: o.Margin, usage: o.Usage}
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
// a *WaitError; one it cannot decide likewise, with the Limiter's error: a
// request without a key at once, and while the store fails (with a
// Limiter that fails closed, middleware.FailClosed) once the store has
// failed until the end of the request's wait, asked again every 5 to
// 100ms meanwhile. The response's
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
	admitted := time.Now()
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		res.Done()
		t.queues.slotFreed()
		return nil, err
	}
	if !t.ignore && res.Applied {
		t.heard(req, &res, resp, admitted)
	}
	if resp.StatusCode == http.StatusSwitchingProtocols || resp.Body == nil {
		t.finish(&res, resp, false)
		return resp, nil
	}
	b := &body{ReadCloser: resp.Body, t: t, res: res, resp: resp}
	resp.Body = b
	responses.Store(resp, b)
	return resp, nil
}

// CloseIdleConnections closes the idle connections of the base transport,
// if it has that method (http.Client.CloseIdleConnections calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
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
	if t.queues.len() > 0 {
		// Requests wait: if some wait for one of r's keys, r takes its
		// place behind them before it asks the Limiter.
		var err error
		if p, err = t.behind(r); err != nil {
			return middleware.Result{}, err
		}
		if p != nil {
			if err := waitTurn(ctx, p, time.Time{}, nil); err != nil {
				return middleware.Result{}, t.ended(p.id.rule, 0, false, start, req)
			}
			waited = true
		}
	}
	backoff := storeBackoff
	for {
		res, err := t.lim.Decide(r)
		if err != nil {
			if errors.Is(err, middleware.ErrGaveUp) {
				// It left a leaky bucket's queue before its turn.
				return res, t.ended(res.Rule, res.RetryAfter, res.Paused, start, req)
			}
			if errors.Is(err, middleware.ErrStore) && sleep(ctx, backoff) == nil {
				// The store failed and the Limiter fails closed: ask
				// again shortly, within the wait's bound.
				backoff = min(2*backoff, maxStoreBackoff)
				waited = true
				continue
			}
			return res, fmt.Errorf("outbound: %w", err)
		}
		if res.Outcome == middleware.OutcomeFailedOpen && ctx.Err() != nil {
			// The store failed because the wait's own deadline came
			// during the decision: not a decision to send on.
			return res, t.ended(res.Rule, 0, false, start, req)
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
			return res, t.ended(res.Rule, res.RetryAfter, res.Paused, start, req)
		}
		waited = true
	}
}

// The waits between two questions to a Limiter whose store failed (and
// that fails closed): doubling from storeBackoff up to maxStoreBackoff.
const (
	storeBackoff    = 5 * time.Millisecond
	maxStoreBackoff = 100 * time.Millisecond
)

// sleep waits d, or until ctx is done, or returns ctx's error at once
// when its deadline comes before d has passed.
func sleep(ctx context.Context, d time.Duration) error {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return context.DeadlineExceeded
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
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
	if freed == nil {
		return sleep(ctx, d)
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
func (t *Transport) ended(rule string, retryAfter time.Duration, paused bool, start time.Time, req *http.Request) error {
	err := context.Cause(req.Context())
	if err == nil {
		err = ErrTooLong
	}
	return t.report(&WaitError{Rule: rule, RetryAfter: retryAfter, Waited: time.Since(start), Paused: paused, Err: err})
}

// behind gives r the last place of the first queue in which requests of
// one of its keys wait, if any does; it returns ErrTooManyWaiting (a
// WaitError) when MaxWaiting requests wait already. A request whose keys
// cannot be computed goes on to the Limiter, which says why.
func (t *Transport) behind(r *Request) (*place, error) {
	keys, err := t.lim.Keys(r)
	if err != nil {
		return nil, nil
	}
	for _, k := range keys {
		id := queueID{k.Rule, k.Key}
		if !t.queues.has(id) {
			continue
		}
		if p := t.queues.join(id); p != nil {
			return p, nil
		}
		return nil, &WaitError{Rule: k.Rule, Err: ErrTooManyWaiting}
	}
	return nil, nil
}

func (t *Transport) report(e *WaitError) error {
	t.lim.ReportOutbound(middleware.OutboundEvent{Kind: middleware.OutboundGaveUp, Rule: e.Rule, Duration: e.Waited})
	return e
}

// finish ends a request for the Limiter: unless the caller settled its
// usage already (Settle), it settles it from Options.Usage, else from the
// header or trailer its rule's Usage.Header names; it ends the request
// (Result.Finish), and lets the requests that wait for a concurrency slot
// try again.
func (t *Transport) finish(res *middleware.Result, resp *http.Response, settled bool) {
	if !settled && t.usage != nil {
		if units, ok := t.usage(resp); ok {
			settled = res.Settle(units) != middleware.ErrNoUsage
		}
	}
	if !settled {
		_ = res.SettleFrom(readOnly{resp})
	}
	res.Finish(resp.StatusCode)
	t.queues.slotFreed()
}

// body ends the request for the Limiter when the response's body is
// closed.
type body struct {
	io.ReadCloser
	t       *Transport
	once    sync.Once
	res     middleware.Result
	resp    *http.Response
	settled atomic.Bool // by Settle
}

func (b *body) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(func() {
		responses.Delete(b.resp)
		b.t.finish(&b.res, b.resp, b.settled.Load())
	})
	return err
}

// responses maps the responses whose body is not closed yet to their
// bodies, for Settle. An http.Client may wrap a response's body (to
// enforce its Timeout), so the response itself is the key.
var responses sync.Map // *http.Response → *body

// Settle reports that the request of resp used units in all (the tokens
// of an LLM's answer, read from its body, say), for the rules with usage
// limits that applied to it (middleware.Rule.Usage): the difference with
// its estimate is settled when resp's body is closed, as
// middleware.Result.Settle does, and Options.Usage and Usage.Header are
// not read. resp must come from a Transport, its body not closed yet. It
// returns middleware.ErrNoUsage for any other response or a request with
// no usage limit, and the errors of middleware.Result.Settle.
func Settle(resp *http.Response, units int) error {
	v, ok := responses.Load(resp)
	if !ok {
		return middleware.ErrNoUsage
	}
	b := v.(*body)
	err := b.res.Settle(units)
	if err == nil {
		b.settled.Store(true)
	}
	return err
}

// readOnly shows a response's header and trailer to
// middleware.Result.SettleFrom without letting it remove the field the
// caller may want to read too: a trailer is asked for with
// http.TrailerPrefix.
type readOnly struct{ resp *http.Response }

func (h readOnly) Get(key string) string {
	if name, ok := strings.CutPrefix(key, http.TrailerPrefix); ok {
		return h.resp.Trailer.Get(name)
	}
	return h.resp.Header.Get(key)
}

func (readOnly) Del(string) {}
