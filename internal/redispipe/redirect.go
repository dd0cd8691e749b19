package redispipe

import (
	"context"
	"sync"
	"time"
)

// redirector sends again, through the ClusterClient, the calls that a
// Cluster node answered with MOVED, ASK, TRYAGAIN, CLUSTERDOWN or
// READONLY. It runs one goroutine, started on first use, so that a lane is
// free as soon as its node has answered: the redirected calls may take
// longer (go-redis follows the redirection and backs off before trying
// again after TRYAGAIN or CLUSTERDOWN), and that time says nothing about
// the health of the node that turned them away.
type redirector struct {
	p       *Pipeliner
	mu      sync.Mutex
	cond    sync.Cond
	queue   []*call
	running bool
	closed  bool
}

// add queues calls, which the caller keeps its references to.
func (r *redirector) add(calls []*call) {
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
		r.queue = append(r.queue, c)
	}
	if !r.running {
		r.running = true
		r.p.wg.Add(1)
		go r.run()
	}
	r.mu.Unlock()
	r.cond.Signal()
}

// close fails the queued calls and stops the goroutine.
func (r *redirector) close() {
	r.mu.Lock()
	r.closed = true
	queued := r.queue
	r.queue = nil
	r.mu.Unlock()
	r.cond.Broadcast()
	for _, c := range queued {
		c.complete(nil, ErrClosed)
		c.release()
	}
}

func (r *redirector) run() {
	defer r.p.wg.Done()
	var batch []*call
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closed {
			r.cond.Wait()
		}
		if r.closed {
			r.mu.Unlock()
			return
		}
		batch, r.queue = r.queue, batch[:0]
		r.mu.Unlock()
		r.send(batch)
		for i, c := range batch {
			c.release()
			batch[i] = nil
		}
	}
}

// send has the client reload its slot map, then sends the pending calls of
// batch as EVAL (the node now serving a slot may not have the script
// cached) through the ClusterClient, which follows MOVED and ASK replies.
func (r *redirector) send(batch []*call) {
	cc := r.p.cluster
	cc.ReloadState(r.p.ctx)
	ctx := r.p.ctx
	var latest time.Time
	all := true
	pipe := cc.Pipeline()
	n := 0
	for _, c := range batch {
		if !c.isPending() {
			continue
		}
		c.cmd, c.idx, c.merged = pipe.Eval(ctx, c.script.src, c.keys(), c.userArgs()...), 0, false
		n++
		if !c.hasDeadline {
			all = false
		} else if c.deadline.After(latest) {
			latest = c.deadline
		}
	}
	if n == 0 {
		return
	}
	if all {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	_, _ = pipe.Exec(ctx)
	for _, c := range batch {
		if c.isPending() {
			c.complete(c.result())
		}
	}
}
