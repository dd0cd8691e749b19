// Package redisstore keeps the counters of every algorithm of package
// window in Redis: sliding windows, fixed windows (aligned to the Unix
// epoch or calendar periods), token buckets, leaky buckets and sliding
// logs, and what the fleet shares beside them. With a go-redis client,
// cluster client or ring, its scripts go through internal/redispipe, which
// shares round trips between requests and follows each server's health
// (docs/redis.md).
//
// Beside Take (decide.lua, below), the store serves the rest of sluice;
// the scripts that count are twins of the arithmetic of package window or
// fleet, checked against it by the conformance suite (internal/storetest)
// or on shared tables:
//
//   - Settle runs decide.lua in its settle mode: a usage known once the
//     request has run is charged whatever fits, which may leave a debt
//     (window.SettleAll; docs/usage.md).
//   - TakeAt and Refund (takeback.lua, window.Refund) take admitted
//     charges back: a rule that counts by outcome (docs/logins.md), a
//     usage below its estimate. GiveBack frees a queued request's place.
//   - Fleet and FleetAll (fleet.lua, fleet.Grant and fleet.Apply) are the
//     Redis side of lease and write-back modes, a syncer's tick sent in
//     batches that share script runs (docs/fleet.md).
//   - Acquire, Release and Renew (slots.lua) hold concurrency slots with
//     leases (docs/algorithms.md).
//   - PublishSpare (spare.lua) keeps each app server's spare capacity and
//     returns the fleet's, for elastic limits (docs/overload.md).
//   - PublishTop and CollectTop (top.lua) keep each server's top-client
//     summaries for the fleet (docs/operations.md).
//   - SetBan, LiftBan and SetOverride keep bans and per-client overrides
//     for the whole fleet (docs/logins.md), and SetPause the outbound
//     transport's pauses (docs/outbound.md).
//
// # Decisions
//
// A Store decides with the Lua script decide.lua, which implements
// window.Take exactly for every algorithm (same integer arithmetic in the
// same ticks, same windows, same clock-backwards rules): it rolls every
// counter of a request, checks that every charge fits, and only then adds
// the costs and extends the bucket's expiry to window.ExpiryOf. One run
// decides all the charges of a request together, whatever their
// algorithms, all or nothing. Only the counters of admitted charges with a
// cost are written: a denied request, or a read (cost 0), writes nothing.
// Two charges of one request may name the same counter; each is decided
// against the counter as it was, and both costs are counted. The script
// runs with EVALSHA, falling back to EVAL when the server has not cached
// it, so a decision costs one round trip. It is a batch script
// (redispipe.NewBatchScript): the decisions of many concurrent Takes for
// one server (one hash slot on a Cluster) run as one call, one after the
// other, each as though it ran alone; a counter that several of them name
// in a row is read and written once. The script returns what it read
// (the counters rolled to the request's instant; for a sliding log, a
// summary of the log, window.LogSummary) and Go describes the decisions
// with window.Describe and window.DescribeLog.
//
// When Take is given the zero time, the script reads the server's clock with
// TIME, so application servers whose clocks disagree still share one clock
// per counter. A non-zero time is passed to the script instead, which lets
// tests drive a real server with a fake clock. Expiry is always in the
// server's real time.
//
// # Calendar periods
//
// Redis has no time-zone database, so the boundaries of a FixedWindow
// limit with a Period (a day, week or month in its Location, of varying
// length across daylight-saving changes) are worked out in Go: Take passes
// four consecutive boundaries around the explicit now, or around the
// application server's clock when Redis keeps time
// (window.Limit.Boundaries), and the script decides in the period among
// the three they delimit that contains its own instant. If Redis's clock
// is more than a whole period away from the application server's, the
// instant lies outside them and Take fails with an error, before anything
// is counted. Fixed windows aligned to the Unix epoch are worked out in
// the script.
//
// # Keys
//
// Counters are kept in buckets, so that a million clients do not cost a
// million Redis keys: a bucket is a HASH at
//
//	<prefix>{<tag>}
//
// where tag is the first 3 characters (18 bits) of the unpadded base64url
// encoding of SHA-256(Charge.Key): 262,144 buckets, each holding the
// counters of the Keys that hash to it. A counter is one field of its
// bucket, named by the first 12 bytes (96 bits) of SHA-256(Key, Name,
// Limit.Series()). The series is the window in ms for a sliding window,
// and mixes the algorithm (and the period and time zone) in for the
// others, so a rule whose algorithm changes starts afresh, and a
// sliding-window counter keeps the field it had before there were other
// algorithms. Its value is, by algorithm (see decide.lua):
//
//   - sliding window: 32 bytes, four little-endian doubles: the start of
//     its current window in Unix ms, the counts of the previous and
//     current windows, the window in ms;
//   - fixed window: 21 bytes, "F", then the end and start of the window
//     as 6-byte integers and the count as a double;
//   - token bucket and leaky bucket: 27 bytes, "T", then the instant the
//     bucket is full (empty) again, the instant of the level and the tick
//     it is counted in, as 6-byte integers, and the level as a double;
//   - sliding log: "L", then the instant its newest entry leaves (6 bytes)
//     and the sum of its entries (4 bytes), then 10 bytes per entry, oldest
//     first: its instant (6 bytes) and its count (4), one entry per
//     millisecond: 11 + 10n bytes.
//
// With a few counters per bucket, Redis keeps each bucket as one small
// listpack, which costs far less per counter than a key of its own (see
// BENCHMARKS.md). A value longer than 64 bytes (a sliding log of 6 entries
// or more) turns its bucket into a hash table (hash-max-listpack-value),
// for as long as the bucket lives.
//
// Hostile keys therefore give fixed-size keys and fields that cannot inject
// a hash tag, every counter of one Key lies in one bucket and so in one
// Redis Cluster hash slot, and two counters share a field only if 96-bit
// hashes collide within a bucket (for a billion counters, odds below
// 10^-16). Every key the script touches is passed in KEYS.
//
// Every value tells when it stops mattering (window.ExpiryOf): two windows
// after the start of a sliding window's current window; for the others
// the instant stored first, the end of a fixed window, the instant a token
// bucket is full again (a leaky bucket empty) at the refill of the limit
// it was last charged with, the instant a log's newest entry leaves. A
// bucket expires no sooner than any counter in it (PEXPIRE, only ever
// extended; for token and leaky buckets and logs, whose expiry moves on
// with every charge, to a whole number of windows, so that a busy counter
// does not extend it at every decision, and an idle bucket lives at most a
// window longer). A field that is past its own expiry is treated as absent
// (as the memory store does: a token bucket whose refill was lowered since
// it was charged is forgotten sooner than its level alone would say), and
// when a new field is added to a bucket, the expired fields of a random
// sample of it are dropped: 8 fields for one new field in four, two per
// new field on average (a quarter of the commands of sampling two every
// time), so a bucket that active clients keep alive does not accumulate
// the counters of clients that went away (TestPruneBoundsBucket: a bucket
// holds about twice its live counters).
//
// # Redis Cluster and Ring
//
// With a *redis.ClusterClient or a *redis.Ring (which routes a command by
// the hash tag of its first key), a request whose charges all have the same
// Key is still decided by one script run. A request whose charges have
// different Keys spans several slots or shards, which no single script may
// touch, so Take runs the script once per Key, in the order in which the
// Keys first appear in the charges, all at the instant chosen by the first
// run (the first node's TIME when Take is given the zero time):
//
//   - It never admits a request over any limit: each run is atomic on its
//     slot, and the request is admitted only if every run admitted its part.
//   - If a run denies, the costs already counted by the earlier runs are
//     given back with a second script, refund.lua, and the Keys not reached
//     yet are decided by a dry run that writes nothing; the decisions are
//     then those a single script would have given. A counter that nothing
//     else touched in between is put back exactly as it was, or deleted if
//     the request created it (a sliding log loses the request's entry, but
//     the entries that the decision dropped for having left the window do
//     not come back). Otherwise the cost is taken off what holds it, never
//     below zero: a sliding window's current count (or its previous count
//     if it has rolled one window since), a fixed window's count if it is
//     still in the charged window, a token or leaky bucket's level (the
//     leaky bucket's queue, as window.GiveBack does), the entry of the
//     request's instant in a sliding log.
//   - Between a charge and its refund, a concurrent request may see the
//     charge and be denied although it would have fitted: the error is on
//     the conservative side. If the refund fails, the charge stays counted
//     until it ages out of the window, and Take still reports the deny.
//   - It costs one round trip per distinct Key and, on a deny, one more per
//     Key charged (refund) or not reached (dry run), instead of one in all.
//     If a later run fails, the earlier ones are refunded and Take returns
//     the error.
//
// Clients of other types (a *redis.Client, including one from
// redis.NewFailoverClient for Sentinel) always get one script run per
// request. A wrapper type around a *redis.ClusterClient is not recognised:
// requests spanning several Keys then fail with a CROSSSLOT error.
package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/window"
)

