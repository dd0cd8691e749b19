package redispipe

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// How the redirector follows a Cluster node's refusals.
const (
	// maxHops bounds the MOVED and ASK replies one call follows: a slot
	// map that keeps changing under it ends it with the last refusal.
	maxHops = 5
	// minRetryWait and maxRetryWait bound the wait before a call answered
	// TRYAGAIN, CLUSTERDOWN or READONLY is sent again: minRetryWait after
	// the first such reply, doubling with each, up to maxRetryWait, each
	// drawn at random between half of that and that, so that the calls
	// of a slot being migrated do not all come back at once.
	minRetryWait = 2 * time.Millisecond
	maxRetryWait = 50 * time.Millisecond
	// retryPatience bounds the waits of a call without a deadline.
	retryPatience = time.Second
)

// redirector sends again the calls that a Cluster node answered with
// MOVED, ASK, TRYAGAIN, CLUSTERDOWN or READONLY, from a goroutine of its
// own, started on first use, so that a lane is free as soon as its node
// has answered: the redirected calls may take longer, and that time says
// nothing of the health of the node that turned them away.
//
// It follows each reply as Redis Cluster asks clients to:
//
//   - MOVED: the slot is served elsewhere for good. The call goes to the
//     node the reply names at once, and the client reloads its slot map.
//   - ASK: the slot is being migrated and the call's keys are not on the
//     node any more. The call goes to the node the reply names at once,
//     after ASKING, which has that node serve it although it does not own
//     the slot yet.
//   - TRYAGAIN: the slot is being migrated and the call's keys are split
//     between the two nodes (a script with keys of one hash tag, some of
//     which have moved, or keys that exist on neither node while the
//     importing node is asked): the call goes to the same node, ASKING or
//     not, after a wait that doubles with each such reply (see
//     minRetryWait), for as long as its deadline leaves room; the
//     migration moves the keys meanwhile.
//   - CLUSTERDOWN, READONLY: the node cannot serve the slot now (a
//     failover under way). The client reloads its slot map and the call
//     goes, after the same wait, to the master its map then names.
//
// A call whose next attempt would come after its deadline ends at once
// with the reply that turned it away, for its caller's failure policy.
// Every attempt is EVAL, not EVALSHA: the node now serving a slot may not
// have the script cached. A call that succeeds, or fails for any other
// reason, is completed with that.
type redirector struct {
	p  *Pipeliner
	mu sync.Mutex
	// queue holds the calls to send again, each not before its at.
	queue   []redirected
	running bool
	closed  bool
	// wake is signalled when calls are queued or on close.
	wake chan struct{}
	// clients are the clients of nodes that no destination has (a master
	// that serves no slot yet, asked to import one), by address; only the
	// redirector's goroutine touches the map, and it closes them once the
	// sends under way (inflight) are done.
	clients  map[string]*redis.Client
	inflight sync.WaitGroup
}

// errNoNode is the error of a redirected call for whose slot the client's
// slot map names no master.
var errNoNode = errors.New("redispipe: no master for the call's slot in the Cluster's slot map")

// redirected is a call that a node turned away, and where and when it is
// to be sent again.
type redirected struct {
	c *call
	// addr is the node to send to; "" for the master of the call's slot
	// in the client's slot map.
	addr string
	// asking sends ASKING before the call (an ASK reply).
	asking bool
	// hops counts the MOVED and ASK replies followed, waits the
	// TRYAGAIN, CLUSTERDOWN and READONLY replies waited for.
	hops, waits int
	// at is when to send it; since, when it was first turned away.
	at, since time.Time
}

// add queues calls, which the caller keeps its references to, each to be
// sent where the error reply of its latest attempt says.
func (r *redirector) add(calls []*call) {
	now := time.Now()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for _, c := range calls {
			c.complete(nil, ErrClosed)
		}
		return
	}
	for _, c := range calls {
		c.refs.Add(1)
		c.redirected.Store(true)
		e := redirected{c: c, at: now, since: now}
		if c.dest != nil {
			e.addr = c.dest.name
		}
		_, err := c.result()
		if !r.follow(&e, err, now) {
			// Nothing to follow: a reply that cannot wait.
			c.complete(nil, err)
			c.release()
			continue
		}
		r.queue = append(r.queue, e)
	}
	if !r.running && len(r.queue) > 0 {
		r.running = true
		r.wake = make(chan struct{}, 1)
		r.p.wg.Add(1)
		go r.run()
	}
	wake := r.wake
	r.mu.Unlock()
	if wake != nil {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
}

