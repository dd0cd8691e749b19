package hitters

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/internal/topk"
)

// Backend keeps the summaries the servers of a fleet publish, each for a
// while: the Redis store.
type Backend interface {
	// Publish stores server's payload for rule, for ttl.
	Publish(ctx context.Context, rule, server string, payload []byte, ttl time.Duration) error
	// Collect returns the payloads for rule that are younger than ttl,
	// one per server.
	Collect(ctx context.Context, rule string, ttl time.Duration) ([]Published, error)
}

// Published is one server's payload for a rule.
type Published struct {
	Server  string
	Payload []byte
	// Age is how long ago it was published.
	Age time.Duration
}

// FleetConfig configures the publishing of a Tracker's summaries.
type FleetConfig struct {
	Backend Backend
	// Server names this server among the fleet's (unique).
	Server string
	// Every is how often each rule's summaries are published, if they
	// changed (one write per rule); TTL how long a server's stay after its
	// last write (DefaultTTL if 0). Readers merge a server's summary of a
	// period only while it can hold clients of the period: for 70 s after
	// its last write for the minute, 70 min for the hour.
	Every, TTL time.Duration
	// Timeout bounds each write (Every if 0).
	Timeout time.Duration
}

// pubState is how publishing went.
type pubState struct {
	last    time.Time // the last write that succeeded
	lastErr error     // of the last round, nil if it succeeded
}

// payloadVersion is the first byte of a payload: 2 since the views carry
// how they were sampled; 1 (every event counted) is still read.
const (
	payloadVersion   = 2
	payloadUnsampled = 1
)

// DefaultTTL is how long a server's summaries are kept after its last
// write unless FleetConfig.TTL says: the hour's period and a bucket.
const DefaultTTL = 80 * time.Minute

// periodLength is how far back a period reaches: its buckets and the
// current one.
func periodLength(p Period) time.Duration {
	return time.Duration((periodBuckets+1)*periodSpan[p]) * time.Millisecond
}

func (t *Tracker) startFleet() {
	f := t.cfg.Fleet
	if f.TTL <= 0 {
		f.TTL = DefaultTTL
	}
	if f.Timeout <= 0 {
		f.Timeout = f.Every
	}
	t.done.Add(1)
	go func() {
		defer t.done.Done()
		tick := time.NewTicker(f.Every)
		defer tick.Stop()
		for {
			select {
			case <-t.stop:
				return
			case <-tick.C:
				t.Publish(context.Background())
			}
		}
	}()
}

// Publish writes the summaries of every rule whose summaries changed since
// they were last written to the backend now (the publisher does it every
// FleetConfig.Every), and returns the first error. A rule without clients
// in the last hour is not written. An idle server writes nothing: its
// last writes stand, and readers tell their age.
func (t *Tracker) Publish(ctx context.Context) error {
	f := t.cfg.Fleet
	if f == nil {
		return nil
	}
	// One publish at a time, so that an older payload is never written
	// after a newer one.
	t.pubMu.Lock()
	defer t.pubMu.Unlock()
	t.mu.Lock()
	now := t.drainLocked()
	type write struct {
		rs      *ruleState
		payload []byte
		counted uint64
	}
	writes := map[string]write{}
	for name, rs := range t.rules {
		if rs.k == 0 || rs.counted == rs.published {
			continue
		}
		var views [int(numKinds) * int(numPeriods)]topk.View
		var sampled [int(numKinds) * int(numPeriods)][2]uint64
		var hour uint64
		for kind := range numKinds {
			for p := range numPeriods {
				v := rs.windows[kind].View(now, p == Hour)
				i := int(kind)*int(numPeriods) + int(p)
				views[i] = v
				n, z := rs.sampled[kind][p].sum(now)
				sampled[i] = [2]uint64{n, max(z, 1)}
				if p == Hour {
					hour += v.N
				}
			}
		}
		if hour == 0 {
			continue
		}
		b := []byte{payloadVersion}
		for p := range numPeriods {
			b = binary.AppendUvarint(b, t.drops[p].Sum(now).AllowedUnits)
		}
		for i, v := range views {
			b = binary.AppendUvarint(b, sampled[i][0])
			b = binary.AppendUvarint(b, sampled[i][1])
			b = topk.AppendView(b, v)
		}
		writes[name] = write{rs: rs, payload: b, counted: rs.counted}
	}
	t.mu.Unlock()
	var first error
	done := map[string]write{}
	for name, w := range writes {
		c, cancel := context.WithTimeout(ctx, f.Timeout)
		err := f.Backend.Publish(c, name, f.Server, w.payload, f.TTL)
		cancel()
		if err != nil {
			if first == nil {
				first = fmt.Errorf("publish the clients of rule %q: %w", name, err)
			}
			continue
		}
		done[name] = w
	}
	t.mu.Lock()
	for name, w := range done {
		if t.rules[name] == w.rs {
			w.rs.published = w.counted
		}
	}
	if first == nil {
		t.pub.last = time.Now()
	}
	t.pub.lastErr = first
	t.mu.Unlock()
	return first
}

