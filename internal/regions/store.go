package regions

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
)

var (
	//go:embed decide.lua
	decideSrc    string
	decideScript = keyguard.Script(decideSrc)
	//go:embed merge.lua
	mergeSrc    string
	mergeScript = keyguard.Script(mergeSrc)
	//go:embed reset.lua
	resetSrc    string
	resetScript = keyguard.Script(resetSrc)
)

// ResetField is the field of a window's hash that holds the regions' sum
// at the window's last reset, taken off the sum (Store.Reset). It is
// merged like a region's field; no region may have this name.
const ResetField = "#reset"

const (
	// DefaultSyncInterval is how often a region's counts are written to
	// its peers when a limit's interval is 0.
	DefaultSyncInterval = 250 * time.Millisecond
	// DefaultHold is how long a peer's last known count is used after
	// pushes to it started failing, when Config.Hold is 0; after it, the
	// peer counts as its share.
	DefaultHold = 5 * time.Second
	// maxInflight bounds the pushes on their way to one peer.
	maxInflight = 16
	// DefaultMaxKeys bounds the counters a Store syncs when
	// Config.MaxKeys is 0.
	DefaultMaxKeys = 1 << 20
)

// Events are told what the syncer does; any may be nil. They are called
// on the syncer's goroutine and must be fast.
type Events struct {
	// Synced: a push to peer succeeded; lag is how long it took (the
	// time its counts were behind, on top of the sync interval).
	Synced func(peer string, lag time.Duration, counters int)
	// Failed: a push to peer failed.
	Failed func(peer string, err error)
	// Unreachable: peer's pushes have failed for longer than the hold
	// time (true), or succeed again (false).
	Unreachable func(peer string, down bool)
	// Dropped: a counter was not synced because MaxKeys were.
	Dropped func()
}

// Config configures a Store.
type Config struct {
	// Region names this region; it is the region's field in every
	// counter.
	Region string
	// Local is the region's own Redis (standalone, Sentinel or Cluster).
	Local redis.UniversalClient
	// Peers are the other regions' Redis, by region name.
	Peers map[string]redis.UniversalClient
	// Hold is how long a peer's last known count is used once pushes to
	// it fail; 0 means DefaultHold.
	Hold time.Duration
	// MaxKeys bounds the counters synced; 0 means DefaultMaxKeys.
	MaxKeys int
	// Timeout bounds each push; 0 means one second.
	Timeout time.Duration
	// Clock is the syncer's clock (Unix ms), which also places the windows
	// decided on the clock of the region's Redis, and from which, with
	// the offset learned from the scripts' replies, the store estimates
	// that clock to declare the windows' keys; nil means the wall clock.
	Clock  func() int64
	Events Events
}

// Charge is one request against one global limit.
type Charge struct {
	// Counter names the counter (the same in every region), without the
	// window; it is used as a Redis Cluster hash tag.
	Counter string
	Limit   int64
	// Window is the window's length in ms, Sliding whether it slides.
	Window  int64
	Sliding bool
	Cost    int64
	// Interval is the limit's sync interval; 0 means DefaultSyncInterval.
	Interval time.Duration
}

// Decision is the answer for one Charge.
type Decision struct {
	Allowed bool
	// Total is the regions' count after the request; Own the region's.
	Total, Own int64
	// Start is the start of the window decided in, and Now the instant
	// decided at (Unix ms, on the clock that decided).
	Start, Now int64
}

// live is a counter window the syncer pushes.
type live struct {
	end      int64 // after it, nobody decides from this window (ms)
	interval int64 // ms
	ttl      int64
	// due is, per peer, the instant of the next push (ms); sent what the
	// peer acknowledged.
	due  map[string]int64
	sent map[string]int64
	// marked: the window was reset here; markSent is, per peer, the
	// ResetField the peer acknowledged.
	marked   bool
	markSent map[string]int64
}

// pushed reports whether every push due before the window ended has
// left.
func (l *live) pushed() bool {
	for _, d := range l.due {
		if d < l.end {
			return false
		}
	}
	return true
}

// peerState is what the syncer knows of a peer.
type peerState struct {
	lastOK int64 // ms, local clock
	down   bool
	// failing: the last push or ping to the peer failed. Until one
	// succeeds, every tick pushes all that the peer has not acknowledged
	// (or pings it), so that the counts go through as soon as the link
	// heals, not a sync interval later.
	failing bool
	// inflight is how many pushes are on their way; lastTry is when the
	// last one began.
	inflight int
	lastTry  int64
}

