package middleware

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/sluicehq/sluice/internal/hitters"
	"github.com/sluicehq/sluice/internal/redisstore"
)

// DefaultTopClients is the number of counters of each top-client summary
// of a rule (see TopConfig).
const DefaultTopClients = hitters.DefaultK

// DefaultTopPublish is how often an app server on a shared store publishes
// its top-client summaries (see TopConfig).
const DefaultTopPublish = 5 * time.Second

// TopConfig configures how a Limiter tracks its top clients
// (Limiter.TopClients) and its rules' rates (Limiter.Rates).
//
// For each rule, the Limiter keeps the clients charged and denied the most
// units over the last minute (60 to 70 s: six buckets of 10 s and the
// current one) and the last hour (60 to 70 min, in buckets of 10 min), in
// Space-Saving summaries of K counters each. Memory is bounded whatever
// keys clients invent: at most rules × 2 × 7 × (2K − 1) keys, each its
// length plus about 100 bytes (K = 100: about 350 KB per busy rule).
//
// # Sampling
//
// A decision does not hand every event to the summaries: each rule has a
// gate per kind (charged, denied) that lets an event of u units through
// with probability min(1, u/z), and a sampled event counts max(u, z)
// units (threshold sampling). A goroutine of the Limiter sets each gate's
// threshold z every second (sooner on a burst) so that about Samples
// events a second go through it: while a rule sees fewer, z is 1 and
// every event is counted, exactly as without sampling; above, z is about
// the rule's units a second over Samples. What tracking costs is then
// bounded whatever the load: a draw per rule of each decision (a few
// nanoseconds, no lock, no allocation), and for each sampled event its
// trip through a lock-free ring and the summary (a few hundred
// nanoseconds), about Samples times a second per rule and kind.
// BENCHMARKS.md has the costs.
//
// # What a list says
//
// With N units in the period and S events sampled, z the largest
// threshold in force over it (TopList.Threshold; TopList.Samples is S):
//
//   - A client's count is an unbiased estimate of its true units C, made
//     of independent terms in [0, z], so it is below C − t with
//     probability at most exp(−t²/(2zC)), and above C + t with probability
//     at most exp(−t²/(2z(C + t/3))). TopList.Bounds turns a listed
//     client's Count and Error into an interval that holds its true
//     units with a probability you choose.
//   - The summaries add their own error, as without sampling: a client's
//     count is at most ErrorBound (≤ the sampled total over K) above its
//     sampled units, and every client whose sampled units exceed it is
//     listed.
//   - Together: a client with a share ε ≥ 3/K of the period's units is
//     listed with probability at least 1 − exp(−εN/(8z)) − exp(−3N/(28z));
//     N/z is about S, so over a minute at the default of 1,000 samples a
//     second (S = 60,000) and K = 100, a client with 3 % of the units
//     goes unlisted with probability below 10^-90.
//   - With z = 1 (every event counted) the counts are exact but for the
//     summaries' error, and the bounds are those of Space-Saving alone.
//
// Events arrive in the ring from the requests and are drained into the
// summaries every second, and when a shard of the ring fills a quarter.
// When every core is busy and that goroutine cannot run in time, a
// request that finds its shard full drains it itself if the summaries are
// free (never waiting for them); if they are busy, its event is dropped
// and counted (Dropped in TopList).
//
// With a store shared by a fleet (Redis), each app server publishes its
// summaries every Publish (one small write per rule whose summaries
// changed, kept for TTL; an idle server writes nothing), and TopClients
// merges those of every server whose last write can hold clients of the
// period: written in the last 70 s for the minute, 70 min for the hour.
type TopConfig struct {
	// Off turns tracking off: nothing is noted per request, and
	// TopClients and Rates return ErrTopOff.
	Off bool
	// K is the number of counters per summary of a rule that does not set
	// Rule.TopClients; 0 means DefaultTopClients. At least 2.
	K int
	// Server names this app server among those of a fleet; "" means the
	// host name and a random suffix.
	Server string
	// Publish is how often the summaries are published to a shared
	// store, if they changed (0 means DefaultTopPublish), and TTL how long
	// a server's stay there after its last write (0 means 80 minutes: the
	// hour's period and a bucket).
	Publish, TTL time.Duration
	// Samples is how many events a second each rule's gates aim to
	// sample, per kind (0 means DefaultTopSamples): a rule that sees
	// fewer has every event counted. Less than 0 counts every event
	// whatever the load, as the tracker did before it sampled: exact
	// counts, at the cost of every event's trip through the summaries.
	Samples int
}