var (
	//go:embed decide.lua
	decideSrc string
	//go:embed refund.lua
	refundSrc string

	script       = redispipe.NewBatchScript(keyguard.Wrap(decideSrc))
	refundScript = keyguard.Script(refundSrc)
)

const (
	// DefaultPrefix is the key prefix used when Config.Prefix is empty.
	DefaultPrefix = "sluice:"
	// DefaultTimeout is the time limit of one Take when Config.Timeout is
	// zero.
	DefaultTimeout = 100 * time.Millisecond

	// tagLen is the length of a bucket's tag: 3 base64url characters,
	// 18 bits, 262,144 buckets.
	tagLen = 3
	// fieldLen is the length of a counter's field: 12 bytes, 96 bits.
	fieldLen = 12
	// maxPrefixLen bounds Config.Prefix.
	maxPrefixLen = 256
	// fieldsPerCharge is the number of integers the script returns per
	// charge.
	fieldsPerCharge = 7
	// maxNow is the latest instant, in Unix ms, that Take accepts (in
	// the year 6419): the scripts store instants as 6-byte integers
	// (below 2^47 ms, in the year 6429), and a counter's expiry may lie a
	// whole window after its instant.
	maxNow = 1<<47 - 1 - int64(window.MaxWindow/time.Millisecond)
)

