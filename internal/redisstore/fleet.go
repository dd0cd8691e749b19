package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice/internal/fleet"
	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/window"
)

var (
	//go:embed fleet.lua
	fleetSrc    string
	fleetScript = redispipe.NewBatchScript(keyguard.Wrap(fleetSrc))
)

// FleetID returns the bucket tag and the field of the counter of charge c,
// as Take names it.
func FleetID(c *window.Charge) fleet.ID {
	var id fleet.ID
	sum := sha256.Sum256(unsafe.Slice(unsafe.StringData(c.Key), len(c.Key)))
	var enc [4]byte
	base64.RawURLEncoding.Encode(enc[:], sum[:3])
	copy(id.Tag[:], enc[:tagLen])
	var f [fieldLen]byte
	copy(id.Field[:], appendField(f[:0], c))
	return id
}

// Fleet runs one lease or write-back call (fleet.lua) on the counter c.ID:
// the Redis side of fleet.Grant and fleet.Apply, on the counter exact mode
// decides with. deadline bounds the call on top of ctx (zero for none),
// and so does Config.Timeout unless ctx is fleet.Background.
// Calls for counters of one server made at the same moment share a round
// trip and a script run, as decisions do.
func (s *Store) Fleet(ctx context.Context, deadline time.Time, c *fleet.Call) (fleet.Reply, error) {
	key, arg, err := s.fleetRequest(c)
	if err != nil {
		return fleet.Reply{}, err
	}
	keys := []string{key}
	deadline = s.fleetDeadline(ctx, deadline)
	var v any
	if s.pipe != nil {
		v, err = s.pipe.RunBy(ctx, deadline, fleetScript, keys, arg)
	} else {
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		v, err = s.eval(ctx, fleetScript, keys, []any{arg})
	}
	return fleetReply(c, v, err)
}

// FleetAll runs calls as Fleet runs each, all queued at once, so that they
// share batches and script runs as few as the batch size allows
// (redispipe.Pipeliner.RunAll): a syncer's tick, which has many. The
// reply and error of calls[i] go to out[i] and errs[i]. The calls are
// bounded by deadline alone, not by Config.Timeout, as fleet.Background
// calls of Fleet are: no request waits for a tick, and a server slower
// than Timeout allows for decisions (slow, see package redispipe) still
// takes a tick's calls whose deadline leaves room for its round trip, so
// that the fleet modes keep syncing.
func (s *Store) FleetAll(ctx context.Context, deadline time.Time, calls []*fleet.Call, out []fleet.Reply, errs []error) {
	if s.pipe == nil {
		for i, c := range calls {
			out[i], errs[i] = s.Fleet(ctx, deadline, c)
		}
		return
	}
	runs := make([]redispipe.Call, 0, len(calls))
	idx := make([]int, 0, len(calls))
	for i, c := range calls {
		key, arg, err := s.fleetRequest(c)
		if err != nil {
			out[i], errs[i] = fleet.Reply{}, err
			continue
		}
		runs = append(runs, redispipe.Call{Keys: []string{key}, Args: []any{arg}})
		idx = append(idx, i)
	}
	s.pipe.RunAll(ctx, deadline, fleetScript, runs)
	for k, i := range idx {
		out[i], errs[i] = fleetReply(calls[i], runs[k].Val, runs[k].Err)
	}
}

// fleetDeadline is deadline, or the store's timeout from now if sooner,
// unless ctx is fleet.Background: no request waits for those calls.
func (s *Store) fleetDeadline(ctx context.Context, deadline time.Time) time.Time {
	if s.timeout > 0 && !fleet.IsBackground(ctx) {
		if d := time.Now().Add(s.timeout); deadline.IsZero() || d.Before(deadline) {
			return d
		}
	}
	return deadline
}

// fleetRequest returns the bucket and the argument of call c to fleet.lua.
func (s *Store) fleetRequest(c *fleet.Call) (key, arg string, err error) {
	l := c.Limit
	if !fleet.Supports(l.Algorithm) {
		return "", "", fmt.Errorf("redisstore: fleet: %s is decided exactly", l.Algorithm)
	}
	le := binary.LittleEndian
	b := make([]byte, 0, 128)
	b = le.AppendUint64(b, uint64(c.Now))
	if c.Lease {
		b = append(b, 'L')
	} else {
		b = append(b, 'W')
	}
	b = append(b, c.ID.Field[:]...)
	put := func(n ...int64) {
		for _, x := range n {
			b = le.AppendUint64(b, uint64(x))
		}
	}
	w := l.Window.Milliseconds()
	switch {
	case l.Algorithm == window.SlidingWindow:
		b = append(b, '0')
		put(int64(l.Requests), w, l.Tick())
	case l.Algorithm == window.TokenBucket:
		b = append(b, '3')
		put(int64(l.Requests), int64(l.Capacity()), w, l.Tick())
	case l.Period == window.NoPeriod:
		b = append(b, '1')
		put(int64(l.Requests), w)
	default:
		ref := c.Now
		if ref < 0 {
			ref = time.Now().UnixMilli()
		}
		bs := l.Boundaries(ref)
		b = append(b, '4')
		put(int64(l.Requests), bs[0], bs[1], bs[2], bs[3])
	}
	if c.Lease {
		put(c.Want, c.Give, c.From, int64(c.Holder), c.Until)
	} else {
		put(c.Delta.Start, c.Delta.Prev, c.Delta.Curr)
	}
	k := make([]byte, 0, len(s.prefix)+2+tagLen)
	k = append(append(append(append(k, s.prefix...), '{'), c.ID.Tag[:]...), '}')
	return string(k), string(b), nil
}

// fleetReply decodes fleet.lua's reply v (or error err) to call c.
func fleetReply(c *fleet.Call, v any, err error) (fleet.Reply, error) {
	if err != nil {
		return fleet.Reply{}, fmt.Errorf("redisstore: fleet script: %w", err)
	}
	raw, ok := v.(string)
	if !ok || len(raw) != 48 {
		return fleet.Reply{}, fmt.Errorf("redisstore: fleet script returned %T of %d bytes, want 48", v, len(raw))
	}
	r := fleet.Reply{Now: le64(raw), Granted: le64(raw[8:]), Servers: le64(raw[16:]),
		State: window.State{Start: le64(raw[24:]), Prev: le64(raw[32:]), Curr: le64(raw[40:])}}
	if c.Limit.Algorithm == window.FixedWindow {
		r.State.Prev = 0
	}
	return r, nil
}
