// Package upstreamtest is an upstream API for the tests and benchmarks of
// the outbound transport (adapters/outbound): an http.Handler that limits
// all its clients together as a real API limits one account, counts
// either exactly (a sliding log) or in fixed windows aligned on the
// clock, announces its limit in one family of fields (the IETF draft-10
// RateLimit and RateLimit-Policy, GitHub's X-RateLimit-* with a Unix
// reset, or OpenAI's x-ratelimit-*-requests and -tokens with reset
// durations), and records every arrival, so that a test can say how much
// of the upstream's capacity its clients used, how often they were
// refused, and how soon they followed a change of the limit.
//
// Its limit may change over time (Config.Limit is a function of the time
// since Start), which the clients are never told but by the fields.
package upstreamtest

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Counting is how an Upstream counts.
type Counting uint8

const (
	// Log counts exactly: a request is admitted when fewer than the limit
	// were admitted in the window that ends with it (a sliding log).
	Log Counting = iota + 1
	// Fixed counts in fixed windows aligned on the clock (a window of a
	// second starts at each whole second): the limit per window, whole
	// again at each window's start.
	Fixed
)

// Fields is the family of rate-limit fields an Upstream answers with.
type Fields uint8

const (
	// Draft10 answers RateLimit-Policy ("default";q=<limit>;w=<window>),
	// RateLimit ("default";r=<remaining>;t=<seconds to reset>) and, on a
	// refusal, Retry-After in whole seconds (at least 1).
	Draft10 Fields = iota + 1
	// GitHub answers X-RateLimit-Limit, -Remaining, -Used and -Reset (a
	// Unix time in whole seconds, rounded up), and no Retry-After.
	GitHub
	// OpenAI answers x-ratelimit-limit-requests, -remaining-requests and
	// -reset-requests (a duration such as "120ms" or "1s"), the same for
	// tokens when it limits them, and no Retry-After.
	OpenAI
	// Silent announces nothing: a refusal says only Retry-After, in whole
	// seconds (at least 1).
	Silent
)

// String names the family: "draft10", "github" or "openai".
func (f Fields) String() string {
	switch f {
	case Draft10:
		return "draft10"
	case GitHub:
		return "github"
	case OpenAI:
		return "openai"
	case Silent:
		return "silent"
	}
	return "unknown"
}

// String names the counting: "log" or "fixed".
func (c Counting) String() string {
	switch c {
	case Log:
		return "log"
	case Fixed:
		return "fixed"
	}
	return "unknown"
}

// TokensHeader is the request header in which a client says how many
// tokens a request uses; the Upstream answers it in UsageHeader. A
// request without it uses none.
const (
	TokensHeader = "X-Tokens"
	UsageHeader  = "X-Usage-Tokens"
)

// Config configures an Upstream.
type Config struct {
	Counting Counting
	Fields   Fields
	// Window is the window of the limits; 0 means a second.
	Window time.Duration
	// Limit is the limit of requests per window at a time since Start.
	Limit func(since time.Duration) int
	// Tokens, when set, is the limit of tokens per window at a time since
	// Start (OpenAI's fields only): a request whose TokensHeader does not
	// fit in what is left is refused.
	Tokens func(since time.Duration) int
	// Status is the status of a refusal; 0 means 429.
	Status int
	// Announced, when set, is the limit the fields announce at a time
	// since Start, in place of the real one: a hostile upstream.
	Announced func(since time.Duration) int
	// HostileAt, when positive, refuses the first request from that time
	// since Start on, whatever the counts, with HostileRetryAfter as its
	// Retry-After (such as ten years, "315360000").
	HostileAt         time.Duration
	HostileRetryAfter string
}

// Constant returns a Limit or Tokens function of n at all times.
func Constant(n int) func(time.Duration) int { return func(time.Duration) int { return n } }

// Steps returns a Limit function that is first, then each next value from
// each instant on: Steps(100, 10*time.Second, 50, 20*time.Second, 100) is
// 100 until 10 s, 50 until 20 s and 100 after.
func Steps(first int, then ...any) func(time.Duration) int {
	type step struct {
		at time.Duration
		n  int
	}
	var steps []step
	for i := 0; i+1 < len(then); i += 2 {
		steps = append(steps, step{then[i].(time.Duration), then[i+1].(int)})
	}
	return func(d time.Duration) int {
		n := first
		for _, s := range steps {
			if d >= s.at {
				n = s.n
			}
		}
		return n
	}
}

// BinWidth is the resolution of a Record.
const BinWidth = 10 * time.Millisecond

// Upstream is an http.Handler limiting all its clients together. Its
// zero value is not usable: make one with New.
type Upstream struct {
	cfg      Config
	mu       sync.Mutex
	start    time.Time
	hostile  bool // the hostile refusal was answered
	requests counter
	tokens   counter
	ok, ref  []int // arrivals per BinWidth since start
}

// New returns an Upstream; its time starts now (see Start).
func New(c Config) *Upstream {
	if c.Window <= 0 {
		c.Window = time.Second
	}
	if c.Status == 0 {
		c.Status = http.StatusTooManyRequests
	}
	u := &Upstream{cfg: c, start: time.Now()}
	u.requests.fixed = c.Counting == Fixed
	u.tokens.fixed = c.Counting == Fixed
	return u
}