// The scripts' algorithm codes (see decide.lua), boxed once.
var (
	codeSliding  any = "0"
	codeFixed    any = "1"
	codeLog      any = "2"
	codeToken    any = "3"
	codeCalendar any = "4"
	codeLeaky    any = "5"
)

// Config configures a Store. The zero value is ready to use.
type Config struct {
	// Prefix starts every key the store writes. It may not contain '{' or
	// '}', which would change the Redis Cluster hash slot of the keys.
	// Empty means DefaultPrefix.
	Prefix string
	// Timeout bounds each Take, on top of any deadline of the caller's
	// context. Zero means DefaultTimeout; a negative value means no limit
	// beyond the caller's context. Take returns at the deadline whatever
	// the client's options (go-redis itself applies a context deadline to
	// network reads only with Options.ContextTimeoutEnabled).
	Timeout time.Duration
	// Pipeline configures the batching of decisions and the health of
	// each server (see package redispipe). Its OnStateChange hears when a
	// server goes down or slow, or comes back. Its Bound, if zero, is
	// Timeout: a server that answers later than three quarters of
	// Timeout is slow, and decisions for it fail at once.
	Pipeline redispipe.Config
}

// Store is a counter store backed by Redis, for every algorithm. It is safe for
// concurrent use.
type Store struct {
	client  redis.Scripter
	prefix  string
	timeout time.Duration
	// split is set for clients that route each command to a shard by its
	// first key: requests with several Keys are then run once per Key.
	split bool
	// pipe batches the scripts of concurrent decisions per server and
	// fails fast on servers that are down. It is nil for clients of other
	// types than *redis.Client, *redis.ClusterClient and *redis.Ring,
	// which get one script.Run per decision.
	pipe *redispipe.Pipeliner
	// detach is set for clients without pipe that may not honour a
	// context's deadline on network reads: Take then waits for the script
	// on its own goroutine only until the deadline.
	detach  bool
	scratch sync.Pool
}

// scratch holds the per-call buffers of Take.
type scratch struct {
	buf  []byte
	keys []string
	// fields holds the field of each charge's counter, fieldLen bytes
	// each (see field).
	fields []byte
	run    []string
	args   []any
	req    []byte
	// sent is the request argument of the run in flight (see send).
	sent []byte
	ints []int64
	// deadline is the deadline of every script run of a Take (zero for
	// none), on top of its context's.
	deadline time.Time
	// settle is set for a Settle: runs that charge charge whatever fits.
	settle bool
	info   []counter
	order  []int
}

// field returns the field of the counter of charge i.
func (sc *scratch) field(i int) []byte { return sc.fields[i*fieldLen : (i+1)*fieldLen] }

// counter is what the script read of one charge's counter, before the
// charge: for a sliding log, the summary of the log rolled to the
// request's instant; for the other algorithms, the state rolled to it and
// the state as stored (Start -1 if there was none).
type counter struct {
	rolled window.State
	stored window.State
	// storedExp is a token or leaky bucket's stored expiry, -1 if none.
	storedExp int64
	sum       window.LogSummary
	// at is the instant the charge was decided at: the request's, or
	// the counter's own if the clock went backwards.
	at int64
}

