package middleware

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/arena"
	"github.com/sluicehq/sluice/internal/fleetstore"
	"github.com/sluicehq/sluice/internal/headerwrite"
	"github.com/sluicehq/sluice/keyfunc"
)

// ErrStore wraps every error a Store returned, so error handlers can tell a
// store failure (errors.Is(err, ErrStore)) from a request without a key
// (errors.Is(err, keyfunc.ErrNoKey)).
var ErrStore = errors.New("sluice: store failed")

// Limiter decides whether requests are within their limits.
type Limiter struct {
	rules atomic.Pointer[ruleSet]
	// setMu orders the replacements of the rules in force that note
	// whether overrides exist (SetRules, setOverrides).
	setMu sync.Mutex
	cfg   config
	renew renewer
	// waiting counts the requests waiting for a leaky bucket's turn.
	waiting atomic.Int64
	// unmatched is the UnmatchedPolicy in force.
	unmatched atomic.Uint32
	// clients holds bans and per-client overrides (ban.go, override.go).
	clients clientState
	// ov holds the capacity signals (adaptive.go, elastic.go).
	ov        overload
	closeOnce sync.Once
	// syncs is the coordination layer of lease and write-back rules
	// (sync.go).
	syncs syncLayer
	// top tracks the top clients and the rules' rates (top.go).
	top topState
	// pauses holds the pauses of a Limiter made WithPauses (pause.go).
	pauses pauseState
}

// ruleSet is the rules in force, with what decide needs to know of them
// to skip, without a lock, a map lookup or an atomic operation, every
// capability that none of them uses. It is replaced whole (SetRules, and
// setOverrides when the first override comes or the last goes), never
// changed once in force.
type ruleSet struct {
	rules []*compiledRule
	// counting are the rules that count by outcome (Rule.Count).
	counting countingRules
	// banning is set when a limit has a Ban (or a rule a LimitsFunc, whose
	// limits may).
	banning bool
	// overload reports that a rule has AdaptiveConcurrency, and signals
	// that a rule may need the Limiter's capacity signal (an elastic
	// limit, or a LimitsFunc, whose limits may be elastic) or that the
	// signal is running: decide then asks whether it is.
	overload, signals bool
	// overrides reports that some client has an override (SetOverride).
	overrides bool
	// fleet is the coordination layer of lease and write-back rules, nil
	// if there has been none.
	fleet *fleetstore.Store
}

// New returns a Limiter that applies one limit to every request, counted per
// key. The key is required on purpose: every call site says what it limits
// by. It returns an error describing the first problem it finds in the
// configuration.
//
//	lim, err := middleware.New(middleware.PerMinute(100), keyfunc.RemoteIP())
func New(limit Limit, key keyfunc.Func, opts ...Option) (*Limiter, error) {
	return NewRules([]Rule{{Name: DefaultRuleName, Key: key, Limits: []Limit{limit}}}, opts...)
}

// DefaultRuleName is the name of the single rule New creates; it appears in
// the RateLimit and RateLimit-Policy fields.
const DefaultRuleName = "default"

// NewRules returns a Limiter that applies rules. See Rule.
func NewRules(rules []Rule, opts ...Option) (*Limiter, error) {
	l := &Limiter{cfg: defaultConfig()}
	for _, o := range opts {
		if o == nil {
			return nil, errors.New("sluice: nil Option")
		}
		o(&l.cfg)
	}
	if err := l.cfg.finish(); err != nil {
		return nil, err
	}
	l.unmatched.Store(uint32(l.cfg.unmatched))
	l.clients.overrides.OnEmpty = func(empty bool) { l.setOverrides(!empty) }
	l.startTop()
	l.bindPauses()
	if err := l.SetRules(rules); err != nil {
		l.stopTop()
		l.cfg.release()
		return nil, err
	}
	l.startClientSync()
	return l, nil
}

// SetRules replaces the limiter's rules atomically. Requests in flight finish
// under the rules they started with; counters of rules whose name and
// windows are unchanged carry on. If rules are invalid, SetRules returns an
// error and the previous rules stay in force.
func (l *Limiter) SetRules(rules []Rule) error {
	set, err := compileRules(rules)
	if err != nil {
		return err
	}
	if set.counting != nil {
		if err := l.checkRefunder(set); err != nil {
			return err
		}
	}
	if err := l.checkSettler(set); err != nil {
		return err
	}
	if l.cfg.slots == nil {
		for _, r := range set.rules {
			if r.Concurrency > 0 {
				return fmt.Errorf("sluice: rule %q: concurrency needs a store that can hold slots (a SlotStore, such as the memory and Redis stores); %T cannot", r.Name, l.cfg.store)
			}
		}
	}
	if err := l.bindSync(set); err != nil {
		return err
	}
	set.fleet = l.syncs.store.Load()
	if rs, ok := l.cfg.store.(*RegionStore); ok {
		rs.bindScopes(set)
	}
	l.bindOverload(set)
	set.signals = l.ov.measured() != nil
	for _, r := range set.rules {
		set.signals = set.signals || r.elastic || r.LimitsFunc != nil
	}
	l.bindTop(set)
	l.setMu.Lock()
	set.overrides = l.clients.overrides.Len() > 0
	l.rules.Store(set)
	l.setMu.Unlock()
	return nil
}

