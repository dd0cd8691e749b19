package config

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/middleware"
)

// DefaultWatchInterval is how often Watch checks a rules file when given
// no interval.
const DefaultWatchInterval = 2 * time.Second

// racyWindow is how recent a file's modification time must be for Check to
// distrust it: a file written twice within the resolution of the file
// system's clock may change without its time or size changing, so Check
// reads and hashes such a file every time.
const racyWindow = 2 * time.Second

// Reloader keeps a Limiter's rules in step with a rules file. Reload
// re-reads the file on request (on SIGHUP, say); Check and Watch re-read it
// when it changes. A file that does not load leaves the rules in force.
//
// A Reloader is safe for concurrent use; reloads are serialized.
type Reloader struct {
	lim  *middleware.Limiter
	path string
	env  Env

	// src is the Source of a Reloader made by OpenSource, nil for a file
	// Reloader; so are its options.
	src Source
	so  SourceOptions

	mu   sync.Mutex // serializes reloads; guards seen and src's state
	seen state      // the file as last read, whether it loaded or not

	// unmatched is the policy to go back to when a file drops its
	// unmatched setting.
	unmatched middleware.UnmatchedPolicy

	cfg atomic.Pointer[Document] // the Document in force

	srcState // of a Source: its status, guarded by mu
}

// state identifies a version of the file.
type state struct {
	mod     time.Time
	size    int64
	sum     [sha256.Size]byte
	trusted bool   // mod and size identify the contents (not racy)
	statErr string // the error of the last failed stat, reported once
}

// Open loads the rules file at path, builds a Limiter from it and returns a
// Reloader that keeps the Limiter's rules in step with the file. opts are
// added to the file's own options (Document.Options) and win over them; the
// file's rules are used as they are. Close the Limiter when done with it.
//
//	rl, err := config.Open("rules.yaml", env, middleware.WithStore(store))
//	...
//	go rl.Watch(ctx, 0, func(err error) { log.Printf("rules reloaded: %v", err) })
//	handler := rl.Limiter().Handler(mux)
func Open(path string, env Env, opts ...middleware.Option) (*Reloader, error) {
	cfg, err := Load(path, env)
	if err != nil {
		return nil, err
	}
	lim, err := middleware.NewRules(cfg.Rules, append(cfg.Options(), opts...)...)
	if err != nil {
		return nil, err
	}
	return NewReloader(lim, cfg, env), nil
}

// NewReloader returns a Reloader that keeps lim's rules in step with the
// file cfg was loaded from (cfg.File), where lim was built from cfg (as Load
// returned it) with middleware.NewRules. Use Open to do all three at once.
//
// env is what later versions of the file are parsed with; it should be the
// one cfg was parsed with.
//
// When cfg sets unmatched, NewReloader applies it to lim (see
// Document.Unmatched): the file's setting wins over WithUnmatched.
func NewReloader(lim *middleware.Limiter, cfg *Document, env Env) *Reloader {
	r := &Reloader{lim: lim, path: cfg.File, env: env}
	r.init(cfg)
	return r
}

// init puts cfg in force for a new Reloader.
func (r *Reloader) init(cfg *Document) {
	r.unmatched = r.lim.Unmatched()
	if cfg.UnmatchedSet {
		r.unmatched = middleware.UnmatchedAllow
		r.lim.SetUnmatched(cfg.Unmatched)
	}
	r.seen.sum = cfg.sum
	r.cfg.Store(cfg)
}

// Limiter returns the Limiter whose rules r reloads.
func (r *Reloader) Limiter() *middleware.Limiter { return r.lim }

// Document returns the Document in force: the last one loaded successfully.
func (r *Reloader) Document() *Document { return r.cfg.Load() }

