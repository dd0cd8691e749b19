// Package learn is the arithmetic by which the outbound transport
// (adapters/outbound) learns the real limit of an upstream API and keeps
// a fleet's budget under it. It does no I/O and reads no clock: every
// function takes the instant it works at.
//
// A budget's learned limit at an instant is
//
//	limit(t) = max(1, ⌊ceiling × f(t)⌋)
//
// where the ceiling is the configured limit, or the quota the upstream
// announces scaled to the limit's window less a margin for the spread
// between admission and arrival (Bound, Margin, Spread, Windows),
// whichever is lower; and f(t) in (0, 1] is the learned fraction (State),
// shared by the fleet, which only refusals lower:
//
//   - A refusal of a request admitted at least one time unit τ (Tau: the
//     limit's window, between 1 s and 1 min) after the last cut counts
//     (Commit): one admitted earlier was admitted under the budget before
//     the cut, or while the upstream's window still held what was sent
//     before it.
//   - With a quota announced, a counted refusal tells of the margin, not
//     of the limit: f falls by Back (2%), with no dip. Without one, f
//     falls to Beta × m, where m = f × (1 − s) estimates what the upstream
//     accepts (s is the share of the requests it refused lately), as the
//     AWS SDKs' adaptive retry mode (CUBIC) does.
//   - f then recovers along a cubic curve: concave up to the target
//     m × (1 − Back), which it reaches K = ∛((Target − Level)/Fast) time
//     units after the cut (K ≤ 1.7 τ), then convex, slowly (Slow: 2% more
//     after 20 τ, 10% after 34 τ), probing for more, never above 1.
//
// Convergence. Against an upstream whose real limit is a fraction r of
// the ceiling and that announces nothing, the first counted refusal
// takes f to Beta × r (m ≈ r when the share s was measured over requests
// sent at f); f is back at 0.98 r after K = ∛((0.98 − 0.7) r / 0.06) τ
// ≤ 1.7 τ, and probes above r again ∛(0.02 r / Slow) τ ≈ 20 ∛r τ after
// that (16 τ at r = ½), when it is cut again. The refusals it costs: what
// the fleet sends above r until the first counted refusal (at most a
// time unit, plus the requests in flight), then one episode per
// K + 20 ∛r τ, each of the requests in flight when it is noticed.
// TestConverge checks these times. With a quota announced, the ceiling
// is known and f stays 1: only an error of the margin costs refusals,
// each episode 2% of the budget for 20 τ.
package learn

import (
	"math"
	"time"
)

// The constants of the learned fraction, in fractions of the ceiling and
// time units τ (Tau).
const (
	// Beta is what a cut leaves of what the upstream accepted: 0.7, as
	// the AWS SDKs' adaptive retry mode.
	Beta = 0.7
	// Back is how far below the level refused the recovery aims: 2%.
	Back = 0.02
	// Fast scales the concave recovery: from Beta × m back to Target in
	// ∛((Target − Level)/Fast) τ, 1.7 τ for a cut from the whole budget.
	Fast = 0.06
	// Slow scales the convex probing past Target: 2% more after 20 τ,
	// 10% after 34 τ.
	Slow = 2.5e-6
	// Floor is the least fraction: 1% of the ceiling (and at least one
	// unit, see Limit).
	Floor = 0.01
)

// PPM is the fixed point of the stored fractions: parts per million.
const PPM = 1_000_000

// State is the learned fraction of one budget, as the fleet shares it:
// integers, so that the store keeps it exactly.
type State struct {
	// Level is the fraction just after the last cut, in PPM; 0 for a
	// budget never cut (the fraction is then 1).
	Level int64
	// Target is the fraction the recovery returns to, in PPM.
	Target int64
	// At is the instant of the last cut in Unix ms, on the store's clock;
	// 0 when never cut.
	At int64
	// Cuts counts the cuts.
	Cuts int64
}

// Tau is the time unit of the learning for a limit of window w: the
// window, between 1 s and 1 min. A refusal tells of what the upstream
// counted over its window, so the learning cannot go faster; it need not
// go slower than a minute.
func Tau(w time.Duration) time.Duration { return min(max(w, time.Second), time.Minute) }

