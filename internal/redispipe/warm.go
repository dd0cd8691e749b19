package redispipe

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// lanesFor returns how many regular lanes a destination whose client has
// options opt runs, Config.MaxInFlight being maxInFlight, and how many
// extra lanes spreadLocked may start beside them: no more than the pool
// the lanes send through has connections for. A lane without a
// connection would wait for one in go-redis's pool with a batch it took
// from the queue: the calls that come meanwhile would leave in another
// batch rather than with it, and the batch would count as sent (see
// stampSent) while it is not. The regular lanes get at most the pool's
// size, the extra ones what the pool has beside them and a direct call.
func lanesFor(maxInFlight int, opt *redis.Options) (regular, extra int) {
	size, _ := lanePool(opt)
	if size <= 0 {
		return maxInFlight, extraLanes
	}
	regular = min(maxInFlight, size)
	return regular, min(extraLanes, max(size-regular-1, 0))
}

// lanePool returns how many connections the pool that the lanes of a
// client with options opt send through holds at most (zero if go-redis
// chooses), and whether it is the pool of the client's single commands:
// go-redis gives pipelines a pool of their own when
// Options.PipelineReadBufferSize or PipelineWriteBufferSize is set.
func lanePool(opt *redis.Options) (size int, shared bool) {
	if opt.PipelineReadBufferSize > 0 || opt.PipelineWriteBufferSize > 0 {
		return opt.PipelinePoolSize, false
	}
	size = opt.PoolSize
	if m := opt.MaxActiveConns; m > 0 && (size <= 0 || m < size) {
		size = m
	}
	return size, true
}

// warmConnsFor returns how many connections warm keeps ready for a
// destination with regular and extra lanes whose client has options opt:
// one for each lane, but no more than the pool can spare beside the
// regular lanes and a direct call, so that warming never takes a
// connection a call could be waiting for. It is zero when the lanes have
// a pool of their own, which warm cannot reach, or no pool size is known.
func warmConnsFor(regular, extra int, opt *redis.Options) int {
	size, shared := lanePool(opt)
	if !shared || size <= 0 {
		return 0
	}
	return max(min(regular+extra, size-regular-1), 0)
}

// warmEvery is how often warm runs.
const warmEvery = 10 * time.Minute

// startWarming has warm run now, in the background, and every warmEvery,
// if the destination has connections to keep ready.
func (d *dest) startWarming() {
	d.warmConns = warmConnsFor(d.inFlight, d.extra, d.client.Load().Options())
	if d.warmConns == 0 {
		return
	}
	d.warmer = time.AfterFunc(warmEvery, d.warm)
	d.p.wg.Add(1)
	go func() {
		defer d.p.wg.Done()
		d.warm()
	}()
}

// warm has the client's pool hold warmConns connections, one for each of
// the destination's lanes, extra ones included (see spreadLocked), or as
// many as the pool can spare (see warmConnsFor); and sets itself to run
// again in warmEvery. When a slow server keeps the lanes busy, an extra
// lane then finds a connection ready: a new one takes a round trip or two
// to set up (HELLO, CLIENT SETINFO), which the calls waiting for the extra
// lane would wait for on top of their own. Running again keeps those
// connections from idling past go-redis's ConnMaxIdleTime (30 minutes by
// default), after which it closes them.
//
// It takes the connections from the pool one after the other, each
// through a redis.Conn of a clone of the client (which shares its pool; a
// redis.Conn keeps the connection it gets until it is closed) with a PING,
// which dials one if the pool has no idle connection left, and gives them
// all back at the end. The pool can spare them beside the lanes and a
// direct call, none of which waits for a connection warm holds (unless
// the application's own commands fill the pool). Each is held for the PINGs after its own (a dial
// or a round trip each), not for a wait of the server's, as a command
// that blocks would hold it. One at a time, because a redis.Conn shares
// its client's options but not their lock, and connections set up at once
// through several of them race when their handshake writes the options.
// A destination that is not up is not warmed: its connections would be
// held for as long as its server takes to answer.
func (d *dest) warm() {
	if d.p.ctx.Err() != nil {
		return
	}
	defer d.warmer.Reset(warmEvery)
	d.mu.Lock()
	isUp := d.state == up
	d.mu.Unlock()
	if !isUp {
		return
	}
	c := d.client.Load()
	clone := c.WithTimeout(c.Options().ReadTimeout)
	ctx, cancel := context.WithTimeout(d.p.ctx, time.Second)
	defer cancel()
	conns := make([]*redis.Conn, d.warmConns)
	for i := range conns {
		conns[i] = clone.Conn()
		_ = conns[i].Ping(ctx).Err()
	}
	for _, cn := range conns {
		_ = cn.Close()
	}
}