// New returns a Store that keeps its counters in Redis through client.
func New(client redis.Scripter, cfg Config) (*Store, error) {
	s := &Store{client: client, prefix: cfg.Prefix, timeout: cfg.Timeout}
	switch c := client.(type) {
	case nil:
		return nil, errors.New("redisstore: nil client")
	case *redis.Client:
		if c == nil {
			return nil, errors.New("redisstore: nil client")
		}
	case *redis.ClusterClient:
		if c == nil {
			return nil, errors.New("redisstore: nil client")
		}
		s.split = true
	case *redis.Ring:
		if c == nil {
			return nil, errors.New("redisstore: nil client")
		}
		s.split = true
	default:
		s.detach = true
	}
	if s.prefix == "" {
		s.prefix = DefaultPrefix
	}
	if strings.ContainsAny(s.prefix, "{}") {
		return nil, fmt.Errorf("redisstore: prefix %q contains '{' or '}'", s.prefix)
	}
	if len(s.prefix) > maxPrefixLen {
		return nil, fmt.Errorf("redisstore: prefix is %d bytes long, more than %d", len(s.prefix), maxPrefixLen)
	}
	if s.timeout == 0 {
		s.timeout = DefaultTimeout
	}
	s.scratch.New = func() any { return new(scratch) }
	if !s.detach {
		pc := cfg.Pipeline
		if pc.Bound == 0 && s.timeout > 0 {
			// The bound of every decision is the bound a server must
			// answer within to be up: one that answers later is slow.
			pc.Bound = s.timeout
		}
		p, err := redispipe.New(client, pc)
		if err != nil {
			return nil, fmt.Errorf("redisstore: %w", err)
		}
		s.pipe = p
	}
	return s, nil
}

// Close stops the store's pipeline workers and probes; decisions waiting
// for a reply fail. It does not close the client.
func (s *Store) Close() error {
	if s.pipe != nil {
		return s.pipe.Close()
	}
	return nil
}

// Timeout returns the bound of each decision (Config.Timeout), or zero
// for none.
func (s *Store) Timeout() time.Duration { return max(s.timeout, 0) }

// PerServerHealth reports whether the store tracks the health of each
// Redis server itself, failing fast on those that are down, so that a
// limiter needs no circuit breaker of its own in front of it.
func (s *Store) PerServerHealth() bool { return s.pipe != nil }

// bounded returns ctx with a deadline Config.Timeout from now, if one is
// set, and its cancel function (a no-op when none is).
func (s *Store) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if s.timeout > 0 {
		return context.WithTimeout(ctx, s.timeout)
	}
	return ctx, func() {}
}

// eval runs script through the pipeline or, for clients it does not know,
// directly.
func (s *Store) eval(ctx context.Context, script *redis.Script, keys []string, args []any) (any, error) {
	if s.pipe != nil {
		return s.pipe.Run(ctx, script, keys, args...)
	}
	return redispipe.RunDirect(ctx, s.client, script, keys, args...)
}

// Take decides charges at now, all or nothing, as described by the Store
// interface of package middleware. The zero now means the Redis server's
// clock. It writes one Decision per charge into out and reports whether the
// request was admitted. A non-nil error means nothing was counted.
//
// Take returns when its context is done (at the latest after
// Config.Timeout) even if the client would wait longer for a server that
// stopped answering, and at once when the server of its counters is known
// to be down (see package redispipe). A decision that arrives after Take
// returned is discarded; its charge, if any, stays counted, which errs on
// the side of denying. Concurrent decisions share round trips: no
// goroutine is started per decision (except for clients of unknown types,
// whose scripts run on a goroutine of their own when a deadline is set).
func (s *Store) Take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, error) {
	allowed, _, err := s.TakeAt(ctx, now, charges, out)
	return allowed, err
}

// detachedCall is a Take running on a goroutine of its own.
type detachedCall struct {
	charges []window.Charge
	out     []window.Decision
	allowed bool
	ms      int64 // the instant the script decided at
	err     error
	done    chan struct{}
}

// checkCharge returns an error naming charge i if its Limit is invalid or
// its Cost negative: what Take and Refund check before anything is sent.
func checkCharge(i int, c *window.Charge) error {
	if err := c.Limit.Validate(); err != nil {
		return fmt.Errorf("redisstore: charge %d: %w", i, err)
	}
	if c.Cost < 0 {
		return fmt.Errorf("redisstore: charge %d: negative cost %d", i, c.Cost)
	}
	return nil
}

// take is Take that also returns the instant, in Unix milliseconds, at which
// the script decided.
func (s *Store) take(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision) (bool, int64, error) {
	return s.decide(ctx, now, charges, out, false)
}