// Start restarts the Upstream's time (its Limit's schedule and its
// record) at t, forgetting what it recorded.
func (u *Upstream) Start(t time.Time) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.start = t
	u.ok, u.ref = nil, nil
}

// ServeHTTP admits or refuses r and answers the fields of the Upstream's
// family.
func (u *Upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	tokens, _ := strconv.Atoi(r.Header.Get(TokensHeader))
	tokens = max(tokens, 0)
	u.mu.Lock()
	now := time.Now()
	since := now.Sub(u.start)
	win := u.cfg.Window
	limit := u.cfg.Limit(since)
	reqLeft, reqReset, reqWait := u.requests.state(now, win, limit, 1)
	ok := reqWait == 0
	hostile := u.cfg.HostileAt > 0 && since >= u.cfg.HostileAt && !u.hostile
	if hostile {
		u.hostile, ok = true, false
	}
	var tokLimit int
	var tokLeft int
	var tokReset, tokWait time.Duration
	if u.cfg.Tokens != nil {
		tokLimit = u.cfg.Tokens(since)
		tokLeft, tokReset, tokWait = u.tokens.state(now, win, tokLimit, tokens)
		ok = ok && tokWait == 0
	}
	if ok {
		u.requests.add(now, win, 1)
		reqLeft, reqReset, _ = u.requests.state(now, win, limit, 0)
		if u.cfg.Tokens != nil && tokens > 0 {
			u.tokens.add(now, win, tokens)
			tokLeft, tokReset, _ = u.tokens.state(now, win, tokLimit, 0)
		}
	}
	u.record(since, ok)
	if u.cfg.Announced != nil {
		limit = u.cfg.Announced(since)
	}
	u.mu.Unlock()

	h := w.Header()
	switch u.cfg.Fields {
	case Draft10:
		h.Set("RateLimit-Policy", `"default";q=`+strconv.Itoa(limit)+";w="+strconv.Itoa(int(ceilSeconds(win))))
		h.Set("RateLimit", `"default";r=`+strconv.Itoa(max(reqLeft, 0))+";t="+strconv.FormatInt(ceilSeconds(reqReset), 10))
		if !ok {
			h.Set("Retry-After", strconv.FormatInt(max(ceilSeconds(max(reqWait, tokWait)), 1), 10))
		}
	case GitHub:
		h.Set("X-RateLimit-Limit", strconv.Itoa(limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(max(reqLeft, 0)))
		h.Set("X-RateLimit-Used", strconv.Itoa(max(limit-reqLeft, 0)))
		h.Set("X-RateLimit-Resource", "core")
		at := now.Add(reqReset)
		sec := at.Unix()
		if at.Nanosecond() > 0 {
			sec++
		}
		h.Set("X-RateLimit-Reset", strconv.FormatInt(sec, 10))
	case OpenAI:
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(limit))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(max(reqLeft, 0)))
		h.Set("x-ratelimit-reset-requests", durationText(reqReset))
		if u.cfg.Tokens != nil {
			h.Set("x-ratelimit-limit-tokens", strconv.Itoa(tokLimit))
			h.Set("x-ratelimit-remaining-tokens", strconv.Itoa(max(tokLeft, 0)))
			h.Set("x-ratelimit-reset-tokens", durationText(tokReset))
		}
	}
	if u.cfg.Fields == Silent && !ok {
		h.Set("Retry-After", strconv.FormatInt(max(ceilSeconds(max(reqWait, tokWait)), 1), 10))
	}
	if hostile {
		h.Set("Retry-After", u.cfg.HostileRetryAfter)
	}
	if ok && tokens > 0 {
		h.Set(UsageHeader, strconv.Itoa(tokens))
	}
	if !ok {
		w.WriteHeader(u.cfg.Status)
	}
}

// record counts an arrival at since; u.mu is held.
func (u *Upstream) record(since time.Duration, ok bool) {
	if since < 0 {
		return
	}
	b := int(since / BinWidth)
	for len(u.ok) <= b {
		u.ok, u.ref = append(u.ok, 0), append(u.ref, 0)
	}
	if ok {
		u.ok[b]++
	} else {
		u.ref[b]++
	}
}

// ceilSeconds is d in whole seconds, rounded up.
func ceilSeconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}

// durationText writes d as OpenAI does: "120ms", "1s", "6m0s".
func durationText(d time.Duration) string {
	if d < time.Second {
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	}
	return d.Round(time.Millisecond).String()
}

// counter counts units by a sliding log or in fixed windows.
type counter struct {
	fixed bool
	// the log: admitted units, oldest first
	at    []time.Time
	units []int
	// fixed windows
	index int64
	used  int
}