// PublishState reports when the summaries were last published and the
// error of the last round (nil if it succeeded); zero without a fleet.
func (t *Tracker) PublishState() (last time.Time, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.pub.last, t.pub.lastErr
}

// remote is one server's view of a rule's clients over a period, as it
// published it.
type remote struct {
	view               topk.View
	dropped            uint64
	samples, threshold uint64
}

// readPayload returns the view of kind over p in a payload, with the units
// dropped over p and how the view was sampled.
func readPayload(b []byte, kind Kind, p Period) (remote, error) {
	if len(b) == 0 || b[0] != payloadVersion && b[0] != payloadUnsampled {
		return remote{}, errors.New("unknown payload version")
	}
	sampled := b[0] == payloadVersion
	b = b[1:]
	uvarint := func() (uint64, bool) {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			return 0, false
		}
		b = b[n:]
		return v, true
	}
	var dropped [numPeriods]uint64
	for i := range dropped {
		v, ok := uvarint()
		if !ok {
			return remote{}, topk.ErrCorrupt
		}
		dropped[i] = v
	}
	want := int(kind)*int(numPeriods) + int(p)
	for i := 0; ; i++ {
		out := remote{dropped: dropped[p], threshold: 1}
		if sampled {
			n, ok1 := uvarint()
			z, ok2 := uvarint()
			if !ok1 || !ok2 {
				return remote{}, topk.ErrCorrupt
			}
			out.samples, out.threshold = n, max(z, 1)
		}
		v, rest, err := topk.ReadView(b)
		if err != nil {
			return remote{}, err
		}
		if i == want {
			out.view = v
			return out, nil
		}
		b = rest
	}
}

// Fleet is the merged view of a fleet's servers.
type Fleet struct {
	Local
	// Servers is how many servers' summaries were merged, this one
	// included, and Names their names, sorted.
	Servers int
	Names   []string
	// Lag is the age of the oldest summary merged: what the view may
	// miss of the other servers' last moments.
	Lag time.Duration
	// Skipped counts payloads that could not be read (another version).
	Skipped int
}

// Fleet returns the view of rule's clients by kind over p across the
// servers whose summaries are live in the backend, this server's own
// taken fresh. ok is false for a rule not tracked. Without a fleet it is
// Top's view.
func (t *Tracker) Fleet(ctx context.Context, rule string, kind Kind, p Period) (Fleet, bool, error) {
	local, ok := t.Top(rule, kind, p)
	if !ok {
		return Fleet{}, false, nil
	}
	out := Fleet{Local: local, Servers: 1}
	f := t.cfg.Fleet
	if f == nil {
		return out, true, nil
	}
	out.Names = []string{f.Server}
	pubs, err := f.Backend.Collect(ctx, rule, f.TTL)
	if err != nil {
		return out, true, err
	}
	views := []topk.View{local.View}
	for _, pub := range pubs {
		if pub.Server == f.Server || pub.Age > periodLength(p) {
			// This server's own is taken fresh; one older than the
			// period holds none of its clients.
			continue
		}
		r, err := readPayload(pub.Payload, kind, p)
		if err != nil {
			out.Skipped++
			continue
		}
		views = append(views, r.view)
		out.Dropped += r.dropped
		out.Samples += r.samples
		out.Threshold = max(out.Threshold, r.threshold)
		out.Servers++
		out.Names = append(out.Names, pub.Server)
		out.Lag = max(out.Lag, pub.Age)
	}
	sort.Strings(out.Names)
	out.View = topk.Merge(local.K, views...)
	return out, true, nil
}