// decide is take, or with settle the runs of Settle: every charge counted
// whatever fits, one run per Key on a client that shards by key (nothing
// is refused, so nothing is given back).
func (s *Store) decide(ctx context.Context, now time.Time, charges []window.Charge, out []window.Decision, settle bool) (bool, int64, error) {
	if len(out) != len(charges) {
		return false, 0, fmt.Errorf("redisstore: %d decisions for %d charges", len(out), len(charges))
	}
	for i := range charges {
		if err := checkCharge(i, &charges[i]); err != nil {
			return false, 0, err
		}
	}
	if len(charges) == 0 {
		return true, 0, nil
	}
	nowMs := int64(-1)
	if !now.IsZero() {
		nowMs = now.UnixMilli()
		if nowMs < 0 {
			return false, 0, fmt.Errorf("redisstore: now %s is before the Unix epoch", now)
		}
		if nowMs > maxNow {
			return false, 0, fmt.Errorf("redisstore: now %s is after %s, the latest instant the store can count at", now, time.UnixMilli(maxNow).UTC())
		}
	}

	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	sc.keys, sc.fields, sc.settle = sc.keys[:0], sc.fields[:0], settle
	for i := range charges {
		c := &charges[i]
		if i > 0 && c.Key == charges[i-1].Key {
			sc.keys = append(sc.keys, sc.keys[i-1])
		} else {
			sc.buf = s.appendKey(sc.buf[:0], c.Key)
			sc.keys = append(sc.keys, string(sc.buf))
		}
		sc.fields = appendField(sc.fields, c)
	}
	if cap(sc.info) < len(charges) {
		sc.info = make([]counter, len(charges))
	}
	sc.info = sc.info[:len(charges)]

	parent := ctx
	sc.deadline = time.Time{}
	if s.timeout > 0 {
		if s.pipe != nil {
			// The pipeline keeps the deadline of every run of the
			// request, without a context made for each.
			sc.deadline = time.Now().Add(s.timeout)
		} else {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, s.timeout)
			defer cancel()
		}
	}

	if !s.split || sameKey(charges) {
		sc.order = sc.order[:0]
		for i := range charges {
			sc.order = append(sc.order, i)
		}
		return s.run(ctx, sc, nowMs, true, charges, sc.order, out)
	}
	if settle {
		return s.settleSplit(ctx, sc, nowMs, charges, out)
	}
	return s.takeSplit(ctx, parent, sc, nowMs, charges, out)
}

// takeSplit decides a request whose charges have several Keys on a client
// that shards by key: one script run per Key, with refunds on a deny.
func (s *Store) takeSplit(ctx, parent context.Context, sc *scratch, nowMs int64, charges []window.Charge, out []window.Decision) (bool, int64, error) {
	// order lists the charges grouped by Key, in order of first appearance;
	// bounds[g] is where group g starts in order.
	sc.order = sc.order[:0]
	var bounds []int
	for i := range charges {
		first := true
		for j := 0; j < i; j++ {
			if charges[j].Key == charges[i].Key {
				first = false
				break
			}
		}
		if !first {
			continue
		}
		bounds = append(bounds, len(sc.order))
		for j := i; j < len(charges); j++ {
			if charges[j].Key == charges[i].Key {
				sc.order = append(sc.order, j)
			}
		}
	}
	bounds = append(bounds, len(sc.order))
	group := func(g int) []int { return sc.order[bounds[g]:bounds[g+1]] }

	for g := 0; g+1 < len(bounds); g++ {
		all, ms, err := s.run(ctx, sc, nowMs, true, charges, group(g), out)
		if err != nil {
			s.refund(parent, sc, nowMs, charges, sc.order[:bounds[g]])
			return false, 0, err
		}
		if g == 0 {
			// Decide every later group at the same instant.
			nowMs = ms
		}
		if all {
			continue
		}
		// Denied: give back what earlier groups counted, describe them as
		// if nothing had been counted, and decide the rest without writing.
		charged := sc.order[:bounds[g]]
		s.refund(parent, sc, nowMs, charges, charged)
		for _, i := range charged {
			out[i] = describe(&charges[i], &sc.info[i], false, true)
		}
		for h := g + 1; h+1 < len(bounds); h++ {
			if _, _, err := s.run(ctx, sc, nowMs, false, charges, group(h), out); err != nil {
				return false, 0, err
			}
		}
		return false, nowMs, nil
	}
	return true, nowMs, nil
}

// run runs the script for the charges listed in idx, all in one slot, and
// fills their decisions and what the script read of their counters in
// sc.info. It reports whether all of them fit and the instant of the
// decision. nowMs is the instant to decide at, in Unix ms, or -1 for the
// server's clock; charge is false for a dry run.
func (s *Store) run(ctx context.Context, sc *scratch, nowMs int64, charge bool, charges []window.Charge, idx []int, out []window.Decision) (bool, int64, error) {
	mode := modeOf(charge, sc.settle)
	req := appendRequestMode(sc.req[:0], nowMs, mode)
	for _, i := range idx {
		req = appendChargeMode(req, sc.field(i), &charges[i], nowMs, mode)
	}
	sc.req = req
	return s.send(ctx, sc, req, charge, charges, idx, out)
}

