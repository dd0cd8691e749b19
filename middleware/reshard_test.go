package middleware_test

import (
	"context"
	"fmt"
	"math"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// A mode of the resharding test: a rule, its clients, and the most it may
// admit a client in one window while slots move.
type reshardMode struct {
	name    string
	clients int
	rule    middleware.Rule
	// bound is the most a client may be admitted in one window of
	// reshardWindow; paused clients, none.
	bound int
}

// reshardWindow is the window of the load's limits: fixed windows, so
// that what each window admitted can be counted.
const reshardWindow = time.Second

// reshardModes are the modes of TestReshard, one request in six each. Each
// client of exact, bans, overrides and pauses sends about 11 requests a
// second, each of lease and write-back about 33: enough for leases to grow
// their slices and for write-back to push at max_unsynced.
func reshardModes() []reshardMode {
	fixed := func(n int) []middleware.Limit { return []middleware.Limit{middleware.PerSecond(n).FixedWindow()} }
	ban := middleware.PerSecond(5).FixedWindow()
	ban.Ban = 1500 * time.Millisecond
	const wbUnsynced = 4
	return []reshardMode{
		{"exact", 30, middleware.Rule{Limits: fixed(5)}, 5},
		{"lease", 10, middleware.Rule{Limits: fixed(25), Sync: middleware.SyncLease, Lease: 8}, 25},
		// fleet.OverBound: 2 servers × max_unsynced, plus what a client's
		// 33 requests a second admit in one sync interval (100 ms).
		{"write_back", 10, middleware.Rule{Limits: fixed(25), Sync: middleware.SyncWriteBack, MaxUnsynced: wbUnsynced}, 25 + 2*wbUnsynced + 4},
		{"ban", 30, middleware.Rule{Limits: []middleware.Limit{ban}}, 5},
		// Every client has an override of 3 a second.
		{"override", 30, middleware.Rule{Limits: fixed(5)}, 3},
		// The first half of the clients are paused throughout.
		{"pause", 30, middleware.Rule{Limits: fixed(5)}, 5},
	}
}

const (
	reshardBan      = 3
	reshardOverride = 4
	reshardPause    = 5
)

// reshardAddr is the address of client j of mode m.
func reshardAddr(m, j int) string { return "10.0." + strconv.Itoa(m) + "." + strconv.Itoa(j) }

// reshardRequest returns a request for path from the client at addr.
func reshardRequest(path, addr string) keyfunc.Request {
	r := httptest.NewRequest("GET", path, nil)
	r.RemoteAddr = addr + ":1"
	return keyfunc.FromHTTP(r)
}

// isClusterRefusal reports whether err carries a Cluster node's refusal
// (a redirection, a slot in migration) or a script's complaint of a key
// it could not reach: what a move of slots may leak to a request.
func isClusterRefusal(err error) bool {
	if err == nil {
		return false
	}
	s := err.Error()
	for _, w := range []string{"MOVED", "ASK ", "TRYAGAIN", "CLUSTERDOWN", "CROSSSLOT", "non local key", "slot map"} {
		if strings.Contains(s, w) {
			return true
		}
	}
	return false
}

// failures records the store failures Observers hear, by request.
type failures struct {
	mu    sync.Mutex
	byReq map[keyfunc.Request]error
	all   []error
	// banWrites holds the addresses of the clients a ban could not be
	// written to the store for (the server that banned them keeps it).
	banWrites map[string]bool
}

func (f *failures) hooks() *middleware.Hooks {
	return &middleware.Hooks{OnStoreFailed: func(r keyfunc.Request, err error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		if r != nil {
			f.byReq[r] = err
			if strings.Contains(err.Error(), "ban a client") {
				if f.banWrites == nil {
					f.banWrites = map[string]bool{}
				}
				f.banWrites[r.RemoteAddr()] = true
			}
		}
		f.all = append(f.all, err)
	}}
}

// banWriteFailed reports whether a ban of the client at addr could not be
// written to the store.
func (f *failures) banWriteFailed(addr string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.banWrites[addr]
}

func (f *failures) of(r keyfunc.Request) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.byReq[r]
}