// DefaultTopSamples is how many events a second, per rule and kind, the
// top-client tracker samples at most unless TopConfig.Samples says.
const DefaultTopSamples = hitters.DefaultSamples

// WithTopClients configures the tracking of top clients and rates; it is
// on by default (DefaultTopClients counters per summary).
func WithTopClients(tc TopConfig) Option {
	return func(c *config) {
		switch {
		case tc.K != 0 && tc.K < 2:
			c.errorf("WithTopClients: K %d must be at least 2 (or 0 for the default)", tc.K)
			return
		case tc.Publish < 0 || tc.TTL < 0:
			c.errorf("WithTopClients: Publish %s and TTL %s must not be negative", tc.Publish, tc.TTL)
			return
		case tc.Publish > 0 && tc.TTL > 0 && tc.TTL < tc.Publish:
			c.errorf("WithTopClients: TTL %s is shorter than Publish %s: servers would drop out between writes", tc.TTL, tc.Publish)
			return
		}
		c.top = tc
	}
}

// ErrTopOff is returned by TopClients and Rates when tracking is off
// (TopConfig.Off).
var ErrTopOff = errors.New("sluice: top-client tracking is off")

// topState is the Limiter's tracker, nil when tracking is off.
type topState struct {
	t *hitters.Tracker
}

// topBacked is implemented by stores that can keep a fleet's summaries.
type topBacked interface {
	topStore() *redisstore.Store
}

func (r *RedisStore) topStore() *redisstore.Store  { return r.s }
func (s *RegionStore) topStore() *redisstore.Store { return s.local.s }

// redisTop publishes and collects summaries in Redis, on the Redis clock
// unless the limiter has one (WithClock).
type redisTop struct {
	s     *redisstore.Store
	clock func() time.Time
}

func (b redisTop) now() time.Time {
	if b.clock != nil {
		return b.clock()
	}
	return time.Time{}
}

func (b redisTop) Publish(ctx context.Context, rule, server string, payload []byte, ttl time.Duration) error {
	return b.s.PublishTop(ctx, b.now(), rule, server, payload, ttl)
}

func (b redisTop) Collect(ctx context.Context, rule string, ttl time.Duration) ([]hitters.Published, error) {
	list, err := b.s.CollectTop(ctx, b.now(), rule, ttl)
	out := make([]hitters.Published, len(list))
	for i, ts := range list {
		out[i] = hitters.Published{Server: ts.Server, Payload: ts.Payload, Age: ts.Age}
	}
	return out, err
}

// startTop starts the tracker, before the first rules are bound.
func (l *Limiter) startTop() {
	tc := l.cfg.top
	if tc.Off {
		return
	}
	cfg := hitters.Config{K: tc.K, Samples: tc.Samples}
	if clk := l.cfg.clock; clk != nil {
		cfg.Now = func() int64 { return clk().UnixMilli() }
	}
	if tb, ok := l.cfg.store.(topBacked); ok {
		if tc.Server == "" {
			host, _ := os.Hostname()
			tc.Server = host + "-" + newSlotID()[:6]
			l.cfg.top.Server = tc.Server
		}
		if tc.Publish == 0 {
			tc.Publish = DefaultTopPublish
		}
		cfg.Fleet = &hitters.FleetConfig{Backend: redisTop{tb.topStore(), l.cfg.clock}, Server: tc.Server, Every: tc.Publish, TTL: tc.TTL}
	}
	l.top.t = hitters.New(cfg)
}

// bindTop gives the tracker the rules of set.
func (l *Limiter) bindTop(set *ruleSet) {
	if l.top.t == nil {
		return
	}
	ks := make(map[string]int, len(set.rules))
	for _, r := range set.rules {
		if !r.Deny {
			ks[r.Name] = r.TopClients
		}
	}
	l.top.t.SetRules(ks)
	for _, r := range set.rules {
		if !r.Deny {
			r.top = l.top.t.Gates(r.Name)
		}
	}
}

func (l *Limiter) stopTop() {
	if l.top.t != nil {
		l.top.t.Close()
	}
}