// send runs the script with the request argument req (see appendRequest)
// for the charges listed in idx, and returns what run returns.
func (s *Store) send(ctx context.Context, sc *scratch, req []byte, charge bool, charges []window.Charge, idx []int, out []window.Decision) (bool, int64, error) {
	keys := sc.run[:0]
	for _, i := range idx {
		keys = append(keys, sc.keys[i])
	}
	sc.run = keys
	var v any
	var err error
	if s.pipe != nil {
		// The pipeline copies the bytes sc.sent points to before RunBy
		// returns; a pointer costs no allocation to pass as an any.
		sc.sent = req
		args := append(sc.args[:0], &sc.sent)
		sc.args = args
		v, err = s.pipe.RunBy(ctx, sc.deadline, script, keys, args...)
		sc.sent = nil
	} else {
		// A string: the run may outlive Take, on a goroutine of its own.
		args := append(sc.args[:0], string(req))
		sc.args = args
		v, err = s.eval(ctx, script, keys, args)
	}
	clear(sc.run)
	clear(sc.args)
	if err != nil {
		return false, 0, fmt.Errorf("redisstore: run script: %w", err)
	}
	raw, ok := v.(string)
	if !ok || len(raw)%8 != 0 {
		return false, 0, fmt.Errorf("redisstore: script returned %T of %d bytes, want a string of 8-byte integers", v, len(raw))
	}
	sc.ints = sc.ints[:0]
	for k := 0; k < len(raw); k += 8 {
		sc.ints = append(sc.ints, le64(raw[k:k+8]))
	}
	return parseReplyMode(sc.ints, modeOf(charge, sc.settle), charges, idx, out, sc.info)
}

// The modes of a run, as decide.lua reads them.
const (
	modeDry    = 0 // decide, write nothing
	modeCharge = 1 // charge if every charge fits
	modeSettle = 2 // charge every charge, whatever fits
)

// modeOf is the mode of a run that charges (or not) for a Settle (or not).
func modeOf(charge, settle bool) byte {
	switch {
	case !charge:
		return modeDry
	case settle:
		return modeSettle
	}
	return modeCharge
}

// appendRequest appends to b the start of a request's argument to the
// script (see decide.lua): the instant to decide at (nowMs, or -1 for the
// server's clock) and whether to charge. appendCharge appends each charge.
func appendRequest(b []byte, nowMs int64, charge bool) []byte {
	return appendRequestMode(b, nowMs, modeOf(charge, false))
}

// appendRequestMode is appendRequest for a run of mode modeDry,
// modeCharge or modeSettle.
func appendRequestMode(b []byte, nowMs int64, mode byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(nowMs))
	return append(b, mode)
}

// appendCharge appends to b the part of a request's argument that
// describes charge c, whose counter is field (see decide.lua). nowMs is
// the instant to decide at, in Unix ms, or -1 for the server's clock.
func appendCharge(b []byte, field []byte, c *window.Charge, nowMs int64) []byte {
	return appendChargeMode(b, field, c, nowMs, modeCharge)
}

// appendChargeMode is appendCharge for a run of mode mode: a settle's cost
// is sent whole, since it is charged whatever it is.
func appendChargeMode(b []byte, field []byte, c *window.Charge, nowMs int64, mode byte) []byte {
	b = append(b, field...)
	code, b1 := packArgs(append(b, 0), c, nowMs, mode == modeSettle)
	b1[len(b)] = code
	return b1
}

// packArgs returns the code of charge c's algorithm (the character
// decide.lua and refund.lua know it by, as codeSliding and the others) and
// appends its numbers to buf, as 8-byte little-endian integers. The cost
// of a settle is sent whole, up to 2^53.
func packArgs(buf []byte, c *window.Charge, nowMs int64, settle bool) (byte, []byte) {
	l := &c.Limit
	cost := int64(c.Cost)
	if settle {
		cost = min(cost, 1<<53)
	} else if capa := int64(l.Capacity()); cost > capa {
		// Any cost above the capacity gives the same decision; this keeps
		// the script's numbers small.
		cost = capa + 1
	}
	w := l.Window.Milliseconds()
	le := binary.LittleEndian
	put := func(n ...int64) []byte {
		for _, x := range n {
			buf = le.AppendUint64(buf, uint64(x))
		}
		return buf
	}
	switch {
	case l.Algorithm == window.SlidingWindow:
		return '0', put(int64(l.Requests), w, l.Tick(), cost)
	case l.Algorithm == window.TokenBucket:
		return '3', put(int64(l.Requests), int64(l.Capacity()), w, l.Tick(), cost)
	case l.Algorithm == window.LeakyBucket:
		r, wait := l.Tick(), int64(-1)
		if l.MaxDelay > 0 {
			wait = l.MaxDelay.Milliseconds() / r
		}
		return '5', put(int64(l.Requests), int64(l.Capacity()), w, r, wait, cost)
	case l.Algorithm == window.SlidingLog:
		return '2', put(int64(l.Requests), w, cost)
	case l.Period == window.NoPeriod:
		return '1', put(int64(l.Requests), w, cost)
	}
	// The script has no time-zone database: it gets the period boundaries
	// around this instant, or around this server's clock when Redis keeps
	// time, and picks the period that contains its own.
	ref := nowMs
	if ref < 0 {
		ref = time.Now().UnixMilli()
	}
	b := l.Boundaries(ref)
	return '4', put(int64(l.Requests), cost, b[0], b[1], b[2], b[3])
}