// Store decides global limits on the region's own Redis and syncs the
// region's counts to its peers. It is safe for concurrent use.
type Store struct {
	cfg   Config
	names []string // peers, sorted
	n     int      // regions, this one included

	// offset is the clock of the region's Redis minus Clock (ms), as the
	// last reply of a script that read TIME showed it: the store's
	// estimate of that clock, from which it declares the windows' keys.
	offset atomic.Int64

	mu    sync.Mutex
	keys  map[string]*live
	peers map[string]*peerState
	// stale is the peers counted as their share, rebuilt by the syncer.
	stale []string

	syncMu sync.Mutex
	pushes sync.WaitGroup
	stop   chan struct{}
	done   chan struct{}
	once   sync.Once
}

// New returns a Store whose peers count as reachable from now (Unix ms).
// It starts no goroutine: call Run, or Sync on each tick.
func New(cfg Config, now int64) (*Store, error) {
	if cfg.Region == "" || cfg.Local == nil {
		return nil, errors.New("regions: Region and Local are required")
	}
	if cfg.Region == ResetField {
		return nil, fmt.Errorf("regions: Region %q is reserved", ResetField)
	}
	if cfg.Hold == 0 {
		cfg.Hold = DefaultHold
	}
	if cfg.MaxKeys <= 0 {
		cfg.MaxKeys = DefaultMaxKeys
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = func() int64 { return time.Now().UnixMilli() }
	}
	s := &Store{cfg: cfg, keys: map[string]*live{}, peers: map[string]*peerState{}, n: len(cfg.Peers) + 1}
	for name, c := range cfg.Peers {
		if name == cfg.Region || name == ResetField || c == nil {
			return nil, fmt.Errorf("regions: peer %q: a peer is another region, with a client", name)
		}
		s.names = append(s.names, name)
		s.peers[name] = &peerState{lastOK: now}
	}
	return s, nil
}

// key names a counter window: one hash slot per counter (Redis Cluster).
func key(counter string, start int64) string {
	return base(counter) + strconv.FormatInt(start, 10)
}

// base is the key of a counter's windows without the window.
func base(counter string) string { return "{" + counter + "}:" }

// ErrWindowMoved is the error of a decision or reset whose script did not
// find the hashes of the windows it needed among its KEYS twice: the
// clock of the region's Redis moved by more than a window between two
// runs one round trip apart (or the script and the Go side disagree on
// the windows' names). The store does not try a third time.
var ErrWindowMoved = errors.New("regions: the window picked by the clock of the region's Redis was not among the declared keys twice in a row (that clock moved by more than a window between two runs)")

// run runs script for counter c at now (Unix ms; negative for the clock
// of the region's Redis), with args as ARGV and as KEYS the hashes of the
// windows Declared picks around now, or around the store's estimate of
// the Redis clock. It returns the script's reply, whose element at is the
// instant the script decided at. If the script answers that it needs
// other windows (-1, now: the estimate was off by more than a window), run
// declares the windows around that answer's now and runs it once more; a
// second such answer is ErrWindowMoved. Each reply of a script that read
// TIME updates the estimate.
func (s *Store) run(ctx context.Context, script *redis.Script, now int64, c Charge, prev bool, at int, args ...any) ([]int64, error) {
	est := now
	for retried := false; ; retried = true {
		var sent int64
		if now < 0 {
			sent = s.cfg.Clock()
			if !retried {
				est = sent + s.offset.Load()
			}
		}
		v, err := script.Run(ctx, s.cfg.Local, windowKeys(c.Counter, Declared(est, c.Window, prev)), args...).Int64Slice()
		if err != nil {
			return nil, err
		}
		missed := len(v) == 2 && v[0] == -1
		i := at
		if missed {
			i = 1
		}
		if len(v) <= i {
			return nil, fmt.Errorf("regions: unexpected reply of a script: %v", v)
		}
		if now < 0 {
			// The script read TIME between the call's start and its
			// answer: the middle of the two is the best estimate.
			s.offset.Store(v[i] - (sent+s.cfg.Clock())/2)
		}
		switch {
		case !missed:
			return v, nil
		case retried:
			return nil, ErrWindowMoved
		}
		est = v[i]
	}
}

// windowKeys returns the hashes of counter's windows that start at starts
// (key), cut from one string.
func windowKeys(counter string, starts []int64) []string {
	b := base(counter)
	buf := make([]byte, 0, len(starts)*(len(b)+14))
	for _, st := range starts {
		buf = strconv.AppendInt(append(buf, b...), st, 10)
	}
	all := string(buf)
	out := make([]string, len(starts))
	var digits [20]byte
	for i, from := 0, 0; i < len(starts); i++ {
		to := from + len(b) + len(strconv.AppendInt(digits[:0], starts[i], 10))
		out[i], from = all[from:to], to
	}
	return out
}