// noteTop offers the units res was charged, or denied, to the sampling
// gates of their rules, and puts those sampled in the tracker's ring:
// every rule of an allowed request (each once, whatever its limits; not
// its usage limits, counted in other units), the binding rule of a denied
// one. In shadow mode, a request that a limit would have denied counts as
// denied.
func (l *Limiter) noteTop(t *hitters.Tracker, s *scratch, res *Result) {
	if !res.Allowed || l.cfg.shadow && res.Shadowed && res.ShadowPolicy == "" {
		if g := res.top; g != nil && res.key != "" {
			if smp, ok := g.Draw(&s.rng, hitters.Denied, int64(max(res.Cost, 1))); ok {
				t.NoteSample(s.shard(t), res.Rule, res.key, smp, hitters.Denied)
			}
		}
		return
	}
	for i := range s.charges {
		m, c := &s.metas[i], &s.charges[i]
		if m.top == nil || m.usage != nil ||
			i > 0 && c.Name == s.charges[i-1].Name && c.Key == s.charges[i-1].Key { // a rule's limits are in a row
			continue
		}
		if smp, ok := m.top.Draw(&s.rng, hitters.Charged, int64(c.Cost)); ok {
			t.NoteSample(s.shard(t), c.Name, c.Key, smp, hitters.Charged)
		}
	}
}

// shard returns the shard of t's ring s puts its events in.
func (s *scratch) shard(t *hitters.Tracker) uint32 {
	if s.topShard == 0 {
		s.topShard = t.Shard()
	}
	return s.topShard
}

// TopBy says which units TopClients ranks clients by.
type TopBy uint8

// The rankings.
const (
	// TopDenied ranks clients by the units of their requests that were
	// denied (the binding rule's cost of each).
	TopDenied TopBy = iota + 1
	// TopCharged ranks clients by the units they were charged: every rule
	// of each allowed request.
	TopCharged
)

// String returns "denied" or "charged".
func (b TopBy) String() string {
	if b == TopCharged {
		return "charged"
	}
	return "denied"
}

// TopPeriod is the period TopClients covers.
type TopPeriod uint8

// The periods.
const (
	// TopMinute: the last 60 to 70 seconds.
	TopMinute TopPeriod = iota + 1
	// TopHour: the last 60 to 70 minutes.
	TopHour
)

// String returns "1m" or "1h".
func (p TopPeriod) String() string {
	if p == TopHour {
		return "1h"
	}
	return "1m"
}

// TopList is what TopClients found: a rule's heaviest clients over a
// period, with the bounds of their counts.
type TopList struct {
	Rule   string
	By     TopBy
	Period TopPeriod
	// K is the number of counters of each summary.
	K int
	// Total is the units of every client in the period (of every server
	// merged).
	Total uint64
	// ErrorBound bounds every client's error: a client's true units are
	// within [Count − Error, Count], Error ≤ ErrorBound ≤ Total/K, and a
	// client that is not listed has at most ErrorBound units (if the list
	// was not cut short by its limit).
	ErrorBound uint64
	// Dropped is the units of every rule that went uncounted in the
	// period because requests came faster than the tracker drained them:
	// a count may be short by that much too. Normally 0.
	Dropped uint64
	// Samples is how many events the counts were made of, and Threshold
	// the largest sampling threshold in force over the period (of every
	// server merged): 1 when every event was counted, and the counts are
	// exact but for ErrorBound. See TopConfig and Bounds.
	Samples, Threshold uint64
	// Servers is how many app servers' summaries were merged (1 without a
	// shared store, or when it failed), and ServerNames their names.
	Servers     int
	ServerNames []string
	// Lag is the age of the oldest summary merged from another server:
	// what the list may miss of its last moments.
	Lag time.Duration
	// FleetErr is why the other servers' summaries could not be read
	// (the list is then this server's own), nil if they were.
	FleetErr error
	// At is the instant of the list.
	At time.Time
	// Clients are the clients, the heaviest first.
	Clients []TopClient
}

// TopClient is one client of a TopList.
type TopClient struct {
	// Key is the client's key, as the rule's key function produced it.
	Key string
	// Count is an upper bound on the client's units in the period, and
	// Count − Error a lower bound.
	Count, Error uint64
	// FirstSeen is when the client was first counted in the period (the
	// oldest bucket that holds it).
	FirstSeen time.Time
}