// le64 decodes the 8-byte little-endian integer s.
func le64(s string) int64 {
	_ = s[7]
	return int64(uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56)
}

// parseReply checks the script's reply, copies what it read of each
// counter into info and describes each decision into out (window.Describe,
// or window.DescribeLog for a sliding log), with the costs counted if the
// charges were admitted and charged.
func parseReply(reply []int64, charged bool, charges []window.Charge, idx []int, out []window.Decision, info []counter) (bool, int64, error) {
	return parseReplyMode(reply, modeOf(charged, false), charges, idx, out, info)
}

// parseReplyMode is parseReply for a run of mode mode: the decisions of a
// settle describe the counters with their costs settled, whatever fit.
func parseReplyMode(reply []int64, mode byte, charges []window.Charge, idx []int, out []window.Decision, info []counter) (bool, int64, error) {
	if len(reply) != 2+fieldsPerCharge*len(idx) {
		return false, 0, fmt.Errorf("redisstore: script returned %d values for %d charges", len(reply), len(idx))
	}
	all, now := reply[0], reply[1]
	if all != 0 && all != 1 {
		return false, 0, fmt.Errorf("redisstore: script returned allowed=%d", all)
	}
	for j, i := range idx {
		f := reply[2+fieldsPerCharge*j : 2+fieldsPerCharge*(j+1)]
		c := &charges[i]
		allowed := f[0]
		if c.Limit.Algorithm == window.SlidingLog {
			sum := window.LogSummary{Count: f[1], Oldest: f[2], Newest: f[3], RetryC: f[4], Retry1: f[5]}
			at := f[6]
			if (allowed != 0 && allowed != 1) || sum.Count < 0 || sum.Oldest < 0 || sum.Newest < sum.Oldest ||
				sum.RetryC < -1 || sum.Retry1 < -1 || at < sum.Newest || at < now {
				return false, 0, fmt.Errorf("redisstore: script returned an invalid log: allowed %d, summary %+v at %d", allowed, sum, at)
			}
			info[i] = counter{sum: sum, at: at}
		} else {
			rolled := window.State{Start: f[1], Prev: f[2], Curr: f[3]}
			stored := window.State{Start: f[4], Prev: f[5], Curr: f[6]}
			exp := int64(-1)
			if a := c.Limit.Algorithm; a == window.TokenBucket || a == window.LeakyBucket {
				// The script returns the stored expiry in place of the
				// rolled tick, which is the limit's.
				exp, rolled.Prev = rolled.Prev, c.Limit.Tick()
			}
			if (allowed != 0 && allowed != 1) || rolled.Start < 0 || rolled.Prev < 0 || rolled.Curr < 0 || stored.Start < -1 || stored.Prev < 0 || stored.Curr < 0 || exp < -1 {
				return false, 0, fmt.Errorf("redisstore: script returned an invalid counter: allowed %d, state %+v, stored %+v", allowed, rolled, stored)
			}
			info[i] = counter{rolled: rolled, stored: stored, storedExp: exp, at: max(now, rolled.Start)}
		}
		if mode == modeSettle {
			out[i] = describeSettled(c, &info[i])
			continue
		}
		out[i] = describe(c, &info[i], mode == modeCharge && all == 1, allowed == 1)
	}
	return all == 1, now, nil
}

// describeSettled computes the Decision of charge c, settled, from what
// the script read of its counter, as window.SettleAll describes it: the
// counter with the cost charged whatever fit (window.Settle), as a read
// finds it. A sliding log's summary comes with Retry1 of the charged log.
func describeSettled(c *window.Charge, inf *counter) window.Decision {
	cost := int64(c.Cost)
	if c.Limit.Algorithm == window.SlidingLog {
		sum := inf.sum
		sum.Charge(inf.at, min(cost, window.MaxLogCount-sum.Count))
		return window.DescribeLog(c.Limit, sum, inf.at, cost, true)
	}
	st := inf.rolled
	window.Settle(&st, inf.at, c.Limit, cost)
	return window.Describe(st, inf.at, c.Limit, cost, true)
}