// Fraction returns the fraction f at now (Unix ms on the store's clock)
// with time unit tau: 1 for a state never cut, else the cubic recovery
// described in the package documentation, in [Floor, 1].
func (s State) Fraction(now int64, tau time.Duration) float64 {
	if s.At == 0 {
		return 1
	}
	level, target := float64(s.Level)/PPM, float64(s.Target)/PPM
	d := max(float64(now-s.At), 0) / float64(tau.Milliseconds())
	k := 0.0
	if target > level {
		k = math.Cbrt((target - level) / Fast)
	}
	var f float64
	if d < k {
		f = target - Fast*math.Pow(k-d, 3)
	} else {
		f = target + Slow*math.Pow(d-k, 3)
	}
	return min(max(f, Floor), 1)
}

// Recovered returns how long after its cut s is back at its Target: K τ.
func (s State) Recovered(tau time.Duration) time.Duration {
	if s.At == 0 || s.Target <= s.Level {
		return 0
	}
	k := math.Cbrt(float64(s.Target-s.Level) / PPM / Fast)
	return time.Duration(k * float64(tau))
}

// Cut proposes the cut of a refusal of a request admitted at admitted,
// counted at now (Unix ms on the store's clock), to s. When the
// upstream's limit is unknown, the fraction f(now) less the share refused
// of what the fleet sent lately (in [0, 1)) is what the upstream accepts,
// m; the level falls to Beta × m, as the AWS SDKs' adaptive retry mode
// does, and the target is m × (1 − Back). When the upstream announces its
// quota (announced), the refusal tells of the margin kept below it, not
// of the limit: m is f, and the level is the target, 2% lower, with no
// dip (a dip in one window, a budget counted by a sliding-window counter
// pays for in the next against an upstream that counts exactly). Whether the cut applies is for
// Commit to say, in the store.
func (s State) Cut(now int64, tau time.Duration, refused float64, admitted int64, announced bool) Proposal {
	f := s.Fraction(now, tau)
	m := max(f*(1-min(max(refused, 0), 0.99)), Floor)
	if announced {
		m = f
	}
	target := max(m*(1-Back), Floor)
	level := max(Beta*m, Floor)
	if announced {
		level = target
	}
	return Proposal{
		BaseAt:   s.At,
		Admitted: admitted,
		Guard:    tau.Milliseconds(),
		Level:    ppm(level),
		Target:   ppm(target),
	}
}

func ppm(f float64) int64 { return int64(math.Round(f * PPM)) }

// Proposal is a cut computed by one process from the state it last read
// (Base), for the store to apply atomically (Commit).
type Proposal struct {
	// BaseAt is the At of the state the cut was computed from.
	BaseAt int64
	// Admitted is when the refused request was admitted, in Unix ms on
	// the store's clock.
	Admitted int64
	// Guard is how long after a cut a refusal is still taken for the
	// cut's own (τ), in ms.
	Guard int64
	// Level and Target are the cut's, in PPM.
	Level, Target int64
}

// Commit applies p to the stored state at now and reports whether it
// did: when the stored state is still the one p was computed from (no
// other process cut since) and the refused request was admitted at least
// Guard after that state's cut. Otherwise the stored state stands: the
// refusal is the previous cut's own, or another process counted one
// already. It is the twin of the store's script (redisstore's learn.lua).
func Commit(stored State, p Proposal, now int64) (State, bool) {
	if stored.At != p.BaseAt {
		return stored, false
	}
	if stored.At != 0 && p.Admitted < stored.At+p.Guard {
		return stored, false
	}
	return State{Level: p.Level, Target: p.Target, At: now, Cuts: stored.Cuts + 1}, true
}

// Limit is the learned limit of a ceiling at fraction f: ⌊ceiling × f⌋,
// at least 1.
func Limit(ceiling int64, f float64) int64 {
	return max(int64(math.Floor(float64(ceiling)*f)), 1)
}
