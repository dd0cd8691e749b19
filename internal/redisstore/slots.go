package redisstore

import (
	"context"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/window"
)

//go:embed slots.lua
var slotsSrc string

var slotsScript = keyguard.Script(slotsSrc)

// The concurrency slots of a (Key, Name) live in a sorted set at
//
//	<prefix>{<tag>}s:<id>
//
// where tag is the Key's bucket tag (so that the set lies in the hash slot
// of the Key's counters) and id the unpadded base64url of the first 12
// bytes of SHA-256 over the length-prefixed Key and Name. Members are the
// IDs of the requests holding a slot, scored by the end of their lease;
// see slots.lua.

// slotKey returns the key of the sorted set of s's slots.
func (s *Store) slotKey(sl *window.Slot) string {
	b := s.appendKey(make([]byte, 0, len(s.prefix)+24), sl.Key)
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write(binary.AppendUvarint(n[:0], uint64(len(sl.Key))))
	io.WriteString(h, sl.Key)
	h.Write(binary.AppendUvarint(n[:0], uint64(len(sl.Name))))
	io.WriteString(h, sl.Name)
	var sum [sha256.Size]byte
	b = append(b, "s:"...)
	return string(base64.RawURLEncoding.AppendEncode(b, h.Sum(sum[:0])[:fieldLen]))
}

// nowArg is the script's now argument: "" for the server's clock.
func nowArg(now time.Time) (string, error) {
	if now.IsZero() {
		return "", nil
	}
	ms := now.UnixMilli()
	if ms < 0 {
		return "", fmt.Errorf("redisstore: now %s is before the Unix epoch", now)
	}
	return strconv.FormatInt(ms, 10), nil
}

func (s *Store) slotCall(ctx context.Context, sl *window.Slot, op string, now time.Time) ([]int64, error) {
	if sl.ID == "" {
		return nil, errors.New("redisstore: slot without an ID")
	}
	arg, err := nowArg(now)
	if err != nil {
		return nil, err
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.eval(ctx, slotsScript, []string{s.slotKey(sl)},
		[]any{op, arg, sl.ID, sl.Lease.Milliseconds(), int64(sl.Limit)})
	if err != nil {
		return nil, fmt.Errorf("redisstore: %s slot: %w", op, err)
	}
	reply, ok := v.([]any)
	if !ok || len(reply) == 0 {
		return nil, fmt.Errorf("redisstore: slots script returned %v", v)
	}
	out := make([]int64, len(reply))
	for i := range reply {
		if out[i], err = intAt(reply, i); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Acquire takes one of s.Limit slots of (s.Name, s.Key) for s.ID, leased
// until now + s.Lease (the zero now means the server's clock), if one is
// free. It reports whether it did and how many slots are held.
func (s *Store) Acquire(ctx context.Context, now time.Time, sl *window.Slot) (bool, int, error) {
	if sl.Limit < 1 {
		return false, 0, fmt.Errorf("redisstore: slot limit %d must be at least 1", sl.Limit)
	}
	if sl.Lease < time.Millisecond {
		return false, 0, fmt.Errorf("redisstore: slot lease %s must be at least 1ms", sl.Lease)
	}
	r, err := s.slotCall(ctx, sl, "acquire", now)
	if err != nil {
		return false, 0, err
	}
	if len(r) != 2 {
		return false, 0, fmt.Errorf("redisstore: slots script returned %v", r)
	}
	return r[0] == 1, int(r[1]), nil
}

// Release gives back the slot of s.ID; a slot no longer held is left
// alone.
func (s *Store) Release(ctx context.Context, sl *window.Slot) error {
	_, err := s.slotCall(ctx, sl, "release", time.Time{})
	return err
}

// Renew extends the leases of the slots still held to now + Lease; a slot
// whose lease has ended is not taken again.
func (s *Store) Renew(ctx context.Context, now time.Time, slots []*window.Slot) error {
	var errs []error
	for _, sl := range slots {
		if _, err := s.slotCall(ctx, sl, "renew", now); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