// state returns, at now, how many units are left of limit, how long until
// more are (0: the limit is whole), and how long cost units must wait
// (0: they fit now).
func (c *counter) state(now time.Time, win time.Duration, limit, cost int) (left int, reset, wait time.Duration) {
	if c.fixed {
		idx := now.UnixNano() / int64(win)
		if idx != c.index {
			c.index, c.used = idx, 0
		}
		end := time.Unix(0, (idx+1)*int64(win))
		if c.used > 0 {
			reset = end.Sub(now)
		}
		if c.used+cost > limit {
			wait = end.Sub(now)
		}
		return limit - c.used, reset, wait
	}
	cut := now.Add(-win)
	i := 0
	for i < len(c.at) && !c.at[i].After(cut) {
		i++
	}
	c.at, c.units = c.at[i:], c.units[i:]
	used := 0
	for _, n := range c.units {
		used += n
	}
	if len(c.at) > 0 {
		reset = c.at[0].Add(win).Sub(now)
	}
	if used+cost > limit {
		// Wait until enough of the oldest units leave.
		need := used + cost - limit
		for j, n := range c.units {
			need -= n
			if need <= 0 {
				wait = c.at[j].Add(win).Sub(now)
				break
			}
		}
		if need > 0 {
			wait = win // more than the limit: never fits; say a window
		}
	}
	return limit - used, reset, wait
}

// add counts units at now.
func (c *counter) add(now time.Time, win time.Duration, units int) {
	if c.fixed {
		c.used += units
		return
	}
	c.at = append(c.at, now)
	c.units = append(c.units, units)
}

// Record is what an Upstream saw: its arrivals, admitted and refused, per
// BinWidth since its Start.
type Record struct {
	Window  time.Duration
	Limit   func(time.Duration) int
	Ok, Ref []int
}

// Record returns what the Upstream saw since its Start.
func (u *Upstream) Record() Record {
	u.mu.Lock()
	defer u.mu.Unlock()
	return Record{Window: u.cfg.Window, Limit: u.cfg.Limit, Ok: append([]int(nil), u.ok...), Ref: append([]int(nil), u.ref...)}
}

func (r Record) sum(bins []int, from, to time.Duration) int {
	n := 0
	for b := int(from / BinWidth); b < int(to/BinWidth) && b < len(bins); b++ {
		if b >= 0 {
			n += bins[b]
		}
	}
	return n
}

// Admitted is how many arrivals in [from, to) were admitted.
func (r Record) Admitted(from, to time.Duration) int { return r.sum(r.Ok, from, to) }

// Refused is how many arrivals in [from, to) were refused.
func (r Record) Refused(from, to time.Duration) int { return r.sum(r.Ref, from, to) }

// Capacity is how many requests the Upstream's limit admits in [from,
// to): its limit per window, at each instant, spread over the window.
func (r Record) Capacity(from, to time.Duration) float64 {
	c := 0.0
	for t := from; t < to; t += BinWidth {
		c += float64(r.Limit(t)) * float64(BinWidth) / float64(r.Window)
	}
	return c
}

// Used is the share of the Upstream's capacity in [from, to) its clients
// used: Admitted / Capacity.
func (r Record) Used(from, to time.Duration) float64 {
	c := r.Capacity(from, to)
	if c == 0 {
		return 0
	}
	return float64(r.Admitted(from, to)) / c
}

// MostWithin is the most arrivals, admitted or refused, in any window
// of length Window within [from, to).
func (r Record) MostWithin(from, to time.Duration) int {
	most := 0
	for u := from; u+r.Window <= to; u += BinWidth {
		most = max(most, r.Admitted(u, u+r.Window)+r.Refused(u, u+r.Window))
	}
	return most
}

// LongestGap is the longest time within [from, to) without an arrival,
// to BinWidth.
func (r Record) LongestGap(from, to time.Duration) time.Duration {
	longest, run := time.Duration(0), time.Duration(0)
	for u := from; u < to; u += BinWidth {
		if r.Admitted(u, u+BinWidth)+r.Refused(u, u+BinWidth) > 0 {
			run = 0
			continue
		}
		run += BinWidth
		longest = max(longest, run)
	}
	return longest
}

// Follow is how long after from the clients took to send at limit per
// window, until to: the end of the first window (of length Window) in
// which at least 90% of limit were admitted and nothing was refused,
// starting no earlier than the last refusal of an episode of them (a
// window in which more than 2% of limit, at least 1, were refused). It
// reports false when the clients never did. A stray refusal later is
// not an episode: Refused counts it.
func (r Record) Follow(from, to time.Duration, limit int) (time.Duration, bool) {
	slack := max(limit/50, 1)
	over := from // just after the last refusal of an episode
	for u := from; u+r.Window <= to; u += BinWidth {
		if r.Refused(u, u+r.Window) > slack {
			for b := u + r.Window - BinWidth; b >= u; b -= BinWidth {
				if r.Refused(b, b+BinWidth) > 0 {
					over = max(over, b+BinWidth)
					break
				}
			}
		}
	}
	for u := over; u+r.Window <= to; u += BinWidth {
		if 10*r.Admitted(u, u+r.Window) >= 9*limit && r.Refused(u, u+r.Window) == 0 {
			return u + r.Window - from, true
		}
	}
	return to - from, false
}