// setOverrides puts in force a copy of the rules in force that says
// whether some client has an override: the overrides table calls it when
// its first override comes or its last goes.
func (l *Limiter) setOverrides(some bool) {
	l.setMu.Lock()
	defer l.setMu.Unlock()
	cur := l.rules.Load()
	if cur == nil || cur.overrides == some {
		return
	}
	next := *cur
	next.overrides = some
	l.rules.Store(&next)
}

func compileRules(rules []Rule) (*ruleSet, error) {
	if len(rules) == 0 {
		return nil, errors.New("sluice: no rules")
	}
	set := &ruleSet{}
	seen := map[string]bool{}
	for _, r := range rules {
		c, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("sluice: %w", err)
		}
		if seen[r.Name] {
			return nil, fmt.Errorf("sluice: rule %q: name used twice", r.Name)
		}
		seen[r.Name] = true
		set.rules = append(set.rules, c)
	}
	set.counting = counting(set.rules)
	set.banning = banning(set.rules)
	return set, nil
}

// Close stops what the limiter started itself, for good: the renewal of
// the leases of concurrency slots, the publishing of spare capacity, and
// the stores it made (the default in-memory store and FailLocal's default
// fallback), whose goroutines have returned when Close returns. It removes
// the limiter's Observers from its stores. A store given to WithStore or
// WithFallbackStore is the caller's: Close does not close it (close it
// after the Limiter).
//
// The leases of the concurrency slots of requests still in flight, and of
// any taken after Close, are not renewed: on a shared store such slots
// are freed when their lease ends, if the requests do not end first. Close
// is idempotent and safe for concurrent use; later calls return nil.
func (l *Limiter) Close() error {
	var err error
	l.closeOnce.Do(func() {
		l.stopRenewer()
		l.stopFleet()
		l.stopClientSync()
		l.stopSync()
		l.stopTop()
		err = l.cfg.release()
	})
	return err
}

// Decide rate-limits one request: it finds the rules that apply, computes
// keys and costs, and asks the store, charging the request only if every
// limit admits it. Front ends call it once per request, then WriteHeaders,
// then deny or continue.
//
// Decide returns an error when the request cannot be decided: it wraps
// keyfunc.ErrNoKey when a key function found no key (and the limiter is set
// to reject such requests), or ErrStore when the store failed and the
// failure policy is FailClosed. Decide never panics on bad input.
func (l *Limiter) Decide(r keyfunc.Request) (Result, error) {
	var res Result
	err := l.decideTo(r, &res)
	return res, err
}

// WriteHeaders sets the rate-limit fields of res on s in the limiter's
// header style. It writes nothing when no limit applied.
func (l *Limiter) WriteHeaders(s headers.Setter, res *Result) {
	a := arena.Get()
	l.writeHeadersIn(a, s, res)
	arena.Put(a)
}

// writeHeadersIn is WriteHeaders carving the values from a.
func (l *Limiter) writeHeadersIn(a *arena.Arena, s headers.Setter, res *Result) {
	if res.blocked {
		return
	}
	if res.Concurrency {
		if !res.Allowed {
			s.Set(headers.RetryAfter, strconv.FormatInt(headers.Seconds(res.RetryAfter), 10))
		}
		return
	}
	if !res.Applied || l.cfg.style == headers.None && res.Allowed {
		return
	}
	v := headerwrite.Values{
		Name:       res.Policy,
		Limit:      res.Limit.Capacity(),
		Remaining:  res.Remaining,
		Reset:      res.ResetAfter,
		Next:       res.NextAfter,
		RetryAfter: res.RetryAfter,
		Policy:     res.policies,
		Others:     res.others,
	}
	if res.Allowed {
		v.RetryAfter = 0
	}
	headerwrite.WriteIn(a, s, headerwrite.Style(l.cfg.style), &v, res.prepared)
}

// Handler returns middleware that rate-limits next: requests within their
// limits reach next with rate-limit headers set; denied requests get the
// deny handler (429 by default); requests that cannot be decided get the
// error handler.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if l.cfg.skip != nil && l.cfg.skip(r) {
			next.ServeHTTP(w, r)
			return
		}
		var res Result
		// One scratch for the decision and the headers' values.
		s := scratchPool.Get().(*scratch)
		s.view = httpView{r, &s.arena}
		if err := l.decideIn(s, &s.view, &res); err != nil {
			s.release()
			l.cfg.onError(w, r, err)
			return
		}
		l.writeHeadersIn(&s.arena, w.Header(), &res)
		s.release()
		if !res.Allowed {
			denied := res // a copy, so that res itself stays on the stack
			l.cfg.deny.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), resultKey, &denied)))
			return
		}
		if res.settle != nil {
			l.serveCounted(w, r, next, &res)
			return
		}
		if res.hold != nil {
			// Given back when next returns, panics included.
			defer res.Done()
		}
		next.ServeHTTP(w, r)
	})
}

// HandlerFunc is Handler for a handler function.
func (l *Limiter) HandlerFunc(next http.HandlerFunc) http.Handler { return l.Handler(next) }

type contextKey struct{ name string }

// resultKey is a pointer so that it fits in an interface without allocating.
var resultKey = &contextKey{"result"}

// ResultFromContext returns the Result of a denied request; deny handlers
// given to WithDenyHandler read it to build their response.
func ResultFromContext(ctx context.Context) (Result, bool) {
	res, ok := ctx.Value(resultKey).(*Result)
	if !ok {
		return Result{}, false
	}
	return *res, true
}
