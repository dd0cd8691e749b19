package redisstore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/keyguard"
	"github.com/sluicehq/sluice/internal/learn"
)

// What the fleet learned of an upstream's limits (package internal/learn):
// one hash per budget and key, "<prefix>{<tag>}learn:<24 hex digits>" in
// the hash slot of the key's bucket (as a pause's, with "learn:"), holding
// the learned fraction's State. learn.lua reads it, or commits a cut, in
// one call.

//go:embed learn.lua
var learnSrc string

var learnScript = keyguard.Script(learnSrc)

// Learned reads, or with p commits a cut to, the learned state of the
// budget name (a rule's, or a usage limit's) for key, at now (the zero
// time means the server's clock). For a cut, the refused request was
// admitted ago before now (p.Admitted is not read), and the state lives
// ttl after it. It returns the state stored after the call, the instant
// the script ran at (Unix ms) and whether the cut applied (learn.Commit).
func (s *Store) Learned(ctx context.Context, now time.Time, name, key string, p *learn.Proposal, ago, ttl time.Duration) (st learn.State, at int64, applied bool, err error) {
	arg, err := nowArg(now)
	if err != nil {
		return learn.State{}, 0, false, err
	}
	args := []any{arg, "read"}
	if p != nil {
		if ttl < time.Millisecond {
			return learn.State{}, 0, false, fmt.Errorf("redisstore: learned state of %s kept for less than 1ms", ttl)
		}
		args = []any{arg, "cut", p.BaseAt, max(ago.Milliseconds(), 0), p.Guard, p.Level, p.Target, ttl.Milliseconds()}
	}
	ctx, cancel := s.bounded(ctx)
	defer cancel()
	v, err := s.evalQuiet(ctx, learnScript, []string{s.learnKey(name, key)}, args...)
	if err != nil {
		return learn.State{}, 0, false, fmt.Errorf("redisstore: learned state: %w", err)
	}
	r, ok := v.([]any)
	if !ok || len(r) != 6 {
		return learn.State{}, 0, false, fmt.Errorf("redisstore: learned state: reply %T", v)
	}
	var n [6]int64
	for i := range n {
		if n[i], err = intAt(r, i); err != nil {
			return learn.State{}, 0, false, fmt.Errorf("redisstore: learned state: %w", err)
		}
	}
	return learn.State{Level: n[0], Target: n[1], At: n[2], Cuts: n[3]}, n[4], n[5] == 1, nil
}

// learnKey returns the key of the learned state of name on key.
func (s *Store) learnKey(name, key string) string { return s.clientKey("learn:", name, key) }