// describe computes the Decision of charge c from what the script read of
// its counter, with its cost counted if charged.
func describe(c *window.Charge, inf *counter, charged, allowed bool) window.Decision {
	cost := int64(c.Cost)
	if c.Limit.Algorithm == window.SlidingLog {
		sum := inf.sum
		if charged {
			sum.Charge(inf.at, cost)
		}
		return window.DescribeLog(c.Limit, sum, inf.at, cost, allowed)
	}
	st := inf.rolled
	if charged {
		window.Add(&st, inf.at, c.Limit, cost)
	}
	return window.Describe(st, inf.at, c.Limit, cost, allowed)
}

// intAt returns reply[k], which must be an integer.
func intAt(reply []any, k int) (int64, error) {
	n, ok := reply[k].(int64)
	if !ok {
		return 0, fmt.Errorf("redisstore: script returned %T at position %d, want an integer", reply[k], k)
	}
	return n, nil
}

// refund gives back the costs counted at nowMs for the charges listed in
// idx, which are grouped by Key. It runs even if ctx is done, with a time
// limit of its own; a failure leaves the costs counted, which only errs on
// the side of denying.
func (s *Store) refund(ctx context.Context, sc *scratch, nowMs int64, charges []window.Charge, idx []int) {
	if len(idx) == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	// One run per Key: a run may only touch one slot.
	for start := 0; start < len(idx); {
		end := start + 1
		for end < len(idx) && charges[idx[end]].Key == charges[idx[start]].Key {
			end++
		}
		var keys []string
		args := []any{nowMs}
		for _, i := range idx[start:end] {
			c, inf := &charges[i], &sc.info[i]
			if c.Cost == 0 {
				continue
			}
			keys = append(keys, sc.keys[i])
			l, cost, r, st := &c.Limit, int64(c.Cost), &inf.rolled, &inf.stored
			w := l.Window.Milliseconds()
			switch {
			case l.Algorithm == window.SlidingWindow:
				args = append(args, string(sc.field(i)), codeSliding, cost, w, r.Start, r.Prev, r.Curr, st.Start, st.Prev, st.Curr)
			case l.Algorithm == window.TokenBucket || l.Algorithm == window.LeakyBucket:
				code := codeToken
				if l.Algorithm == window.LeakyBucket {
					code = codeLeaky
				}
				args = append(args, string(sc.field(i)), code, cost, w, r.Prev,
					r.Start, r.Prev, r.Curr, st.Start, st.Prev, st.Curr, inf.storedExp)
			case l.Algorithm == window.SlidingLog:
				args = append(args, string(sc.field(i)), codeLog, cost, w, inf.at)
			case l.Period == window.NoPeriod:
				args = append(args, string(sc.field(i)), codeFixed, cost, r.Start)
			default:
				args = append(args, string(sc.field(i)), codeCalendar, cost, r.Start)
			}
		}
		if len(keys) > 0 {
			_, _ = s.eval(ctx, refundScript, keys, args)
		}
		start = end
	}
}

// sameKey reports whether every charge has the same Key.
func sameKey(charges []window.Charge) bool {
	for i := 1; i < len(charges); i++ {
		if charges[i].Key != charges[0].Key {
			return false
		}
	}
	return true
}

// appendKey appends the Redis key of the bucket that holds the counters of
// key to b.
func (s *Store) appendKey(b []byte, key string) []byte {
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(key), len(key)))
	// 3 bytes encode to 4 characters, of which the first 3 depend only on
	// the first 18 bits.
	var enc [4]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:3])
	b = append(b, s.prefix...)
	b = append(b, '{')
	b = append(b, enc[:tagLen]...)
	return append(b, '}')
}

// appendField appends the field of c's counter in its bucket to b: the
// first 12 bytes of SHA-256 over the Key, the Name and the limit's Series
// (its window in ms for a sliding window), each length-prefixed so that no
// two triples give the same input.
func appendField(b []byte, c *window.Charge) []byte {
	// The input on the stack unless the Key and Name are long: a
	// sha256.New would cost an allocation per counter.
	var arr [160]byte
	in := binary.AppendUvarint(arr[:0], uint64(len(c.Key)))
	in = append(in, c.Key...)
	in = binary.AppendUvarint(in, uint64(len(c.Name)))
	in = append(in, c.Name...)
	in = binary.AppendUvarint(in, c.Limit.Series())
	sum := sha256.Sum256(in)
	return append(b, sum[:fieldLen]...)
}