// Decide decides c at now (Unix ms), or, when now is negative, at the
// clock of the region's Redis (TIME): the one clock of every app server
// of the region, so that app servers whose clocks are skewed agree on the
// window. The script is given the hashes of the windows around the
// store's estimate of that clock, and touches no other key: when the
// estimate is off by more than a window (an app server's first decision,
// when its clock is skewed by that much), Decide takes a second round
// trip, and returns ErrWindowMoved if that one misses too. If c is
// admitted, Decide remembers its window for the syncer.
func (s *Store) Decide(ctx context.Context, now int64, c Charge) (Decision, error) {
	return s.decide(ctx, now, c, c.Limit)
}

// Settle charges c at now, as Decide does, whatever the regions' count
// holds: a settle of usage, which cannot be refused. It may take the count
// past c.Limit (a debt, which the next decisions see: Total past Limit
// admits nothing until the window, or for a sliding window the next one,
// ends). Peers that were unreachable still count as their share of
// c.Limit.
func (s *Store) Settle(ctx context.Context, now int64, c Charge) (Decision, error) {
	return s.decide(ctx, now, c, 1<<53-1)
}

// decide runs the decide script for c, admitting it when the count leaves
// room for it under limit: c.Limit for a decision, beyond any count for a
// settle.
func (s *Store) decide(ctx context.Context, now int64, c Charge, limit int64) (Decision, error) {
	if c.Window <= 0 {
		return Decision{}, errors.New("regions: Decide: the charge has no window")
	}
	s.mu.Lock()
	stale := s.stale
	s.mu.Unlock()
	share := Share(c.Limit, s.n)
	slack := 2*s.cfg.Hold.Milliseconds() + 1000
	args := make([]any, 0, 9+len(stale))
	args = append(args, s.cfg.Region, c.Cost, limit, max(now, -1), c.Window, b2i(c.Sliding), share, slack, base(c.Counter))
	for _, p := range stale {
		args = append(args, p)
	}
	v, err := s.run(ctx, decideScript, now, c, c.Sliding, 4, args...)
	if err != nil {
		return Decision{}, err
	}
	if len(v) != 5 {
		return Decision{}, errors.New("regions: unexpected reply of the decide script")
	}
	d := Decision{Allowed: v[0] == 1, Total: v[1], Own: v[2], Start: v[3], Now: v[4]}
	if d.Allowed && len(s.names) > 0 {
		// The syncer runs on this app server's clock: the window's
		// instants are moved by the skew between it and the clock that
		// decided.
		local := now
		if now < 0 {
			local = s.cfg.Clock()
		}
		s.track(key(c.Counter, d.Start), c, d.Start, v[4], local-v[4], slack)
	}
	return d, nil
}