// TopClients returns the clients of rule with the most units denied (or
// charged) over the period, at most limit of them (0 for all the summary
// holds, at most K−1). With a shared store, the summaries of every app
// server that published within TopConfig.TTL are merged; if they cannot
// be read, the list is this server's and FleetErr says why. A rule with
// Rule.TopClients < 0 has no list (ErrUnknownRule is returned for a rule
// the limiter does not have).
func (l *Limiter) TopClients(ctx context.Context, rule string, by TopBy, period TopPeriod, limit int) (TopList, error) {
	t := l.top.t
	if t == nil {
		return TopList{}, ErrTopOff
	}
	if _, err := l.ruleNamed(rule); err != nil {
		return TopList{}, err
	}
	kind, p := hitters.Denied, hitters.Minute
	if by == TopCharged {
		kind = hitters.Charged
	}
	if period == TopHour {
		p = hitters.Hour
	}
	f, ok, err := t.Fleet(ctx, rule, kind, p)
	if !ok {
		return TopList{}, fmt.Errorf("sluice: rule %q: its top clients are not tracked (a Deny rule, or Rule.TopClients < 0)", rule)
	}
	out := TopList{
		Rule: rule, By: by, Period: period, K: f.K, Total: f.N, ErrorBound: f.Bound, Dropped: f.Dropped,
		Samples: f.Samples, Threshold: max(f.Threshold, 1),
		Servers: f.Servers, ServerNames: f.Names, Lag: f.Lag, At: time.UnixMilli(f.At),
	}
	if err != nil {
		out.FleetErr = fmt.Errorf("%w: %w", ErrStore, err)
	}
	es := f.Entries
	if limit > 0 && len(es) > limit {
		es = es[:limit]
	}
	out.Clients = make([]TopClient, len(es))
	for i, e := range es {
		out.Clients[i] = TopClient{Key: e.Key, Count: e.Hi, Error: e.Hi - e.Lo, FirstSeen: time.UnixMilli(e.First)}
	}
	return out, nil
}

// Bounds returns an interval that holds the true units of c, a client of
// the list, with probability at least confidence (for example 0.99): each
// end fails with probability at most (1 − confidence)/2. It widens
// [c.Count − c.Error, c.Count], which holds the client's sampled units,
// by the sampling error that the list's Threshold allows (TopConfig
// states it); with a Threshold of 1 it is that interval itself.
func (tl TopList) Bounds(c TopClient, confidence float64) (lo, hi uint64) {
	return hitters.Bounds(c.Count-min(c.Error, c.Count), c.Count, tl.Threshold, 1-confidence)
}

// RuleRates is what a rule allowed and denied in each interval of the
// last 15 minutes (Limiter.Rates).
type RuleRates struct {
	Rule string
	// Interval is the length of each point (10 s).
	Interval time.Duration
	// Points are the intervals, oldest first, the last one current.
	Points []RatePoint
}

// RatePoint is what a rule decided in one interval: requests allowed
// (charged to the rule) and denied (by the rule), and their units.
type RatePoint struct {
	Start                     time.Time
	Allowed, Denied           uint64
	AllowedUnits, DeniedUnits uint64
}

// Rates returns what each rule allowed and denied in the intervals of the
// last 15 minutes, from a bounded ring buffer in memory (this app
// server's). Rules are in the order of the rules in force. The figures
// are made of the events the top-client tracker sampled (TopConfig): exact
// while a rule sees fewer than TopConfig.Samples events a second,
// unbiased estimates above, within a fraction of a percent over an
// interval at the default.
func (l *Limiter) Rates() ([]RuleRates, error) {
	t := l.top.t
	if t == nil {
		return nil, ErrTopOff
	}
	all := t.Rates()
	var out []RuleRates
	for _, r := range l.rules.Load().rules {
		pts, ok := all[r.Name]
		if !ok {
			continue
		}
		rr := RuleRates{Rule: r.Name, Interval: hitters.RateSpan * time.Millisecond, Points: make([]RatePoint, len(pts))}
		for i, p := range pts {
			rr.Points[i] = RatePoint{Start: time.UnixMilli(p.Start), Allowed: p.Allowed, Denied: p.Denied,
				AllowedUnits: p.AllowedUnits, DeniedUnits: p.DeniedUnits}
		}
		out = append(out, rr)
	}
	return out, nil
}
