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
	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/window"
)

var (
	//go:embed fleet.lua
	fleetSrc    string
	fleetScript = redispipe.NewBatchScript(fleetSrc)
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
// decides with. deadline bounds the call on top of ctx (zero for none).
// Calls for counters of one server made at the same moment share a round
// trip and a script run, as decisions do.
func (s *Store) Fleet(ctx context.Context, deadline time.Time, c *fleet.Call) (fleet.Reply, error) {
	l := c.Limit
	if !fleet.Supports(l.Algorithm) {
		return fleet.Reply{}, fmt.Errorf("redisstore: fleet: %s is decided exactly", l.Algorithm)
	}
	le := binary.LittleEndian
	arg := make([]byte, 0, 128)
	arg = le.AppendUint64(arg, uint64(c.Now))
	if c.Lease {
		arg = append(arg, 'L')
	} else {
		arg = append(arg, 'W')
	}
	arg = append(arg, c.ID.Field[:]...)
	put := func(n ...int64) {
		for _, x := range n {
			arg = le.AppendUint64(arg, uint64(x))
		}
	}
	w := l.Window.Milliseconds()
	switch {
	case l.Algorithm == window.SlidingWindow:
		arg = append(arg, '0')
		put(int64(l.Requests), w, l.Tick())
	case l.Algorithm == window.TokenBucket:
		arg = append(arg, '3')
		put(int64(l.Requests), int64(l.Capacity()), w, l.Tick())
	case l.Period == window.NoPeriod:
		arg = append(arg, '1')
		put(int64(l.Requests), w)
	default:
		ref := c.Now
		if ref < 0 {
			ref = time.Now().UnixMilli()
		}
		b := l.Boundaries(ref)
		arg = append(arg, '4')
		put(int64(l.Requests), b[0], b[1], b[2], b[3])
	}
	if c.Lease {
		put(c.Want, c.Give, c.From, int64(c.Holder), c.Until)
	} else {
		put(c.Delta.Start, c.Delta.Prev, c.Delta.Curr)
	}
	key := make([]byte, 0, len(s.prefix)+2+tagLen)
	key = append(append(append(append(key, s.prefix...), '{'), c.ID.Tag[:]...), '}')
	keys := []string{string(key)}
	if s.timeout > 0 {
		if d := time.Now().Add(s.timeout); deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
	}
	var v any
	var err error
	if s.pipe != nil {
		v, err = s.pipe.RunBy(ctx, deadline, fleetScript, keys, string(arg))
	} else {
		if !deadline.IsZero() {
			var cancel context.CancelFunc
			ctx, cancel = context.WithDeadline(ctx, deadline)
			defer cancel()
		}
		v, err = s.eval(ctx, fleetScript, keys, []any{string(arg)})
	}
	if err != nil {
		return fleet.Reply{}, fmt.Errorf("redisstore: fleet script: %w", err)
	}
	raw, ok := v.(string)
	if !ok || len(raw) != 48 {
		return fleet.Reply{}, fmt.Errorf("redisstore: fleet script returned %T of %d bytes, want 48", v, len(raw))
	}
	r := fleet.Reply{Now: le64(raw), Granted: le64(raw[8:]), Servers: le64(raw[16:]),
		State: window.State{Start: le64(raw[24:]), Prev: le64(raw[32:]), Curr: le64(raw[40:])}}
	if l.Algorithm == window.FixedWindow {
		r.State.Prev = 0
	}
	return r, nil
}