// Refund takes back the cost of an admitted charge (when another limit
// of the same request denied it). Peers that saw the larger count keep
// it: they count more, never less.
func (s *Store) Refund(ctx context.Context, c Charge, d Decision) error {
	return s.cfg.Local.HIncrBy(ctx, key(c.Counter, d.Start), s.cfg.Region, -c.Cost).Err()
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// track remembers counter window k, decided at now (on the clock that
// decided), for the syncer; skew is the syncer's clock minus that clock.
func (s *Store) track(k string, c Charge, start, now, skew, slack int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.liveLocked(k, c, start, now, skew, slack)
}

// liveLocked returns what the syncer knows of counter window k, which it
// starts tracking if it did not (see track), or nil if MaxKeys are.
func (s *Store) liveLocked(k string, c Charge, start, now, skew, slack int64) *live {
	if l, ok := s.keys[k]; ok {
		return l
	}
	if len(s.keys) >= s.cfg.MaxKeys {
		if s.cfg.Events.Dropped != nil {
			s.cfg.Events.Dropped()
		}
		return nil
	}
	iv := c.Interval
	if iv <= 0 {
		iv = DefaultSyncInterval
	}
	// Decisions depend on the window until it ends, and a sliding
	// window's for one window more.
	end := start + c.Window
	if c.Sliding {
		end += c.Window
	}
	ttl := end - now + slack
	end += skew
	now += skew
	l := &live{end: end, interval: iv.Milliseconds(), ttl: ttl, due: map[string]int64{}, sent: map[string]int64{}, markSent: map[string]int64{}}
	// The first push comes one interval after the first admission, and
	// before the window ends even when the interval is longer.
	first := min(now+l.interval, max(now, end-1))
	for _, p := range s.names {
		l.due[p] = first
	}
	s.keys[k] = l
	return l
}

// Reset resets c's counter (its Counter, Window and Sliding) in the
// region's own Redis at now (Unix ms; negative for the clock of the
// region's Redis): in the current window and the previous one, the sum of
// the regions' counts known here becomes the window's ResetField, which
// decisions take off the sum, and the syncer carries it to the peers at
// its next tick (within a tick plus d). The counts are never lowered, so
// that merges stay idempotent: what other regions counted that had not
// reached this region yet stays counted. Like Decide, it may take a
// second round trip when the store's estimate of the Redis clock is off
// by more than a window.
func (s *Store) Reset(ctx context.Context, now int64, c Charge) error {
	if c.Window <= 0 {
		return errors.New("regions: Reset: the charge has no window")
	}
	v, err := s.run(ctx, resetScript, now, c, true, 1, max(now, -1), c.Window, base(c.Counter))
	if err != nil {
		return err
	}
	if len(v) != 4 {
		return errors.New("regions: unexpected reply of the reset script")
	}
	if len(s.names) == 0 {
		return nil
	}
	local := now
	if now < 0 {
		local = s.cfg.Clock()
	}
	skew, slack := local-v[1], 2*s.cfg.Hold.Milliseconds()+1000
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, start := range []int64{v[0], v[0] - c.Window} {
		end := start + c.Window
		if c.Sliding {
			end += c.Window
		}
		if v[2+i] == 0 || end <= v[1] {
			continue // nothing to reset, or nobody decides from it any more
		}
		if l := s.liveLocked(key(c.Counter, start), c, start, v[1], skew, slack); l != nil {
			l.marked = true
			for _, p := range s.names {
				l.due[p] = local // at the next tick
			}
		}
	}
	return nil
}

// Sync runs one tick of the syncer at now (Unix ms) and waits for its
// pushes: it reads the region's own count of each counter window that is
// due, and writes it to every peer that has not acknowledged that count
// yet, all peers at once, one pipeline per peer. It returns the first
// error.
func (s *Store) Sync(ctx context.Context, now int64) error {
	return s.sync(ctx, now, true)
}

// sync is Sync; without wait, it returns once the pushes are on their
// way. Pushes to a peer do not wait for the ones before them to answer
// (merges are idempotent and commutative, so their order does not
// matter): a counter reaches a far peer every sync interval, not every
// round trip, and a slow peer delays no other. At most maxInflight
// pushes per peer are on their way; beyond, the peer is skipped and its
// counters stay due.
func (s *Store) sync(ctx context.Context, now int64, wait bool) error {
	s.syncMu.Lock()
	defer s.syncMu.Unlock()
	s.mu.Lock()
	work := map[string][]string{}
	var union []string
	seen := map[string]bool{}
	for k, l := range s.keys {
		// A window nobody decides from any more is dropped once its last
		// due push has left (its first is due just before it ends, which
		// a tick may step over), or a push timeout after it ended.
		if now >= l.end && (l.pushed() || now >= l.end+s.cfg.Timeout.Milliseconds()) {
			delete(s.keys, k)
		}
	}
	for _, p := range s.names {
		ps := s.peers[p]
		if ps.inflight >= maxInflight {
			continue
		}
		var due []string
		for k, l := range s.keys {
			if now >= l.due[p] || ps.failing {
				due = append(due, k)
				l.due[p] = now + l.interval
				if !seen[k] {
					seen[k] = true
					union = append(union, k)
				}
			}
		}
		// With nothing to push, a ping every default interval tells
		// whether the peer is reachable; every tick while it fails.
		if len(due) > 0 || (ps.inflight == 0 && (ps.failing || now-ps.lastTry >= DefaultSyncInterval.Milliseconds())) {
			ps.inflight++
			ps.lastTry = now
			work[p] = due
		}
	}
	s.mu.Unlock()

	own, marks := map[string]int64{}, map[string]int64{}
	if len(union) > 0 {
		cmds := make([]*redis.SliceCmd, len(union))
		_, err := s.cfg.Local.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, k := range union {
				cmds[i] = p.HMGet(ctx, k, s.cfg.Region, ResetField)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			s.mu.Lock()
			for p := range work {
				s.peers[p].inflight--
			}
			s.mu.Unlock()
			return err
		}
		num := func(v any) int64 {
			str, _ := v.(string)
			n, _ := strconv.ParseInt(str, 10, 64)
			return n
		}
		for i, c := range cmds {
			if v := c.Val(); len(v) == 2 {
				own[union[i]], marks[union[i]] = num(v[0]), num(v[1])
			}
		}
	}

	errs := make(chan error, len(work))
	var wg sync.WaitGroup
	for p, due := range work {
		wg.Add(1)
		s.pushes.Add(1)
		go func() {
			defer s.pushes.Done()
			defer wg.Done()
			err := s.push(context.WithoutCancel(ctx), now, p, due, own, marks)
			s.mu.Lock()
			s.peers[p].inflight--
			s.stale = s.staleLocked()
			s.mu.Unlock()
			errs <- err
		}()
	}
	if !wait {
		return nil
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return errors.Join(all...)
}

// staleLocked returns the peers that count as their share.
func (s *Store) staleLocked() []string {
	var stale []string
	for _, p := range s.names {
		if s.peers[p].down {
			stale = append(stale, p)
		}
	}
	return stale
}

// push writes the counts of due not yet acknowledged by peer p, or pings
// it when there are none, and updates what is known of p.
func (s *Store) push(ctx context.Context, now int64, p string, due []string, own, marks map[string]int64) error {
	type item struct {
		k, field string
		n        int64
	}
	var items []item
	ttls := make([]int64, 0, len(due))
	s.mu.Lock()
	for _, k := range due {
		l := s.keys[k]
		if l == nil {
			continue
		}
		if own[k] > l.sent[p] {
			items = append(items, item{k, s.cfg.Region, own[k]})
			ttls = append(ttls, l.ttl)
		}
		if l.marked && marks[k] > l.markSent[p] {
			items = append(items, item{k, ResetField, marks[k]})
			ttls = append(ttls, l.ttl)
		}
	}
	s.mu.Unlock()

	cl := s.cfg.Peers[p]
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	began := time.Now()
	// The push ends at the timeout whatever the client's own timeouts
	// (a call that meets a dead connection may wait for its read timeout
	// and retries): a failed push must not hold the peer's turn.
	done := make(chan error, 1)
	go func() {
		if len(items) == 0 {
			done <- cl.Ping(ctx).Err()
			return
		}
		merge := func(pl redis.Pipeliner, sha bool) error {
			for i, it := range items {
				if sha {
					mergeScript.EvalSha(ctx, pl, []string{it.k}, it.field, it.n, ttls[i])
				} else {
					mergeScript.Run(ctx, pl, []string{it.k}, it.field, it.n, ttls[i])
				}
			}
			return nil
		}
		_, err := cl.Pipelined(ctx, func(pl redis.Pipeliner) error { return merge(pl, false) })
		if err != nil && isNoScript(err) {
			// A fresh peer: load the script, then push again.
			if err = mergeScript.Load(ctx, cl).Err(); err == nil {
				_, err = cl.Pipelined(ctx, func(pl redis.Pipeliner) error { return merge(pl, true) })
			}
		}
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		err = ctx.Err()
	}
	lag := time.Since(began)
	ev := s.cfg.Events

	s.mu.Lock()
	ps := s.peers[p]
	var flip, down bool
	if err == nil {
		for _, it := range items {
			l := s.keys[it.k]
			switch {
			case l == nil:
			case it.field == ResetField:
				l.markSent[p] = max(l.markSent[p], it.n)
			default:
				l.sent[p] = max(l.sent[p], it.n)
			}
		}
		ps.lastOK = now
		flip, down = ps.down, false
		ps.down, ps.failing = false, false
	} else {
		ps.failing = true
		if !ps.down && now-ps.lastOK > s.cfg.Hold.Milliseconds() {
			ps.down, flip, down = true, true, true
		}
	}
	s.mu.Unlock()

	if err != nil {
		if ev.Failed != nil {
			ev.Failed(p, err)
		}
	} else if ev.Synced != nil {
		ev.Synced(p, lag, len(items))
	}
	if flip && ev.Unreachable != nil {
		ev.Unreachable(p, down)
	}
	if err != nil {
		return fmt.Errorf("regions: push to %s: %w", p, err)
	}
	return nil
}

func isNoScript(err error) bool {
	return err != nil && len(err.Error()) >= 8 && err.Error()[:8] == "NOSCRIPT"
}

// Run starts the syncer: Sync every tick, with now from clock (Unix ms),
// until Close.
func (s *Store) Run(tick time.Duration, clock func() int64) {
	s.stop, s.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(s.done)
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				_ = s.sync(context.Background(), clock(), false)
			}
		}
	}()
}

// Close stops the syncer started by Run and waits for its pushes.
func (s *Store) Close() {
	s.once.Do(func() {
		if s.stop != nil {
			close(s.stop)
			<-s.done
		}
		s.pushes.Wait()
	})
}
