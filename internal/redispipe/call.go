package redispipe

import (
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
	// the keys, then the arguments; for a batch script, the arguments
	// start with the batch protocol's header for one call (1, then its
	// numbers of keys and of arguments). The arguments given as []byte
	// or *[]byte are copies in own.
	args  []any
	own   []ownBytes
	nkeys int
	// nargs is the number of the caller's arguments.
	nargs int
	// slot is the hash slot of the first key, on a Cluster.
	slot int
	// dest is where the call goes, once routed.
	dest *dest
	// deadline is the caller's deadline, if it has one; timed is set when
	// it is the one given to RunBy rather than the context's.
	deadline    time.Time
	hasDeadline bool
	timed       bool
	// quiet calls are not counted in Config.OnBatch (RunQuiet).
	quiet bool
	// redirected is set once a Cluster node turned the call away: it is
	// then sent elsewhere (see redirector), and its caller waits for no
	// reply past its deadline (see overrun), which the PINGs of its first
	// destination say nothing of.
	redirected atomic.Bool
	// queued is when a timed call was queued for a lane; sent, in Unix
	// nanoseconds, when the lane that took it was about to write it (zero
	// until then). See overrun.
	queued time.Time
	sent   atomic.Int64

	// cmd is the command of the latest attempt; only the lane touches it.
	// Several calls of a batch script may share one (merged); idx is then
	// the call's place in its reply.
	cmd    *redis.Cmd
	idx    int
	merged bool

	state atomic.Uint32
	refs  atomic.Int32
	done  chan struct{}
	val   any
	err   error
}

// ownBytes is a call's copy of a []byte argument. The call sends a
// pointer to it, which go-redis writes as it writes a []byte (an
// encoding.BinaryMarshaler) and shows in hooks as text (a fmt.Stringer);
// a pointer costs no allocation to box, and the buffer serves the pooled
// call again.
type ownBytes []byte

// MarshalBinary returns the bytes, for go-redis to send.
func (b *ownBytes) MarshalBinary() ([]byte, error) { return *b, nil }

// String returns the bytes as text, for hooks that print commands.
func (b *ownBytes) String() string { return string(*b) }

const (
	pending uint32 = iota
	completed
)

var callPool = sync.Pool{New: func() any { return &call{done: make(chan struct{}, 1)} }}

