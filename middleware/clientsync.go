package middleware

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/clients"
)

// clientState holds the bans and overrides of a Limiter, and follows the
// fleet's when the store keeps them (sharedState).
type clientState struct {
	bans      clients.Bans
	overrides clients.Overrides[*override]
	// learned holds the limits learned of upstreams (learned.go), which
	// decisions look up with the overrides.
	learned learnedTable
	// shared is the store's, when it keeps them for the fleet.
	shared sharedState
	// version is the shared version last loaded, and loaded whether one
	// was.
	version atomic.Int64
	loaded  atomic.Bool
	// gen counts the changes this Limiter made to its overrides, so that
	// a reload read before one does not undo it.
	gen atomic.Int64
	// reportMu makes reports to observers one at a time, each counting
	// what is in force when it is made, so that a report that started
	// before a change cannot be told after the change's own.
	reportMu sync.Mutex
	stopOnce sync.Once
	stop     chan struct{}
	done     chan struct{}
}

// startClientSync starts following the fleet's overrides and bans when the
// store keeps them, or reporting the counts to observers that want them.
func (l *Limiter) startClientSync() {
	cs := &l.clients
	cs.bans.Max = DefaultMaxBans
	if sh, ok := l.cfg.store.(sharedState); ok {
		cs.shared = sh
	} else if !l.wantsClientState() {
		return
	} else {
		l.reportClientState() // the gauges exist from the start
	}
	cs.stop, cs.done = make(chan struct{}), make(chan struct{})
	go l.syncLoop(cs.stop, cs.done)
}

// stopClientSync stops the sync loop, if it runs.
func (l *Limiter) stopClientSync() {
	cs := &l.clients
	cs.stopOnce.Do(func() {
		if cs.stop != nil {
			close(cs.stop)
			<-cs.done
		}
	})
}

func (l *Limiter) syncLoop(stop, done chan struct{}) {
	defer close(done)
	every := l.cfg.clientSync
	if every == 0 {
		every = DefaultClientSync
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		l.syncOnce(every)
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// syncOnce reloads the fleet's overrides if they changed, forgetting the
// bans seen so far (one may have been lifted), and reports the counts.
func (l *Limiter) syncOnce(timeout time.Duration) {
	cs := &l.clients
	if sh := cs.shared; sh != nil {
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		v, err := sh.adminVersion(ctx)
		if err != nil {
			// Retried at the next interval; the store's health events
			// tell of the outage.
			return
		}
		if !cs.loaded.Load() || v != cs.version.Load() {
			if err := l.loadOverrides(ctx); err != nil {
				return // retried at the next interval
			}
			for _, k := range cs.bans.Clear() {
				if dc := l.cfg.denyCache; dc != nil {
					dc.Forget(k)
				}
			}
		}
	}
	l.reportClientState()
}

// loadOverrides replaces the overrides with the fleet's.
func (l *Limiter) loadOverrides(ctx context.Context) error {
	cs := &l.clients
	gen := cs.gen.Load()
	v, list, err := cs.shared.loadOverrides(ctx)
	if err != nil {
		return fmt.Errorf("%w: load the overrides: %w", ErrStore, err)
	}
	now := l.localNow(l.clock())
	entries := make([]*clients.Entry[*override], 0, len(list))
	for _, so := range list {
		if !so.Until.IsZero() && !now.Before(so.Until) {
			continue
		}
		limits, err := clients.DecodeLimits(so.Value)
		if err != nil {
			l.cfg.report(nil, fmt.Errorf("sluice: override of rule %q: %w", so.Rule, err))
			continue
		}
		o := Override{Rule: so.Rule, Key: so.Key, Limits: publicLimits(limits), Until: so.Until}
		entries = append(entries, &clients.Entry[*override]{ID: clients.ID{Rule: so.Rule, Key: so.Key}, Until: so.Until, V: &override{o: o}})
	}
	// If this Limiter changed an override while the fleet's were read,
	// they may not include the change: the next sync reads them again
	// (the change moved the version on).
	if !cs.overrides.Replace(entries, func() bool { return cs.gen.Load() == gen }) {
		return nil
	}
	cs.version.Store(v)
	cs.loaded.Store(true)
	return nil
}

func (l *Limiter) wantsClientState() bool { return l.cfg.obs != nil }

// reportClientState tells the observers how many overrides and bans are in
// force.
func (l *Limiter) reportClientState() {
	if !l.wantsClientState() {
		return
	}
	l.clients.reportMu.Lock()
	defer l.clients.reportMu.Unlock()
	var bans int
	if sh := l.clients.shared; sh != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, n, err := sh.bans(ctx, l.clock(), 0)
		cancel()
		if err != nil {
			return
		}
		bans = n
	} else {
		bans = len(l.clients.bans.List(l.localNow(l.clock()).UnixMilli()))
	}
	l.cfg.obs.ClientState(len(l.Overrides()), bans)
}
