// Package window holds the vocabulary shared by every store (Limit,
// Charge, Decision, Slot, State) and the pure arithmetic, with an explicit
// now, of the five algorithms a limit may count with: the sliding-window
// counter (window.go), the fixed window (fixed.go), the sliding log
// (log.go), the token bucket (token.go) and the leaky bucket used as a
// queue (leaky.go). The in-memory store runs this arithmetic itself; the
// Redis store's Lua scripts are its twins, checked against it on shared
// tables of instants. Package middleware declares the public Limit,
// Charge, Decision and Slot with the same layout and converts at the seam.
// docs/algorithms.md describes the algorithms for users.
//
// Besides deciding (Take, Fits, Describe), it holds what a store does to
// a counter after a decision: Settle and SettleAll charge a cost known
// only once the request has run, whether it fits or not, which may leave
// a debt (docs/usage.md); Refund takes an admitted charge back (a rule
// that counts by outcome, docs/logins.md, or a usage below its estimate);
// GiveBack frees the place of a queued request that left before its turn;
// ExpiryOf says when a counter stops mattering. A Slot is one request's
// hold on a concurrency limit (docs/algorithms.md).
//
// The rest of this comment describes the sliding-window counter, the
// default; each other algorithm is described at the top of its file.
//
// # Windows anchored per counter
//
// A counter's windows start at the request that created it: its first
// window is [t0, t0+W), the next [t0+W, t0+2W), and so on. A counter keeps
// the count of its current window and of the one before it. When both are
// zero again (the client stayed away for a whole window, or the counter is
// new) the next request starts afresh, with windows anchored at that
// request. A client therefore never finds itself part-way into a window it
// has not used, which is what lets a client that starts hammering a cold
// counter get limit + 1 requests at most in any interval of one window,
// instead of up to twice the limit with windows aligned on the Unix epoch.
//
// # Ticks
//
// Time inside a window is counted in ticks of R milliseconds, where R is
// the smallest whole number of milliseconds that divides the window and
// keeps every intermediate value below 2^53 (see Limit.Tick): 1 ms for
// every limit with 3 * (requests + 1) * window-in-ms <= 2^53, such as
// 1,000,000 per 30 days, and coarser only beyond (1e9 per hour has ticks
// of 2 ms, 1e12 per 366 days ticks of about three hours). A window holds
// W = window / R ticks. All arithmetic is on exact integers, with no
// floating point, so that the Redis Lua script (whose numbers are doubles)
// and this package give identical answers.
//
// # The estimate
//
// At an instant that lies in tick e of the current window (e = 0 .. W-1),
// the number of requests counted against the sliding window is estimated
// as
//
//	estimate = prev * (W - 1 - e) / W + curr
//
// A request of cost c is allowed when estimate + c <= limit; only an
// allowed request is counted. Weighting the previous window by the ticks
// still to come after the current one (W - 1 - e rather than W - e) means
// that the tick a request falls in counts as passed: a client that keeps
// pushing at a steady rate gets the whole limit in every window, the last
// unit in the window's last tick, rather than one less.
//
// # Counts above the limit
//
// A count may exceed the limit: a settle (Settle) charges the usage of an
// admitted request whether it fits or not, a plan may have been lowered
// since the counter was filled, and the coordination modes of package
// fleet admit within a stated bound. Such counts weigh in full: a current
// count above the limit denies every request until its window ends, and a
// previous one weighs (W - 1 - e) / W of its whole value, so a client that
// owes D units past its limit at the end of a window gets its next request
// of cost c in the next window at the first tick where
// (limit + D) * (W - 1 - e) / W + c <= limit: a debt is waited off within
// the next window, the horizon of the estimate, and later the whole limit
// is there again. The arithmetic stays exact whatever the counts (below
// MaxCount): a previous count above limit + 1 is compared by division,
// prev <= (limit - curr - c) * W / (W - 1 - e), rather than by its
// product, and descriptions of such states use 128-bit products.
package window