// newCall returns a pending call for script with copies of keys and args,
// held by two parties, due by deadline (if not zero) or ctx's deadline,
// whichever comes first. A []byte or *[]byte argument is copied: the
// caller may reuse its buffer once Run returns, which can be before the
// call is sent.
func newCall(ctx context.Context, deadline time.Time, script *redis.Script, keys []string, args []any) *call {
	c := callPool.Get().(*call)
	c.script = infoOf(script)
	c.nkeys, c.nargs = len(keys), len(args)
	n := 0
	for _, a := range args {
		switch a.(type) {
		case []byte, *[]byte:
			n++
		}
	}
	if n > len(c.own) {
		// Grown before any pointer into it is taken.
		c.own = append(c.own, make([]ownBytes, n-len(c.own))...)
	}
	c.args = append(c.args, "evalsha", c.script.shaArg, len(keys))
	for _, k := range keys {
		// Boxed as strings, as hooks that look at a command's keys expect.
		c.args = append(c.args, k)
	}
	if c.script.batch {
		c.args = append(c.args, 1, headerOf(len(keys), len(args)))
	}
	j := 0
	for _, a := range args {
		switch v := a.(type) {
		case []byte:
			c.own[j] = append(c.own[j][:0], v...)
			a = &c.own[j]
			j++
		case *[]byte:
			c.own[j] = append(c.own[j][:0], *v...)
			a = &c.own[j]
			j++
		}
		c.args = append(c.args, a)
	}
	c.deadline, c.hasDeadline = ctx.Deadline()
	if !deadline.IsZero() && (!c.hasDeadline || deadline.Before(c.deadline)) {
		c.deadline, c.hasDeadline, c.timed = deadline, true, true
	}
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

// userArgs returns the call's script arguments, as sent for the call on
// its own (with the batch protocol's header, for a batch script).
func (c *call) userArgs() []any { return c.args[3+c.nkeys:] }

// ownArgs returns the caller's arguments.
func (c *call) ownArgs() []any { return c.args[len(c.args)-c.nargs:] }

// setCmd gives the call a command of its own.
func (c *call) setCmd(ctx context.Context) {
	c.cmd, c.idx, c.merged = redis.NewCmd(ctx, c.args...), 0, false
}

// result returns the call's reply, or its error, from its command: for a
// call merged with others, its own part of the batch script's reply.
func (c *call) result() (any, error) {
	val, err := c.cmd.Result()
	if err != nil || !c.merged {
		return val, err
	}
	return subReply(val, c.idx)
}

// subReply returns the i-th reply of the reply val of a batch script, as
// Cmd.Result would return it for a script of its own.
func subReply(val any, i int) (any, error) {
	list, ok := val.([]any)
	if !ok || i >= len(list) {
		return nil, fmt.Errorf("redispipe: a batch script's reply has no reply %d: %.100v", i+1, val)
	}
	switch v := list[i].(type) {
	case nil:
		return nil, redis.Nil
	case error:
		return nil, v
	default:
		return v, nil
	}
}

// mergeCmd gives the calls of group, all of one batch script, one command
// that runs them together. Its arguments are appended to buf, which is
// returned: the caller may reuse it once the command is done with.
func mergeCmd(ctx context.Context, group []*call, buf []any) []any {
	nk := 0
	for _, c := range group {
		nk += c.nkeys
	}
	start := len(buf)
	args := append(buf, "evalsha", group[0].script.shaArg, nk)
	for _, c := range group {
		args = append(args, c.args[3:3+c.nkeys]...)
	}
	var head []byte
	for _, c := range group {
		head = AppendHeader(head, c.nkeys, c.nargs)
	}
	args = append(args, len(group), string(head))
	for _, c := range group {
		args = append(args, c.ownArgs()...)
	}
	cmd := redis.NewCmd(ctx, args[start:len(args):len(args)]...)
	for i, c := range group {
		c.cmd, c.idx, c.merged = cmd, i, true
	}
	return args
}

// isPending reports whether nobody has completed the call yet.
func (c *call) isPending() bool { return c.state.Load() == pending }

// complete gives the call its outcome, unless it already has one.
func (c *call) complete(val any, err error) {
	if c.state.CompareAndSwap(pending, completed) {
		c.val, c.err = val, err
		c.done <- struct{}{}
	}
}

// wait waits for the call's outcome or for ctx or the call's own deadline
// (see RunBy) to end, whichever comes first, and drops the caller's
// reference.
//
// The call's own deadline bounds how long its server takes, not how long
// this process takes to read the reply: a process short of CPU may not
// have run the lane that reads the reply although the reply is in. So at
// the deadline, if the reply has most likely come (see dest.overrun), the
// call waits on, a step at a time, up to maxOverrun past the deadline. A
// server that answers, but late, gets no more than the deadline.
func (c *call) wait(ctx context.Context) (any, error) {
	var cause error
	select {
	case <-c.done:
	default:
		var expired <-chan time.Time
		var t *time.Timer
		due := c.deadline
		if c.timed {
			t = timerPool.Get().(*time.Timer)
			t.Reset(time.Until(due))
			expired = t.C
		}
	waiting:
		for {
			select {
			case <-c.done:
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-expired:
				if d := c.dest; d != nil && !c.redirected.Load() {
					if step, ok := d.overrun(c, due, time.Now()); ok {
						due = time.Now().Add(step)
						t.Reset(step)
						continue waiting
					}
				}
				cause = context.DeadlineExceeded
			}
			break
		}
		if t != nil {
			if !t.Stop() {
				// Fired: with the timers of Go before 1.23 (or
				// GODEBUG=asynctimerchan=1) its value may be waiting.
				select {
				case <-t.C:
				default:
				}
			}
			timerPool.Put(t)
		}
	}
	if cause != nil {
		if c.state.CompareAndSwap(pending, completed) {
			// Nobody will send now; whoever holds the other reference
			// sees the call is no longer pending and discards any reply.
			c.release()
			return nil, fmt.Errorf("redispipe: no reply in time: %w", cause)
		}
		<-c.done // the outcome is being delivered
	}
	val, err := c.val, c.err
	c.release()
	return val, err
}

// timerPool holds stopped timers for the deadlines of RunBy.
var timerPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// release drops one reference, and recycles the call after the last.
func (c *call) release() {
	if c.refs.Add(-1) != 0 {
		return
	}
	clear(c.args)
	c.args = c.args[:0]
	c.script, c.cmd, c.val, c.err, c.idx, c.merged, c.dest = nil, nil, nil, nil, 0, false, nil
	c.deadline, c.hasDeadline, c.timed = time.Time{}, false, false
	c.quiet, c.queued = false, time.Time{}
	c.sent.Store(0)
	c.redirected.Store(false)
	c.state.Store(pending)
	callPool.Put(c)
}

// counted returns how many calls of batch Config.OnBatch counts: those
// that are not quiet.
func counted(batch []*call) int {
	n := 0
	for _, c := range batch {
		if !c.quiet {
			n++
		}
	}
	return n
}