// follow sets where and when e goes next, after the error reply err at
// now, and reports whether it is to be sent again at all.
func (r *redirector) follow(e *redirected, err error, now time.Time) bool {
	if addr, ok := redis.IsMovedError(err); ok {
		r.p.cluster.ReloadState(r.p.ctx)
		e.addr, e.asking, e.at = addr, false, now
		e.hops++
		return e.hops <= maxHops
	}
	if addr, ok := redis.IsAskError(err); ok {
		e.addr, e.asking, e.at = addr, true, now
		e.hops++
		return e.hops <= maxHops
	}
	switch {
	case redis.IsTryAgainError(err):
		// The same node, ASKING or not, once the migration has moved on.
	case redis.IsClusterDownError(err), redis.IsReadOnlyError(err):
		r.reroute(e)
	default:
		return false
	}
	return r.wait(e, now)
}

// reroute sends e, next time, to the master of its slot in the client's
// slot map, which it has reloaded.
func (r *redirector) reroute(e *redirected) {
	r.p.cluster.ReloadState(r.p.ctx)
	e.addr, e.asking = "", false
}

// wait sets e to be sent again after a wait (see minRetryWait), and
// reports whether that leaves it time to be answered.
func (r *redirector) wait(e *redirected, now time.Time) bool {
	wait := min(minRetryWait<<min(e.waits, 8), maxRetryWait)
	wait = wait/2 + rand.N(wait/2+1)
	e.waits++
	e.at = now.Add(wait)
	c := e.c
	if c.hasDeadline {
		return e.at.Before(c.deadline)
	}
	return e.at.Sub(e.since) < retryPatience
}