// TestReshard moves slots of a real Cluster of 3 masters, plus a fourth
// added under load, while two app servers (each with its own client and
// store) decide 2,000 requests a second in every mode: exact, lease,
// write-back, bans, overrides and pauses. Every slot that holds a counter,
// ban or pause of the load moves to the new master (keys two at a time),
// 32 more are rebalanced to it, and half of the load's slots move on to
// one of the first masters, each left 15 ms with its keys moved and the
// slot not yet the target's (requests then get ASK); the slot of the
// overrides moves too, while overrides are being set. Meanwhile, whatever
// the machine:
//
//   - no request or store call sees a Cluster node's refusal (MOVED, ASK,
//     TRYAGAIN, ...): the store follows them all;
//   - no client is admitted more in a window than its mode's bound (the
//     limit, or write-back's fleet.OverBound), no paused client at all,
//     and no banned client before its ban ends (but for a request whose
//     reading of the pause or ban failed);
//   - counters move with their slot: probe clients charged before the
//     moves, one per mode, with an hourly limit of 20, get only what is
//     left of it after;
//
// and, unless this process went unscheduled, or a redis-server of its own
// answered a PING late, for more than grayBusyLag (busyGate: the
// redis-servers share the cores, and a busy machine makes them late too),
// no request fails open, no store call fails and no request is held past
// heldTooLong (Timeout + 25 ms) beyond its scheduling lag, but for one in
// a thousand (strays).
//
// It logs the figures of BENCHMARKS.md ("Resharding under load").
func TestReshard(t *testing.T) {
	if testing.Short() {
		t.Skip("reshards a real Cluster under load for several seconds")
	}
	cl := redistest.Cluster(t)
	ctx := context.Background()
	prefix := cl.Prefix(t)
	modes := reshardModes()
	var rules []middleware.Rule
	for _, m := range modes {
		r := m.rule
		r.Name, r.Path, r.Key = m.name, "/"+m.name, keyfunc.RemoteIP()
		rules = append(rules, r)
	}
	// The probes: an hourly limit per mode, charged before and after.
	probeModes := []middleware.SyncMode{middleware.SyncExact, middleware.SyncLease, middleware.SyncWriteBack}
	for _, sm := range probeModes {
		rules = append(rules, middleware.Rule{Name: "probe-" + sm.String(), Path: "/probe-" + sm.String(), Key: keyfunc.RemoteIP(),
			Limits: []middleware.Limit{middleware.PerHour(20)}, Sync: sm})
	}
	fails := &failures{byReq: map[keyfunc.Request]error{}}
	// Two app servers, each with its own client and store; each has a
	// second Limiter, with pauses (which read a key per request for every
	// rule), for the requests of the pause mode.
	var lims, paused [2]*middleware.Limiter
	for i := range lims {
		store, err := middleware.NewRedisStore(cl.Client(t, &redis.ClusterOptions{PoolSize: 128}), middleware.RedisConfig{Prefix: prefix})
		if err != nil {
			t.Fatal(err)
		}
		closeStore(t, store)
		for _, lim := range []**middleware.Limiter{&lims[i], &paused[i]} {
			opts := []middleware.Option{middleware.WithStore(store), middleware.WithClientSync(50 * time.Millisecond), middleware.WithObserver(fails.hooks())}
			if lim == &paused[i] {
				opts = append(opts, middleware.WithPauses())
			}
			l, err := middleware.NewRules(rules, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			*lim = l
		}
	}

	// Overrides and pauses, in place before the load (a busy machine may
	// make a call miss the store's Timeout).
	retry := func(what string, f func() error) {
		t.Helper()
		var err error
		for range 20 {
			if err = f(); err == nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: %v", what, err)
	}
	for j := range modes[reshardOverride].clients {
		o := middleware.Override{Rule: "override", Key: "ip:" + reshardAddr(reshardOverride, j), Limits: []middleware.Limit{middleware.PerSecond(3).FixedWindow()}}
		retry("set an override", func() error { return lims[0].SetOverride(ctx, o) })
	}
	for j := range modes[reshardPause].clients / 2 {
		retry("pause", func() error {
			_, err := paused[0].Pause(ctx, reshardRequest("/pause", reshardAddr(reshardPause, j)), time.Hour) // longer than any run
			return err
		})
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(lims[1].Overrides()) < modes[reshardOverride].clients {
		if time.Now().After(deadline) {
			t.Fatalf("the second app server has %d overrides after 10 s, want %d", len(lims[1].Overrides()), modes[reshardOverride].clients)
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Every slot of the load, the probes' and the overrides'.
	slotSet := map[int]bool{redistest.KeySlot("{sluice-admin}"): true}
	for m, mode := range modes {
		for j := range mode.clients {
			slotSet[bucketSlot(reshardAddr(m, j))] = true
		}
	}
	probe := func(sm middleware.SyncMode) string { return "192.0.2." + strconv.Itoa(1+slices.Index(probeModes, sm)) }
	for _, sm := range probeModes {
		slotSet[bucketSlot(probe(sm))] = true
	}
	var slots []int
	for s := range slotSet {
		slots = append(slots, s)
	}
	sort.Ints(slots)
	charge := func(sm middleware.SyncMode, n int) (admitted int) {
		for range n {
			var res middleware.Result
			retry("probe "+sm.String(), func() error {
				var err error
				if res, err = lims[0].Decide(reshardRequest("/probe-"+sm.String(), probe(sm))); err == nil {
					err = res.StoreErr
				}
				return err
			})
			if res.Allowed {
				admitted++
			}
		}
		return admitted
	}
	for _, sm := range probeModes {
		if got := charge(sm, 10); got != 10 {
			t.Fatalf("probe %s: %d of its first 10 admitted, want 10", sm, got)
		}
	}

	before := errorStats(t, cl)
	// How late the cluster's nodes answer, which the moves slow down too
	// (MIGRATE holds its source until the target has the keys), and how
	// late a redis-server of its own answers: the machine's lag, which
	// alone may excuse a missed timing goal.
	rlag := startRedisLag(t, cl.Addrs()...)
	ctl := startRedisLag(t, redistest.Standalone(t).Addr())
	var n int64
	var nmu sync.Mutex
	servedBy := map[keyfunc.Request]int{} // the app server of each request
	l := startLoadFunc(t, loadRate, loadGoroutines, func() (*middleware.Limiter, keyfunc.Request, int) {
		nmu.Lock()
		n++
		i := int(n)
		nmu.Unlock()
		m := i % len(modes)
		j := (i / len(modes)) % modes[m].clients
		srv := i / len(modes) % 2
		lim := lims[srv]
		if m == reshardPause {
			lim = paused[srv]
		}
		r := reshardRequest("/"+modes[m].name, reshardAddr(m, j))
		nmu.Lock()
		servedBy[r] = srv
		nmu.Unlock()
		return lim, r, m<<8 | j
	})
	// Overrides set while the slot of the overrides moves: an admin call,
	// which a busy machine may make miss the store's Timeout, but which
	// must never fail for a slot on the move.
	stopAdmin := make(chan struct{})
	adminDone := make(chan []error, 1)
	go func() {
		var errs []error
		defer func() { adminDone <- errs }()
		for k := 0; ; k++ {
			select {
			case <-stopAdmin:
				return
			case <-time.After(50 * time.Millisecond):
			}
			o := middleware.Override{Rule: "exact", Key: "ip:192.0.2." + strconv.Itoa(100+k%100), Limits: []middleware.Limit{middleware.PerSecond(9)}}
			if err := lims[k%2].SetOverride(ctx, o); err != nil {
				errs = append(errs, err)
			}
		}
	}()

	time.Sleep(500 * time.Millisecond)
	start := time.Now()
	fail := func(err error) {
		t.Helper()
		close(stopAdmin)
		l.finish()
		t.Fatal(err)
	}
	added, err := cl.AddMaster(ctx)
	if err != nil {
		fail(err)
	}
	addTook := time.Since(start)
	addedAt := time.Now()
	opts := redistest.MoveOptions{Batch: 2}
	toNew, err := cl.MoveSlots(ctx, added, slots, opts)
	if err != nil {
		fail(err)
	}
	rebalanced, err := cl.Rebalance(ctx, redistest.MoveOptions{Batch: 2, Max: 32})
	if err != nil {
		fail(err)
	}
	// These slots stay 15 ms with every key moved before they are the
	// target's: the decisions that come meanwhile get ASK.
	back, err := cl.MoveSlots(ctx, cl.Nodes()[0], slots[:len(slots)/2], redistest.MoveOptions{Batch: 2, Pause: 15 * time.Millisecond})
	if err != nil {
		fail(err)
	}
	moved := time.Now()
	time.Sleep(500 * time.Millisecond)
	close(stopAdmin)
	outs := l.finish()
	adminErrs := <-adminDone
	rlag.Stop()
	ctl.Stop()
	after := errorStats(t, cl)

	// No counter reset: the probes get what their hour had left.
	for _, sm := range probeModes {
		got, want := charge(sm, 15), 10
		if sm == middleware.SyncWriteBack {
			// One server: up to max_unsynced (20/10 = 2) over.
			want = 12
		}
		if got > want || got < 10-2 {
			t.Errorf("probe %s: %d of 15 admitted after the moves, want %d (10 were counted before)", sm, got, want)
		}
	}

	// What each client was admitted in each window: a request whose
	// decision may have fallen in either of two windows (it was sent in one
	// and answered in the next) counts in neither, and allows one more in
	// both.
	type windowKey struct{ key, window int }
	admitted, straddling := map[windowKey]int{}, map[windowKey]int{}
	failedOpen, refused := 0, 0
	var lag time.Duration
	for _, o := range outs {
		lag = max(lag, o.lag)
		if o.res.Outcome == middleware.OutcomeFailedOpen {
			failedOpen++
		}
		if isClusterRefusal(o.err) || isClusterRefusal(fails.of(o.req)) {
			refused++
		}
		if !o.res.Allowed || o.err != nil || fails.of(o.req) != nil {
			continue
		}
		w0 := int(o.at.UnixNano() / int64(reshardWindow))
		w1 := int(o.at.Add(o.took).UnixNano() / int64(reshardWindow))
		if w0 == w1 {
			admitted[windowKey{o.key, w0}]++
		} else {
			straddling[windowKey{o.key, w0}]++
			straddling[windowKey{o.key, w1}]++
		}
	}
	over, worst := map[string]int{}, map[string]float64{}
	for k, got := range admitted {
		m, j := k.key>>8, k.key&0xff
		mode := modes[m]
		bound := mode.bound
		if m == reshardPause && j < mode.clients/2 {
			bound = 0
		}
		if bound > 0 {
			worst[mode.name] = math.Max(worst[mode.name], float64(got)/float64(mode.rule.Limits[0].Requests))
		}
		if got > bound+straddling[k] {
			over[mode.name]++
			if over[mode.name] == 1 {
				t.Errorf("%s: client %d admitted %d times in one window, want at most %d", mode.name, j, got, bound)
			}
		}
	}
	// A banned client is admitted by neither server before its ban ends:
	// a request sent after another was answered as banned, and answered
	// before that ban ends (the RetryAfter of that answer, less 50 ms),
	// must be refused too, by the server that answered it (its own table)
	// and by the other (which reads the ban in Redis, unless writing it
	// there failed), but for a request whose reading of the ban failed.
	type ban struct{ seen, until time.Time }
	var bans [3]map[int]ban // by server, and the fleet's (2)
	for i := range bans {
		bans[i] = map[int]ban{}
	}
	bannedAdmitted := 0
	for _, o := range sortedByTime(outs) {
		if o.key>>8 != reshardBan {
			continue
		}
		srv := servedBy[o.req]
		scopes := []int{srv}
		if !fails.banWriteFailed(o.req.RemoteAddr()) {
			scopes = append(scopes, 2)
		}
		for _, sc := range scopes {
			b := bans[sc][o.key]
			if o.res.Allowed && o.err == nil && o.at.After(b.seen) && o.at.Add(o.took).Before(b.until) && fails.of(o.req) == nil {
				bannedAdmitted++
				if bannedAdmitted <= 3 {
					t.Logf("a banned client admitted: client %d on server %d, %v after the ban was seen (on %s), %v before it ends; outcome %v, rule %s",
						o.key&0xff, srv, o.at.Sub(b.seen), map[bool]string{true: "this server", false: "the fleet"}[sc == srv], b.until.Sub(o.at.Add(o.took)), o.res.Outcome, o.res.Rule)
				}
				break
			}
		}
		if o.res.Banned && o.res.RetryAfter > 0 {
			until := o.at.Add(o.res.RetryAfter - 50*time.Millisecond)
			for _, sc := range []int{srv, 2} {
				if until.After(bans[sc][o.key].until) {
					bans[sc][o.key] = ban{seen: o.at.Add(o.took), until: until}
				}
			}
		}
	}

	redirects := map[string]int64{}
	for _, kind := range []string{"MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN", "NOSCRIPT"} {
		if d := after[kind] - before[kind]; d > 0 {
			redirects[kind] = d
		}
	}
	all := summarize(outs, start, time.Now(), nil)
	fails.mu.Lock()
	storeFailures := len(fails.all)
	for _, err := range append(fails.all, adminErrs...) {
		if isClusterRefusal(err) {
			refused++
		}
	}
	var firstFailure error
	if storeFailures > 0 {
		firstFailure = fails.all[0]
	}
	fails.mu.Unlock()
	t.Logf("resharding under load: %d requests (%.0f a second) while %d slots moved in %v (%d to the master added in %v, %d keys in %d MIGRATEs; %d rebalanced to it; %d on to a first master), the longest slot %v",
		all.total, float64(all.total)/time.Since(start).Seconds(), toNew.Slots+rebalanced.Slots+back.Slots, moved.Sub(start).Round(time.Millisecond),
		toNew.Slots, addTook.Round(time.Millisecond), toNew.Keys+back.Keys, toNew.Batches+back.Batches, rebalanced.Slots, back.Slots,
		max(toNew.Longest, rebalanced.Longest, back.Longest).Round(time.Millisecond))
	t.Logf("replies of the nodes: %v; failed open %d, store failures %d (overrides set meanwhile: %d failed), Cluster refusals seen %d, held over %v beyond lag %d (the worst %v with %v of lag; lag up to %v; the servers answered PINGs within %v); the most admitted in a window, as a share of the limit: %v; windows over their bound: %v; banned clients admitted %d",
		redirects, failedOpen, storeFailures, len(adminErrs), refused, heldTooLong, all.held, all.worst.took.Round(time.Millisecond), all.worst.lag.Round(time.Millisecond), lag.Round(time.Millisecond), rlag.Worst().Round(time.Millisecond), worst, over, bannedAdmitted)

	// Where the failures fell: a machine too busy fails requests in every
	// phase (the server of its own answers late too); the moves, in theirs
	// only.
	phases := []struct {
		name     string
		from, to time.Time
	}{{"before", time.Time{}, start}, {"adding a master", start, addedAt}, {"moving slots", addedAt, moved}, {"after", moved, time.Now()}}
	var perPhase []string
	for _, ph := range phases {
		n, bad := 0, 0
		for _, o := range outs {
			if !o.at.Before(ph.from) && o.at.Before(ph.to) {
				n++
				if o.res.Outcome == middleware.OutcomeFailedOpen {
					bad++
				}
			}
		}
		perPhase = append(perPhase, fmt.Sprintf("%s %d of %d (the nodes answered PINGs within %v, a server of its own %v)",
			ph.name, bad, n, rlag.WorstIn(ph.from, ph.to).Round(time.Millisecond), ctl.WorstIn(ph.from, ph.to).Round(time.Millisecond)))
	}
	t.Logf("failed open by phase: %s", strings.Join(perPhase, ", "))
	if refused != 0 {
		t.Errorf("%d requests or store calls saw a Cluster node's refusal, want 0", refused)
	}
	if bannedAdmitted != 0 {
		t.Errorf("%d requests of banned clients admitted, want 0", bannedAdmitted)
	}
	if redirects["MOVED"] == 0 {
		t.Errorf("the nodes' replies %v: the moves were not met (no MOVED)", redirects)
	}
	timing := busyGate(t, lag, ctl.Worst())
	if redirects["ASK"] == 0 {
		// About a dozen are expected: fewer requests on a busy machine
		// meet fewer slots half moved (TestMigratingSlot follows ASK
		// whatever the machine).
		timing("the nodes' replies %v: no decision met a slot half moved (no ASK)", redirects)
	}
	if failedOpen > strays(all.total) {
		timing("%d of %d requests failed open, want 0", failedOpen, all.total)
	}
	if storeFailures > strays(all.total) {
		timing("%d store calls failed (the first: %v), want 0", storeFailures, firstFailure)
	}
	if all.held > strays(all.total) {
		timing("%d of %d requests held more than %v beyond their lag, want none (the worst took %v with %v of lag)", all.held, all.total, heldTooLong, all.worst.took, all.worst.lag)
	}
	if failedOpen+storeFailures+all.held > 0 {
		t.Logf("first store failures: %v", firstFailures(fails, 5))
	}
}

// firstFailures returns the first n store failures f heard.
func firstFailures(f *failures, n int) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.all[:min(n, len(f.all))])
}

// errorStats sums the error replies of every node of cl by kind.
func errorStats(t *testing.T, cl *redistest.ClusterServer) map[string]int64 {
	t.Helper()
	sum := map[string]int64{}
	for _, n := range cl.Nodes() {
		c := redis.NewClient(&redis.Options{Addr: n.Addr()})
		for kind, v := range redistest.ErrorStats(t, c) {
			sum[kind] += v
		}
		_ = c.Close()
	}
	return sum
}

func sortedByTime(os []outcome) []outcome {
	s := slices.Clone(os)
	sort.Slice(s, func(i, j int) bool { return s[i].at.Before(s[j].at) })
	return s
}