import (
	"fmt"
	"hash/fnv"
	"math/bits"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

const (
	// MaxRequests is the largest Requests a Limit may have: 2^50, about
	// 1.1e15.
	MaxRequests = 1 << 50
	// MaxWindow is the longest Window a Limit may have: 3660 days.
	MaxWindow = 3660 * 24 * time.Hour
	// DefaultMaxLog is the largest Requests of a SlidingLog limit whose
	// MaxLog is zero: a log of 1000 entries costs about 12 KB per client
	// in Redis and 16 KB in memory at the worst.
	DefaultMaxLog = 1000
	// MaxLogRequests is the largest MaxLog, and so the largest Requests of
	// any SlidingLog limit.
	MaxLogRequests = 100_000
	// exact is the bound every intermediate value of the arithmetic stays
	// within: 2^53, the range of integers a double holds exactly.
	exact = 1 << 53
)

// Limit is a number of requests allowed per window, and the algorithm
// that counts them.
type Limit struct {
	// Requests is how many requests (cost units) the window admits,
	// 1 to MaxRequests. For TokenBucket it is the refill: Requests tokens
	// per Window.
	Requests int
	// Window is the length of the window: a whole number of milliseconds,
	// 1 ms to MaxWindow. A FixedWindow limit with a Period may leave it
	// zero (or set it to the period's nominal length, see Span).
	Window time.Duration
	// Algorithm is how requests are counted; the zero value is
	// SlidingWindow.
	Algorithm Algorithm
	// Burst is a TokenBucket's capacity: how many requests it admits at
	// once after a quiet spell; and a LeakyBucket's queue: how many
	// requests may wait for their turn. Zero means Requests. Other
	// algorithms must leave it zero.
	Burst int
	// Period, for a FixedWindow limit, replaces Window with a calendar
	// period (a day, a week starting on Monday, or a month) in Location,
	// which is not a fixed duration: months have 28 to 31 days, and days
	// 23 to 25 hours across daylight-saving changes. Other algorithms must
	// leave it zero.
	Period Period
	// Location is the time zone of Period; nil means UTC. It must be nil
	// without a Period.
	Location *time.Location
	// MaxLog raises, for a SlidingLog limit, the largest Requests allowed
	// above DefaultMaxLog, up to MaxLogRequests: a sliding log keeps one
	// entry per request, so its memory per client grows with Requests (see
	// the package doc). Zero means DefaultMaxLog. Other algorithms must
	// leave it zero.
	MaxLog int
	// MaxDelay, for a LeakyBucket limit, is the longest a request may wait
	// for its turn; one that would wait longer is denied. Zero means no
	// bound beyond the queue's length. It must be a whole number of
	// milliseconds; other algorithms must leave it zero.
	MaxDelay time.Duration
	// Ceiling, when above Requests, makes the limit elastic (see package
	// middleware); the stores ignore it.
	Ceiling int
	// Ban, when > 0, is how long a client this limit refuses is refused
	// under its rule afterwards. Stores do not read it: the middleware
	// keeps bans. It must be a whole number of milliseconds, at most
	// MaxWindow.
	Ban time.Duration
}

// String returns the limit as "100/1m0s", followed by its algorithm when
// it is not the sliding window ("10/1s token_bucket burst 20",
// "1000/calendar_day Europe/Paris fixed_window").
func (l Limit) String() string {
	s := fmt.Sprintf("%d/%s", l.Requests, l.Window)
	if l.Period != NoPeriod {
		s = fmt.Sprintf("%d/%s %s", l.Requests, l.Period, l.loc())
	}
	if l.Algorithm != SlidingWindow {
		s += " " + l.Algorithm.String()
	}
	if l.Burst != 0 {
		s += fmt.Sprintf(" burst %d", l.Burst)
	}
	return s
}

// Validate reports whether the limit can be used, with an error that says
// what is wrong when it cannot: a *LimitError, which names the field at
// fault.
func (l Limit) Validate() error {
	bad := func(field, format string, args ...any) error {
		return &LimitError{Limit: l, Field: field, Msg: fmt.Sprintf(format, args...)}
	}
	switch {
	case l.Algorithm >= algorithms:
		return bad("algorithm", "unknown algorithm %d", l.Algorithm)
	case l.Requests <= 0:
		return bad("requests", "requests must be > 0")
	case l.Requests > MaxRequests:
		return bad("requests", "requests %d must be at most 2^50 (%d)", l.Requests, MaxRequests)
	case l.Period != NoPeriod:
		if l.Algorithm != FixedWindow {
			return bad("algorithm", "%s cannot count a calendar period (%s): calendar periods need fixed_window", l.Algorithm, l.Period)
		}
		if l.Period >= periods {
			return bad("window", "unknown period %d", l.Period)
		}
		if l.Window != 0 && l.Window != l.Period.nominal() {
			return bad("window", "a calendar period has no window (or its nominal %s)", l.Period.nominal())
		}
	case l.Window <= 0:
		return bad("window", "window must be > 0")
	case l.Window%time.Millisecond != 0:
		return bad("window", "window must be a whole number of milliseconds")
	case l.Window > MaxWindow:
		return bad("window", "window %s must be at most 3660d", FormatWindow(l.Window))
	}
	switch {
	case l.Location != nil && l.Period == NoPeriod:
		return bad("time_zone", "a time zone applies only to a calendar period (calendar_day, calendar_week or calendar_month), not to a window of %s", FormatWindow(l.Window))
	case l.Burst != 0 && l.Algorithm != TokenBucket && l.Algorithm != LeakyBucket:
		return bad("burst", "burst applies only to the token_bucket and leaky_bucket algorithms, not to %s", l.Algorithm)
	case l.MaxDelay != 0 && l.Algorithm != LeakyBucket:
		return bad("max_delay", "max_delay applies only to the leaky_bucket algorithm, not to %s", l.Algorithm)
	case l.MaxDelay < 0 || l.MaxDelay%time.Millisecond != 0 || l.MaxDelay > MaxWindow:
		return bad("max_delay", "max_delay %s must be a whole number of milliseconds between 0 and %s", l.MaxDelay, MaxWindow)
	case l.Algorithm == LeakyBucket && l.Burst >= MaxRequests:
		return bad("burst", "a leaky bucket's queue must be below 2^50 (%d)", MaxRequests)
	case l.Burst < 0 || l.Burst > MaxRequests:
		return bad("burst", "burst %d must be between 1 and 2^50 (%d), or 0 for requests", l.Burst, MaxRequests)
	case l.Ban < 0 || l.Ban%time.Millisecond != 0 || l.Ban > MaxWindow:
		return bad("ban", "ban %s must be a whole number of milliseconds between 0 and %s", l.Ban, MaxWindow)
	case l.MaxLog != 0 && l.Algorithm != SlidingLog:
		return bad("max_log", "max_log applies only to the sliding_log algorithm, not to %s", l.Algorithm)
	case l.MaxLog < 0 || l.MaxLog > MaxLogRequests:
		return bad("max_log", "max_log %d must be between 1 and %d, or 0 for %d", l.MaxLog, MaxLogRequests, DefaultMaxLog)
	case l.Algorithm == SlidingLog && l.Requests > max(l.MaxLog, DefaultMaxLog):
		return bad("requests", "a sliding log keeps one entry per request, and %d requests is above its maximum of %d; raise max_log (up to %d) to accept the memory it costs, or use another algorithm", l.Requests, max(l.MaxLog, DefaultMaxLog), MaxLogRequests)
	}
	return nil
}

// WindowName names the limit's window as a rules file spells it, and as
// the rate-limit headers name the policies of a rule with several limits
// ("api-1m"): the calendar period ("calendar_day") or FormatWindow of
// Window ("1s", "1m", "1h30m", "1d", "2w").
func (l Limit) WindowName() string {
	if l.Period != NoPeriod {
		return l.Period.String()
	}
	return FormatWindow(l.Window)
}

// FormatWindow formats a window as a rules file spells it: whole weeks as
// "2w", whole days as "3d", anything else as a Go duration without its
// zero units ("1m" rather than "1m0s", "1h30m", "90ms").
func FormatWindow(d time.Duration) string {
	const day, week = 24 * time.Hour, 7 * 24 * time.Hour
	switch {
	case d > 0 && d%week == 0:
		return strconv.FormatInt(int64(d/week), 10) + "w"
	case d > 0 && d%day == 0:
		return strconv.FormatInt(int64(d/day), 10) + "d"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// LimitError is what Validate finds wrong with a limit: Msg says what,
// and Field names the field at fault as a rules file spells it
// ("requests", "window", "algorithm", "burst", "time_zone", "max_log",
// "max_delay"), so that a file's loader can point at its line.
type LimitError struct {
	Limit Limit
	Field string
	Msg   string
}

// Error returns "limit <the limit>: <Msg>".
func (e *LimitError) Error() string { return "limit " + e.Limit.String() + ": " + e.Msg }

// Capacity is the most a limit admits at once: Burst for a TokenBucket
// (Requests when Burst is zero), one plus the queue for a LeakyBucket (the
// request served now and those waiting), Requests for every other
// algorithm. It is the quota that headers advertise.
func (l Limit) Capacity() int {
	switch {
	case l.Algorithm == TokenBucket && l.Burst > 0:
		return l.Burst
	case l.Algorithm == LeakyBucket:
		return l.queue() + 1
	}
	return l.Requests
}

// queue is a LeakyBucket's queue length.
func (l Limit) queue() int {
	if l.Burst > 0 {
		return l.Burst
	}
	return l.Requests
}

// Span is the limit's window as headers advertise it: Window; the nominal
// length of a calendar period (1 day, 7 days, 30 days); and, for a token
// or leaky bucket, the time its capacity takes to refill (drain) from
// empty (full): Capacity * Window / Requests, rounded up to the
// millisecond.
func (l Limit) Span() time.Duration {
	switch {
	case l.Period != NoPeriod:
		return l.Period.nominal()
	case (l.Algorithm == TokenBucket || l.Algorithm == LeakyBucket) && l.Capacity() != l.Requests:
		// burst * w may exceed 64 bits for extreme limits, so the quotient
		// is taken on 128; a span above MaxWindow is capped.
		hi, lo := bits.Mul64(uint64(l.Capacity()), uint64(l.Window.Milliseconds()))
		n := uint64(l.Requests)
		if hi >= n {
			return MaxWindow // the quotient does not fit 64 bits
		}
		q, r := bits.Div64(hi, lo, n)
		if r != 0 {
			q++
		}
		if q > uint64(MaxWindow.Milliseconds()) {
			return MaxWindow
		}
		return time.Duration(q) * time.Millisecond
	}
	return l.Window
}

// Series identifies, within one Name and Key, the counter a limit uses:
// limits with the same Series share a counter, whatever their Requests
// (which plans may change from call to call). For a sliding window it is
// the window in milliseconds; the algorithm, the period and its time zone
// are mixed into it for the others, so that changing a limit's algorithm
// starts its counter afresh.
func (l Limit) Series() uint64 {
	if l.Algorithm == SlidingWindow {
		return uint64(l.Window.Milliseconds())
	}
	s := uint64(l.Window.Milliseconds()) | uint64(l.Algorithm)<<60
	if l.Period != NoPeriod {
		h := fnv.New64a()
		h.Write([]byte(l.loc().String()))
		s = uint64(l.Algorithm)<<60 | uint64(l.Period)<<56 | h.Sum64()&(1<<56-1)
	}
	return s
}

func (l Limit) loc() *time.Location {
	if l.Location == nil {
		return time.UTC
	}
	return l.Location
}

// Tick returns the length of the limit's ticks in milliseconds: the
// smallest divisor R of the window (in ms) such that
// 3 * (N + 1) * (window / R) <= 2^53, where N is the larger of Requests
// and Burst. It is 1 for every limit whose 3 * (N + 1) * window-in-ms is
// at most 2^53. l must be valid, with a Window (it is not used for
// calendar periods).
func (l Limit) Tick() int64 {
	w, n := l.Window.Milliseconds(), int64(max(l.Requests, l.Burst))+1
	if l.Algorithm == LeakyBucket {
		n = int64(max(l.Requests, l.queue()+1)) + 1
	}
	if n < 1<<20 && w < 1<<31 {
		return 1 // 3 * n * w < 3 * 2^51: no division needed to know
	}
	if hi, lo := bits.Mul64(uint64(3*n), uint64(w)); hi == 0 && lo <= exact {
		return 1 // w <= exact / (3 * n), without the division
	}
	maxTicks := exact / (3 * n) // W may be at most this
	key := [2]int64{n, w}
	if r, ok := ticks.Load(key); ok {
		return r.(int64)
	}
	r := smallestDivisorAtLeast(w, (w+maxTicks-1)/maxTicks)
	if tickCount.Add(1) <= maxCachedTicks {
		ticks.Store(key, r)
	}
	return r
}

// Ticks of limits that need more than 1 ms, cached: finding one costs a
// factorisation of the window. The cache holds at most maxCachedTicks
// entries; limits come from configuration, so it rarely holds more than a
// handful.
var (
	ticks     sync.Map
	tickCount atomic.Int64
)

const maxCachedTicks = 4096

// smallestDivisorAtLeast returns the smallest divisor of w that is >= min.
// w is at most MaxWindow in ms (about 3.2e11), so trial division up to its
// square root takes well under a millisecond.
func smallestDivisorAtLeast(w, min int64) int64 {
	best := w
	for d := int64(1); d*d <= w; d++ {
		if w%d != 0 {
			continue
		}
		if d >= min && d < best {
			best = d
		}
		if q := w / d; q >= min && q < best {
			best = q
		}
	}
	return best
}

// Charge asks a store to count Cost against Limit for the counter named by
// Name and Key.
type Charge struct {
	// Key identifies who is counted, for example "ip:192.0.2.1". It is
	// derived from the request and may be hostile; stores hash or escape it.
	// Charges with the same Key are kept close together (on Redis Cluster,
	// in one hash slot). Key may be backed by a buffer that is reused after
	// Take returns: a store that keeps it must copy it.
	Key string
	// Name namespaces the counters of different rules that count the same
	// Key. It comes from configuration, not from the request.
	Name string
	// Limit is the limit to apply. The counter is identified by Name, Key
	// and Limit.Window; Limit.Requests may change from call to call (plans)
	// without resetting it.
	Limit Limit
	// Cost is how many units the request consumes; 0 only reads.
	Cost int
	// exact asks a store that decides some rules' counters in memory
	// (package fleetstore) to decide this one in the shared store, as
	// exact mode does (see Exact).
	exact bool
}

// Exact reports whether c is to be decided in the shared store whatever
// its rule's fleet mode: its limit was lowered to what an upstream
// announces, which a slice spent late or an unsynced count would put an
// upstream that counts exactly over.
func (c *Charge) Exact() bool { return c.exact }

// Decision is the outcome of one Charge.
type Decision struct {
	// Allowed reports whether this limit, on its own, admits the request.
	Allowed bool
	// Remaining is how many more requests of cost 1 this limit would admit
	// right now, after this request was counted (if it was).
	Remaining int
	// ResetAfter is how long until the whole limit is available again if
	// no further request arrives.
	ResetAfter time.Duration
	// RetryAfter is how long until a request of the same cost would be
	// admitted by this limit, if no further request arrives. It is zero
	// when Allowed is true, and -1ns when the cost exceeds the limit.
	RetryAfter time.Duration
	// NextAfter is how long until more quota is made available, if no
	// further request arrives: on an allowed request, until Remaining next
	// grows (zero when the limit is whole); on a denied one, until a
	// request of cost 1 would be admitted (zero if one would be now). It
	// is the t parameter of the RateLimit field.
	NextAfter time.Duration
	// Delay is, for an allowed request of a LeakyBucket, how long it must
	// wait for its turn before it proceeds; zero otherwise.
	Delay time.Duration
	// Debt is how many units the counter is past its limit, rounded up:
	// what settles (Settle) charged beyond it, or what a lowered plan left
	// above it. A limit in debt has Remaining 0 and admits no request
	// until the debt is waited off.
	Debt int
}

// State is a counter. What its fields hold depends on the algorithm:
//
//   - SlidingWindow: Start is the start of the current window in Unix
//     milliseconds, Prev and Curr the counts of the previous and current
//     windows.
//   - FixedWindow: Start is the start of the window in Unix milliseconds,
//     Curr its count; Prev is 0.
//   - TokenBucket: Start is the instant of the level in Unix
//     milliseconds (a multiple of Prev), Prev the tick R in milliseconds
//     the level is counted in (Limit.Tick), and Curr the level: the tokens
//     spent and not yet refilled, in units of 1/(Window/R) token. An empty
//     level (0) is a full bucket.
//   - SlidingLog: Log lists the admitted requests, oldest first, and Curr
//     is the sum of their costs; Start and Prev are 0.
//
// The zero State is a counter that nothing was ever charged to.
type State struct {
	Start int64
	Prev  int64
	Curr  int64
	Log   []Entry
}

// Entry is one instant of a sliding log: N units admitted at At (Unix
// milliseconds).
type Entry struct {
	At int64
	N  int64
}

// Roll moves the SlidingWindow state s to the window that contains now (Unix milliseconds) for
// windows of w milliseconds anchored at s.Start, and returns it with the
// instant to decide at. A counter that is empty, or becomes empty by
// rolling, starts afresh at now. An instant earlier than s's window (a
// clock that went backwards) is decided at the start of s's window, so a
// counter never loses counts to clock skew.
func Roll(s State, now, w int64) (State, int64) {
	if s.Prev == 0 && s.Curr == 0 {
		return State{Start: now}, now
	}
	if now < s.Start {
		return s, s.Start
	}
	switch d := now - s.Start; { // (now - s.Start) / w, without dividing
	case d < w:
		return s, now
	case d < 2*w:
		s = State{Start: s.Start + w, Prev: s.Curr}
	default:
		s = State{}
	}
	if s.Prev == 0 && s.Curr == 0 {
		return State{Start: now}, now
	}
	return s, now
}

// params are a limit in the units of the arithmetic.
type params struct {
	limit int64 // requests
	r     int64 // tick, in ms
	w     int64 // window, in ticks
}

func paramsOf(l *Limit) params {
	r := l.Tick()
	return params{limit: int64(l.Requests), r: r, w: l.Window.Milliseconds() / r}
}

// pos is where an instant lies in a rolled state: e whole ticks and sub ms
// into the current window, and the counts.
type pos struct {
	e, sub, prev, curr int64
}

func (p params) pos(s State, at int64) pos {
	x := pos{e: at - s.Start, prev: s.Prev, curr: s.Curr}
	if p.r != 1 {
		x.e, x.sub = x.e/p.r, x.e%p.r
	}
	return x
}

// fits reports whether cost c fits at x: whether
// prev*(w-1-e) + (curr+c)*w <= limit*w, computed exactly whatever the
// counts (see the package doc).
func (p params) fits(x pos, c int64) bool {
	if c > p.limit || x.curr > p.limit-c {
		return false // also keeps (limit-curr-c)*w exact
	}
	k, a := p.w-1-x.e, (p.limit-x.curr-c)*p.w
	if x.prev <= p.limit+1 {
		return x.prev*k <= a // below 3 * (limit+1) * w: exact
	}
	return k == 0 || x.prev <= a/k
}

// small reports whether the counts at x are at most limit + 1, which
// keeps every product of describe below 3 * (limit + 1) * w.
func (p *params) small(x *pos) bool { return x.prev <= p.limit+1 && x.curr <= p.limit+1 }

func (p params) describe(x pos, c int64, allowed bool) Decision {
	var d Decision
	p.describeTo(&d, &x, c, allowed)
	return d
}

// describeTo is describe writing to *d, every field of which it sets.
func (p *params) describeTo(d *Decision, x *pos, c int64, allowed bool) {
	if !p.small(x) {
		p.describeLarge(d, x, c, allowed)
		return
	}
	free := p.limit*p.w - (x.prev*(p.w-1-x.e) + x.curr*p.w)
	var rem, reset, next, retry time.Duration
	var debt int
	if free > 0 {
		rem = time.Duration(free / p.w)
	} else if free < 0 {
		debt = int((-free + p.w - 1) / p.w)
	}
	switch {
	case x.curr > 0:
		reset = p.ms(*x, 2*p.w-1-x.e)
	case x.prev > 0:
		reset = p.ms(*x, p.w-1-x.e)
	}
	if allowed {
		next = p.ms(*x, p.grow(*x, int64(rem), free))
	} else {
		retry = p.ms(*x, p.retry(*x, c))
		next = p.ms(*x, p.retry(*x, 1))
	}
	*d = Decision{Allowed: allowed, Remaining: int(rem), ResetAfter: reset, RetryAfter: retry, NextAfter: next, Debt: debt}
}

// ms converts a delay of d ticks from x to milliseconds: to the start of
// the tick d ticks on. -1 (never) gives -1ns.
func (p params) ms(x pos, d int64) time.Duration {
	switch {
	case d < 0:
		return -1
	case d == 0:
		return 0
	}
	return time.Duration(d*p.r-x.sub) * time.Millisecond
}

// retry is the smallest delay in ticks after which cost c fits, assuming
// no other request arrives; -1 if it never does.
func (p params) retry(x pos, c int64) int64 {
	if c > p.limit {
		return -1
	}
	// Within the current window, d ticks on:
	// prev*(w-1-e-d) + (curr+c)*w <= limit*w.
	if a := p.limit - x.curr - c; a >= 0 {
		if x.prev == 0 {
			return 0
		}
		return max(0, p.w-1-x.e-a*p.w/x.prev)
	}
	// In the next window, y ticks in (curr > limit-c >= 0):
	// curr*(w-1-y) + c*w <= limit*w.
	y := max(0, p.w-1-(p.limit-c)*p.w/x.curr)
	return p.w - x.e + y
}

// grow is the delay in ticks until Remaining exceeds rem, given the free
// capacity (in units of 1/w) at x; 0 when the limit is already whole.
func (p params) grow(x pos, rem, free int64) int64 {
	if rem >= p.limit {
		return 0
	}
	need := (rem+1)*p.w - free
	// Within the current window free grows by prev per tick.
	if x.prev > 0 {
		if d := (need + x.prev - 1) / x.prev; x.e+d <= p.w-1 {
			return d
		}
	}
	// In the next window, y ticks in, prev becomes curr and curr 0:
	// curr*(w-1-y) <= (limit-rem-1)*w.
	y := int64(0)
	if x.curr > 0 {
		y = max(0, p.w-1-(p.limit-rem-1)*p.w/x.curr)
	}
	return p.w - x.e + y
}

// Take applies charges to states at now, all or nothing: it rolls every
// state, and only if every charge fits does it add each charge's cost. It
// writes one Decision per charge into out and reports whether the request
// was admitted. states, charges and out must have the same length, and the
// limits be valid. A charge whose cost exceeds its limit is never admitted
// and its RetryAfter is -1ns. A SlidingLog state's Log may be modified in
// place and appended to.
func Take(states []State, now int64, charges []Charge, out []Decision) bool {
	const inline = 8
	var atBuf [inline]int64
	at := atBuf[:0]
	if len(charges) > inline {
		at = make([]int64, 0, len(charges))
	}
	all := true
	for i := range charges {
		c := &charges[i]
		var t int64
		states[i], t = c.Limit.Roll(states[i], now)
		at = append(at, t)
		ok := Fits(states[i], t, c.Limit, int64(c.Cost))
		out[i].Allowed = ok
		all = all && ok
	}
	for i := range charges {
		c := &charges[i]
		if all {
			Add(&states[i], at[i], c.Limit, int64(c.Cost))
		}
		out[i] = Describe(states[i], at[i], c.Limit, int64(c.Cost), out[i].Allowed)
	}
	return all
}

// Roll moves s to now (Unix milliseconds) under l's algorithm, and returns
// it with the instant to decide at, which is now unless the clock went
// backwards: a state is never moved back in time, and an earlier instant
// is decided at the state's own.
func (l Limit) Roll(s State, now int64) (State, int64) {
	switch l.Algorithm {
	case FixedWindow:
		return rollFixed(l, s, now)
	case TokenBucket, LeakyBucket:
		return rollToken(l, s, now)
	case SlidingLog:
		return rollLog(l, s, now)
	}
	return Roll(s, now, l.Window.Milliseconds())
}

// Fits reports whether a request of cost c fits l under state s at at
// (Unix milliseconds). s must already be rolled, and at be the instant
// Limit.Roll returned.
func Fits(s State, at int64, l Limit, c int64) bool {
	switch l.Algorithm {
	case FixedWindow, SlidingLog:
		return c <= int64(l.Requests) && s.Curr+c <= int64(l.Requests)
	case TokenBucket:
		return tokenParams(l).fits(s.Curr, c)
	case LeakyBucket:
		return leakyParams(l).fits(s.Curr, c)
	}
	p := paramsOf(&l)
	return p.fits(p.pos(s, at), c)
}

// Add charges cost c to the rolled state s at at, as Take does for an
// admitted request. A store that merges several charges on one counter
// adds the extra costs with it.
func Add(s *State, at int64, l Limit, c int64) {
	switch l.Algorithm {
	case TokenBucket, LeakyBucket:
		s.Curr += c * tokenParams(l).w
	case SlidingLog:
		if c == 0 {
			return
		}
		s.Curr += c
		if n := len(s.Log); n > 0 && s.Log[n-1].At == at {
			s.Log[n-1].N += c
		} else {
			s.Log = append(s.Log, Entry{At: at, N: c})
		}
	default:
		s.Curr += c
	}
}

// Describe computes the Decision for state s at at (Unix milliseconds). s
// must already be rolled (at being the instant Limit.Roll returned) and, if
// the request was admitted, already charged (Add). allowed is whether this
// limit admits the request and c the request's cost, used for RetryAfter
// when allowed is false.
func Describe(s State, at int64, l Limit, c int64, allowed bool) Decision {
	switch l.Algorithm {
	case FixedWindow:
		return describeFixed(l, s, at, c, allowed)
	case TokenBucket:
		return tokenParams(l).describe(s, at, c, allowed)
	case LeakyBucket:
		return leakyParams(l).describe(s, at, c, allowed)
	case SlidingLog:
		return DescribeLog(l, Summarize(l, s, at, c), at, c, allowed)
	}
	p := paramsOf(&l)
	return p.describe(p.pos(s, at), c, allowed)
}

// TakeOne is Take for one charge of cost c on a state of limit l, in
// place: it rolls *s to now and, if c fits, adds it. It returns the
// instant decided at and whether c fits; DescribeTo then gives the
// Decision. The sliding window, the hot path of a store, is decided
// without copying the state or the limit.
func TakeOne(s *State, now int64, l *Limit, c int64) (at int64, ok bool) {
	if l.Algorithm != SlidingWindow {
		*s, at = l.Roll(*s, now)
		if ok = Fits(*s, at, *l, c); ok {
			Add(s, at, *l, c)
		}
		return at, ok
	}
	*s, at = Roll(*s, now, l.Window.Milliseconds())
	p := paramsOf(l)
	if ok = p.fits(p.pos(*s, at), c); ok {
		s.Curr += c
	}
	return at, ok
}

// DescribeTo is Describe writing the Decision to *d, with the state and the
// limit passed by reference: for the sliding window, the hot path of a
// store, it copies neither.
func DescribeTo(d *Decision, s *State, at int64, l *Limit, c int64, allowed bool) {
	if l.Algorithm != SlidingWindow {
		*d = Describe(*s, at, *l, c, allowed)
		return
	}
	p := paramsOf(l)
	x := p.pos(*s, at)
	p.describeTo(d, &x, c, allowed)
}

// ExpiryOf is how long after now a counter of l in the rolled and charged
// state s can still influence a decision (-1 if it no longer can): until
// its fixed window ends, its bucket is full again, its newest log entry
// leaves, or, for the sliding window, until the end of the window after
// the current one.
func ExpiryOf(l Limit, s State, now int64) time.Duration {
	var d int64
	switch l.Algorithm {
	case FixedWindow:
		_, end := l.Bounds(max(now, s.Start))
		d = end - now
	case TokenBucket, LeakyBucket:
		p := tokenParams(l)
		if e := p.ms(s, now, p.empty(s.Curr)); e > 0 && s.Curr != 0 {
			return e
		}
		return -1
	case SlidingLog:
		if n := len(s.Log); n > 0 {
			d = s.Log[n-1].At + l.Window.Milliseconds() - now
		}
	default:
		return Expiry(s.Start, now, l.Window.Milliseconds())
	}
	if d <= 0 || s.Curr == 0 {
		return -1
	}
	return time.Duration(d) * time.Millisecond
}

// Expiry is how long after its last update a counter with windows of w can
// still influence a decision: the rest of its window plus the next one.
// start is the start of the counter's current window and now the instant
// of the update, both in Unix milliseconds.
func Expiry(start, now, w int64) time.Duration {
	if d := start + 2*w - now; d > 0 {
		return time.Duration(d) * time.Millisecond
	}
	return -1
}

// Millis converts t to Unix milliseconds.
func Millis(t time.Time) int64 { return t.UnixMilli() }
