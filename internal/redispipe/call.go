package redispipe

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// call is one Run: a script, its keys and arguments, and, once answered,
// its reply. Calls are pooled.
//
// Two parties hold a call: the caller waiting in Run, and the destination
// that queued it (then the lane that sends it). Each drops its reference
// with release when done with it; the last one returns the call to the
// pool. Exactly one party completes a call, by winning the state change
// from pending to done: the lane with the reply, markDown with an error,
// or the caller itself when its context ends first. Only a completion by
// someone other than the caller sends on done, so done is empty whenever
// the call goes back to the pool.
type call struct {
	script *scriptInfo
	// args is the whole command: EVALSHA, the hash, the number of keys,
	// the keys, then the arguments.
	args  []any
	nkeys int
	// deadline is the caller's deadline, if it has one.
	deadline    time.Time
	hasDeadline bool

	// cmd is the command of the latest attempt; only the lane touches it.
	cmd *redis.Cmd

	state atomic.Uint32
	refs  atomic.Int32
	done  chan struct{}
	val   any
	err   error
}

const (
	pending uint32 = iota
	completed
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// newCall returns a pending call for script with copies of keys and args,
// held by two parties.
func newCall(ctx context.Context, script *redis.Script, keys []string, args []any) *call {
	c := callPool.Get().(*call)
	c.script = infoOf(script)
	c.nkeys = len(keys)
	c.args = append(c.args, "evalsha", c.script.shaArg, len(keys))
	for _, k := range keys {
		c.args = append(c.args, k)
	}
	for _, a := range args {
		if b, ok := a.([]byte); ok {
			// The caller may reuse its buffer once Run returns, which can
			// be before the call is sent.
			a = bytes.Clone(b)
		}
		c.args = append(c.args, a)
	}
	c.deadline, c.hasDeadline = ctx.Deadline()
	c.refs.Store(2)
	return c
}

// keys returns the call's keys.
func (c *call) keys() []string {
	keys := make([]string, c.nkeys)
	for i := range keys {
		keys[i] = c.args[3+i].(string)
	}
	return keys
}

// userArgs returns the call's script arguments.
func (c *call) userArgs() []any { return c.args[3+c.nkeys:] }

// isPending reports whether nobody has completed the call yet.
func (c *call) isPending() bool { return c.state.Load() == pending }

// complete gives the call its outcome, unless it already has one.
func (c *call) complete(val any, err error) {
	if c.state.CompareAndSwap(pending, completed) {
		c.val, c.err = val, err
		c.done <- struct{}{}
	}
}

// wait waits for the call's outcome or for ctx to end, whichever comes
// first, and drops the caller's reference.
func (c *call) wait(ctx context.Context) (any, error) {
	select {
	case <-c.done:
	case <-ctx.Done():
		if c.state.CompareAndSwap(pending, completed) {
			// Nobody will send now; whoever holds the other reference
			// sees the call is no longer pending and discards any reply.
			c.release()
			return nil, fmt.Errorf("redispipe: no reply in time: %w", context.Cause(ctx))
		}
		<-c.done // the outcome is being delivered
	}
	val, err := c.val, c.err
	c.release()
	return val, err
}

// release drops one reference, and recycles the call after the last.
func (c *call) release() {
	if c.refs.Add(-1) != 0 {
		return
	}
	clear(c.args)
	c.args = c.args[:0]
	c.script, c.cmd, c.val, c.err = nil, nil, nil, nil
	c.deadline, c.hasDeadline = time.Time{}, false
	c.state.Store(pending)
	callPool.Put(c)
}