// Reload reads the file and, if it loads, replaces the Limiter's rules with
// its rules (see middleware.Limiter.SetRules): requests in flight finish
// under the rules they started with, and counters of rules whose name and
// windows are unchanged carry on. If the file does not load, or changes a
// setting that takes effect only when the Limiter is built (headers),
// Reload returns the error and the rules in force stay.
//
// Reload reads the file even when it has not changed; it suits a reload on
// SIGHUP.
func (r *Reloader) Reload() error {
	if r.src != nil {
		_, _, err := r.checkSource(true)
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fi, err := os.Stat(r.path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	data, err := readFile(r.path)
	if err != nil {
		return err
	}
	return r.apply(fi, data)
}

// Check reloads the file if it changed since it was last read (by Open,
// Reload or Check), and reports whether it tried. A change is noticed by the
// file's modification time and size and, when they are recent or
// unchanged, by a hash of its contents. An error is returned once per
// version of the file: a file that did not load is not retried until it
// changes again.
//
// For a Reloader made by OpenSource, Check asks the Source for the
// document (a conditional request where the source supports one) and
// reloads it when its contents changed; an error reading the source is
// returned once until it changes or the source recovers.
func (r *Reloader) Check() (reloaded bool, err error) {
	if r.src != nil {
		tried, _, err := r.checkSource(false)
		return tried, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fi, err := os.Stat(r.path)
	if err != nil {
		// Editors that replace the file may leave it missing for a moment;
		// report the error once, and reload when it is back.
		msg := err.Error()
		if r.seen.statErr == msg {
			return false, nil
		}
		r.seen.statErr, r.seen.trusted = msg, false
		return true, fmt.Errorf("config: %w", err)
	}
	r.seen.statErr = ""
	if r.seen.trusted && fi.ModTime().Equal(r.seen.mod) && fi.Size() == r.seen.size {
		return false, nil
	}
	data, err := readFile(r.path)
	if err != nil {
		r.seen = state{mod: fi.ModTime(), size: fi.Size(), trusted: trusted(fi)}
		return true, err
	}
	if sha256.Sum256(data) == r.seen.sum {
		r.seen.mod, r.seen.size, r.seen.trusted = fi.ModTime(), fi.Size(), trusted(fi)
		return false, nil
	}
	return true, r.apply(fi, data)
}

// Watch calls Check every interval (DefaultWatchInterval if interval <= 0) until
// ctx is done. After each reload it tried, it calls onReload, if not nil,
// with Check's error: nil when the new rules are in force.
//
// For a Reloader made by OpenSource, Watch polls the Source every interval
// (SourceOptions.Interval if interval <= 0), give or take
// SourceOptions.Jitter, backs off exponentially up to
// SourceOptions.MaxBackoff while the source cannot be read, and checks at
// once when a Source that is a Notifier announces a change.
func (r *Reloader) Watch(ctx context.Context, interval time.Duration, onReload func(error)) {
	if r.src != nil {
		r.watchSource(ctx, interval, onReload)
		return
	}
	if interval <= 0 {
		interval = DefaultWatchInterval
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if tried, err := r.Check(); tried && onReload != nil {
			onReload(err)
		}
	}
}

// apply parses data, read from the file whose information is fi, and swaps
// the Limiter's rules for its rules. r.mu is held.
func (r *Reloader) apply(fi os.FileInfo, data []byte) error {
	r.seen = state{mod: fi.ModTime(), size: fi.Size(), sum: sha256.Sum256(data), trusted: trusted(fi)}
	_, err := r.applyData(data, r.path)
	return err
}

// applyData parses data, read from the source named name, and swaps the
// Limiter's rules for its rules. r.mu is held.
func (r *Reloader) applyData(data []byte, name string) (*Document, error) {
	cfg, err := Parse(data, name, r.env)
	if err != nil {
		return nil, err
	}
	if old := r.cfg.Load(); cfg.HeaderStyle != old.HeaderStyle {
		return nil, &Error{File: name, Line: cfg.headersLine, Field: "headers",
			Msg: fmt.Sprintf("changed from %s to %s, which takes a restart: rules not reloaded", old.HeaderStyle, cfg.HeaderStyle)}
	}
	if err := r.lim.SetRules(cfg.Rules); err != nil {
		return nil, fmt.Errorf("config: %s: %w", name, err)
	}
	if cfg.UnmatchedSet {
		r.lim.SetUnmatched(cfg.Unmatched)
	} else {
		r.lim.SetUnmatched(r.unmatched)
	}
	r.cfg.Store(cfg)
	return cfg, nil
}

// trusted reports whether fi's modification time is old enough for its
// time and size to identify the file's contents.
func trusted(fi os.FileInfo) bool {
	return time.Since(fi.ModTime()) > racyWindow
}

// Version identifies the contents of the loaded file: the first 12 hex
// digits of its SHA-256, as AdminHandler's Source reports it.
func (c *Document) Version() string { return hex.EncodeToString(c.sum[:6]) }

// LogReloads returns a function for Watch's onReload (and for the result
// of Reload) that logs each reload through l: at Info with the file, its
// version and the number of rules when it loaded, at Error with the
// problem when it did not (the rules in force then stay).
func (r *Reloader) LogReloads(l *slog.Logger) func(error) {
	return func(err error) {
		cfg := r.Document()
		if err != nil {
			l.Error("sluice: rules not reloaded; the rules in force stay",
				slog.String("file", cfg.File), slog.String("version", cfg.Version()), slog.Any("error", err))
			return
		}
		l.Info("sluice: rules reloaded", slog.String("file", cfg.File), slog.String("version", cfg.Version()),
			slog.Int("rules", len(cfg.Rules)))
	}
}