// close fails the queued calls, stops the goroutine and closes the
// clients it made.
func (r *redirector) close() {
	r.mu.Lock()
	r.closed = true
	queued := r.queue
	r.queue = nil
	wake := r.wake
	r.mu.Unlock()
	if wake != nil {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for _, e := range queued {
		e.c.complete(nil, ErrClosed)
		e.c.release()
	}
}

func (r *redirector) run() {
	defer r.p.wg.Done()
	defer func() {
		// Once the sends under way are done, nobody uses the clients.
		r.inflight.Wait()
		for _, c := range r.clients {
			_ = c.Close()
		}
	}()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	var due, later []redirected
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		now := time.Now()
		due, later = due[:0], later[:0]
		var next time.Time
		for _, e := range r.queue {
			switch {
			case !e.c.isPending():
				// Its caller left.
				e.c.release()
			case !e.at.After(now):
				due = append(due, e)
			default:
				later = append(later, e)
				if next.IsZero() || e.at.Before(next) {
					next = e.at
				}
			}
		}
		r.queue = append(r.queue[:0], later...)
		wake := r.wake
		r.mu.Unlock()
		if len(due) > 0 {
			r.requeue(r.send(slices.Clone(due)))
			clear(due)
			continue
		}
		if next.IsZero() {
			<-wake
			continue
		}
		timer.Reset(time.Until(next))
		select {
		case <-wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// requeue queues again calls to send later, or fails them if the
// redirector is closed.
func (r *redirector) requeue(again []redirected) {
	if len(again) == 0 {
		return
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		for _, e := range again {
			e.c.complete(nil, ErrClosed)
			e.c.release()
		}
		return
	}
	r.queue = append(r.queue, again...)
	wake := r.wake
	r.mu.Unlock()
	select {
	case wake <- struct{}{}:
	default:
	}
}

// send sends the calls of batch, one pipeline per node, each from a
// goroutine of its own, so that a node slow to answer (one busy with a
// MIGRATE, say) holds up no call for another node; each goroutine
// completes and releases its calls, or queues again those that are to be
// sent again. It returns the calls that wait for a slot map to name their
// node.
func (r *redirector) send(batch []redirected) []redirected {
	type group struct {
		client  *redis.Client
		entries []int
	}
	var groups []group
	var again []redirected
	for i := range batch {
		e := &batch[i]
		client := r.clientFor(e)
		if client == nil {
			// No node for the slot in the client's map: wait for it to
			// reload, as after CLUSTERDOWN.
			r.reroute(e)
			if r.wait(e, time.Now()) {
				again = append(again, *e)
			} else {
				e.c.complete(nil, errNoNode)
				e.c.release()
			}
			continue
		}
		g := 0
		for g < len(groups) && groups[g].client != client {
			g++
		}
		if g == len(groups) {
			groups = append(groups, group{client: client})
		}
		groups[g].entries = append(groups[g].entries, i)
	}
	for _, g := range groups {
		r.inflight.Add(1)
		go func() {
			defer r.inflight.Done()
			r.sendTo(g.client, batch, g.entries)
			now := time.Now()
			var again []redirected
			for _, i := range g.entries {
				e := &batch[i]
				c := e.c
				if !c.isPending() {
					c.release()
					continue
				}
				val, err := c.result()
				if err != nil && isRedirect(err) && r.follow(e, err, now) {
					again = append(again, *e)
					continue
				}
				c.complete(val, err)
				c.release()
			}
			r.requeue(again)
		}()
	}
	return again
}

// sendTo sends the calls of batch at entries to the node of client in
// one pipeline, bounded by their latest deadline if they all have one.
func (r *redirector) sendTo(client *redis.Client, batch []redirected, entries []int) {
	ctx := r.p.ctx
	var latest time.Time
	all := true
	pipe := client.Pipeline()
	for _, i := range entries {
		e := &batch[i]
		c := e.c
		if !c.isPending() {
			continue
		}
		if e.asking {
			_ = pipe.Process(ctx, redis.NewCmd(ctx, "asking"))
		}
		c.cmd, c.idx, c.merged = evalCmd(ctx, c), 0, false
		r.p.queue(ctx, pipe, c.cmd)
		if !c.hasDeadline {
			all = false
		} else if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	if pipe.Len() == 0 {
		return
	}
	if all {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	_, _ = pipe.Exec(ctx)
}

// clientFor returns the client of the node e goes to: the client of the
// destination of that address, or one made for it, or the master of its
// slot in the client's map; nil if the map has none.
func (r *redirector) clientFor(e *redirected) *redis.Client {
	p := r.p
	if e.addr == "" {
		c, err := p.cluster.MasterForKey(p.ctx, e.c.keys()[0])
		if err != nil {
			return nil
		}
		return c
	}
	p.mu.Lock()
	d := p.byName[e.addr]
	var template *redis.Client
	if d == nil {
		for _, o := range p.byName {
			template = o.client.Load()
			break
		}
	}
	p.mu.Unlock()
	if d != nil {
		return d.client.Load()
	}
	if c := r.clients[e.addr]; c != nil {
		return c
	}
	if template == nil {
		return nil
	}
	// A node the client has no destination for: one that serves no slot
	// yet. Its client has the options of the others.
	opts := *template.Options()
	opts.Addr = e.addr
	// As go-redis makes the client of a node: what a client sets up for
	// itself from these two is not to be shared.
	co := p.cluster.Options()
	opts.MaintNotificationsConfig = nil
	if mc := co.MaintNotificationsConfig; mc != nil {
		clone := *mc
		opts.MaintNotificationsConfig = &clone
	}
	opts.PushNotificationProcessor = co.PushNotificationProcessor
	c := redis.NewClient(&opts)
	if r.clients == nil {
		r.clients = make(map[string]*redis.Client)
	}
	r.clients[e.addr] = c
	return c
}

// queue adds cmd to pipe. On a Cluster, go-redis is told not to send the
// pipeline again on its own: a node client with MaxRetries sends a whole
// pipeline again when its first reply is an error it retries (TRYAGAIN,
// CLUSTERDOWN, READONLY, LOADING, ...), running again every other call of
// the batch, which that node may have answered (on a Cluster, a batch
// holds calls of several slots, only some of which may be migrating). The
// redirector sends again what needs to be, and only that.
func (p *Pipeliner) queue(ctx context.Context, pipe redis.Pipeliner, cmd *redis.Cmd) {
	if p.kind == kindCluster {
		_ = pipe.Process(ctx, once{cmd})
		return
	}
	_ = pipe.Process(ctx, cmd)
}

// once is a command that go-redis must not send again (see queue).
type once struct{ *redis.Cmd }

// NoRetry reports that the command is not to be sent again.
func (once) NoRetry() bool { return true }

// evalCmd returns the command that runs c's script with EVAL, for a node
// that may not have it cached.
func evalCmd(ctx context.Context, c *call) *redis.Cmd {
	args := make([]any, 0, len(c.args))
	args = append(args, "eval", c.script.src, c.nkeys)
	args = append(args, c.args[3:]...)
	return redis.NewCmd(ctx, args...)
}
