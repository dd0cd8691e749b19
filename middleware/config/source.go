package config

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/middleware"
)

// Source is where a Reloader made by OpenSource reads its rules document:
// a file (FileSource), an HTTP(S) URL (HTTPSource) or a key in Redis
// (RedisSource). Every document goes through Parse, whatever its source,
// and one that does not load never replaces the rules in force.
type Source interface {
	// Name names the source in errors, logs and Status, as a file name:
	// a path, a URL (without its password) or "redis:" and a key. Parse's
	// errors give it as the file, with the line and field.
	Name() string

	// Load returns the current document and the version the source
	// gives it ("" when it has none), such as an ETag. It returns
	// ErrNotModified when the source knows that the document is the one
	// it returned last (a conditional request answered 304), and another
	// error when the source cannot be read. ctx bounds the call.
	//
	// Load is never called concurrently with itself by a Reloader.
	Load(ctx context.Context) (data []byte, version string, err error)
}

// Notifier is implemented by Sources that announce changes as they
// happen, as RedisSource does through pub/sub. A Reloader's Watch checks
// the source as soon as one is announced, and keeps polling as a backstop
// for announcements lost while disconnected.
type Notifier interface {
	// Changes returns a channel that receives a value soon after each
	// change, until ctx is done. The channel is never closed.
	Changes(ctx context.Context) <-chan struct{}
}

// ErrNotModified is returned by Source.Load when the document has not
// changed since it was last returned.
var ErrNotModified = errors.New("config: rules document not modified")

// FileSource reads the rules file at Path. A Reloader made by Open reads
// files more cleverly (by modification time, then hash); FileSource is
// for OpenSource, which treats every source alike.
type FileSource struct{ Path string }

// Name returns the path.
func (s FileSource) Name() string { return s.Path }

// Load reads the file; its version is "".
func (s FileSource) Load(context.Context) ([]byte, string, error) {
	data, err := readFile(s.Path)
	return data, "", err
}

// The defaults of SourceOptions.
const (
	DefaultPollInterval = 10 * time.Second
	DefaultJitter       = 0.1
	DefaultMaxBackoff   = 5 * time.Minute
	DefaultLoadTimeout  = 10 * time.Second
)

// SourceOptions say how a Reloader made by OpenSource reads its Source.
// The zero value polls every 10 s, give or take 10%.
type SourceOptions struct {
	// Interval is how often Watch polls the source; 0 means
	// DefaultPollInterval. Watch's own interval argument, when positive,
	// wins.
	Interval time.Duration

	// Jitter is the fraction of the interval by which each wait is made
	// longer or shorter at random, so that a fleet of servers does not
	// poll in step: 0 means DefaultJitter (10%), a negative value none.
	Jitter float64

	// MaxBackoff bounds the wait between attempts while the source
	// cannot be read: the wait doubles from the interval after each
	// failure, up to MaxBackoff (DefaultMaxBackoff when 0, and never less
	// than the interval).
	MaxBackoff time.Duration

	// Timeout bounds each Load; 0 means DefaultLoadTimeout.
	Timeout time.Duration

	// CachePath, when not empty, is a file where the Reloader saves each
	// document that loads (written to a temporary file and renamed, so
	// that it is never seen half written). When the source cannot be
	// read, or holds a document that does not load, at start, OpenSource
	// starts with the saved copy instead of failing: a restart during an
	// outage of the rules service keeps the last good rules.
	CachePath string

	// OnStatus, when set, is called with the Reloader's Status after
	// every attempt to read the source, on the goroutine that made it; it
	// must not call the Reloader. Metrics use it.
	OnStatus func(Status)
}

func (o *SourceOptions) interval() time.Duration {
	if o.Interval > 0 {
		return o.Interval
	}
	return DefaultPollInterval
}

func (o *SourceOptions) timeout() time.Duration {
	if o.Timeout > 0 {
		return o.Timeout
	}
	return DefaultLoadTimeout
}

// jittered returns d made longer or shorter by up to the jitter fraction.
func (o *SourceOptions) jittered(d time.Duration) time.Duration {
	j := o.Jitter
	switch {
	case j == 0:
		j = DefaultJitter
	case j < 0:
		return d
	}
	j = min(j, 1)
	return time.Duration(float64(d) * (1 + j*(2*rand.Float64()-1)))
}

// backoff returns the wait after failures consecutive failures.
func (o *SourceOptions) backoff(interval time.Duration, failures int) time.Duration {
	limit := o.MaxBackoff
	if limit <= 0 {
		limit = DefaultMaxBackoff
	}
	limit = max(limit, interval)
	d := interval
	for i := 0; i < failures && d < limit; i++ {
		d *= 2
	}
	return min(d, limit)
}

// Status is the state of a Reloader's Source, for health checks and
// metrics: see Reloader.Status and SourceOptions.OnStatus.
type Status struct {
	// Source is the source's Name.
	Source string
	// Version is the Document.Version of the rules in force.
	Version string
	// SourceVersion is the version the source gave the last document it
	// returned (an ETag, a Redis version), loaded or not; "" if none.
	SourceVersion string
	// LoadedAt is when the rules in force were loaded: the last good
	// load.
	LoadedAt time.Time
	// CheckedAt is when the source was last read, or tried.
	CheckedAt time.Time
	// Err is why the source could not be read at the last attempt or,
	// when it could, why the document it holds does not load; nil when
	// the source's document is the one in force.
	Err error
	// Failures counts the attempts in a row that could not read the
	// source.
	Failures int
	// FromCache reports that the rules in force came from
	// SourceOptions.CachePath at start, the source being unreadable or
	// its document bad, and that no document from the source has loaded
	// since.
	FromCache bool
	// CacheErr is why the last good document could not be saved to
	// SourceOptions.CachePath, or nil.
	CacheErr error
}

// srcState is what a Reloader of a Source remembers between reads.
type srcState struct {
	status   Status
	fetchErr error // the source could not be read
	docErr   error // the document it holds does not load
	reported string

	// snapshot is the status as of the last attempt, for Status, which
	// must not wait for a read in progress.
	snapshot atomic.Pointer[Status]
}

// OpenSource reads the rules document of src, builds a Limiter from it and
// returns a Reloader that keeps the Limiter's rules in step with the
// source: Watch polls it (and listens for its announcements if it is a
// Notifier), Reload and Check read it on request. opts are added to the
// document's own options (Document.Options) and win over them. Close the
// Limiter when done with it.
//
// When the source cannot be read at start, or holds a document that does
// not load, OpenSource starts with the copy saved at so.CachePath, if
// any; otherwise it fails with an error that says both what went wrong
// and that there was no saved copy.
//
//	src := &config.HTTPSource{URL: "https://rules.internal/sluice.yaml"}
//	rl, err := config.OpenSource(ctx, src, env, config.SourceOptions{CachePath: "/var/cache/sluice/rules.yaml"})
//	...
//	go rl.Watch(ctx, 0, rl.LogReloads(logger))
func OpenSource(ctx context.Context, src Source, env Env, so SourceOptions, opts ...middleware.Option) (*Reloader, error) {
	if src == nil {
		return nil, errors.New("config: OpenSource: nil Source")
	}
	if err := env.check(); err != nil {
		return nil, err
	}
	r := &Reloader{path: src.Name(), env: env, src: src, so: so}
	lctx, cancel := context.WithTimeout(ctx, so.timeout())
	data, version, err := src.Load(lctx)
	cancel()
	var cfg *Document
	var seen [sha256.Size]byte
	if err != nil {
		err = sourceError(src, err)
		r.fetchErr = err
	} else {
		seen = sha256.Sum256(data)
		r.status.SourceVersion = version
		if cfg, err = Parse(data, src.Name(), env); err != nil {
			r.docErr = err
		}
	}
	fromCache := false
	if cfg == nil {
		if so.CachePath == "" {
			return nil, fmt.Errorf("%w (no SourceOptions.CachePath to start from)", err)
		}
		cached, cerr := readFile(so.CachePath)
		if cerr == nil {
			cfg, cerr = Parse(cached, so.CachePath, env)
		}
		if cerr != nil {
			return nil, fmt.Errorf("%w (and no saved copy to start from: %w)", err, cerr)
		}
		if seen == ([sha256.Size]byte{}) {
			seen = cfg.sum
		}
		fromCache = true
	}
	lim, err := middleware.NewRules(cfg.Rules, append(cfg.Options(), opts...)...)
	if err != nil {
		return nil, err
	}
	r.lim = lim
	r.init(cfg)
	r.seen.sum = seen
	now := time.Now()
	r.status.Source, r.status.LoadedAt, r.status.CheckedAt, r.status.FromCache = src.Name(), now, now, fromCache
	if r.fetchErr != nil {
		r.status.Failures = 1
		r.reported = r.fetchErr.Error()
	}
	if !fromCache {
		r.saveCache(data)
	}
	r.publish()
	return r, nil
}

// sourceError names the source in an error of its Load.
func sourceError(src Source, err error) error {
	var e *Error
	if errors.As(err, &e) {
		return err
	}
	return fmt.Errorf("config: %s: %w", src.Name(), err)
}

// Status returns the state of the Reloader's Source. For a Reloader of a
// file (Open, NewReloader) it reports the file and the rules in force.
//
// Status never waits for a read of the source in progress.
func (r *Reloader) Status() Status {
	if r.src == nil {
		return Status{Source: r.path, Version: r.Document().Version()}
	}
	return *r.snapshot.Load()
}

// currentStatus returns the status; r.mu is held.
func (r *Reloader) currentStatus() Status {
	s := r.status
	s.Version = r.Document().Version()
	s.Err = r.fetchErr
	if s.Err == nil {
		s.Err = r.docErr
	}
	return s
}

// publish updates the status Status returns and reports it to
// SourceOptions.OnStatus; r.mu is held.
func (r *Reloader) publish() {
	st := r.currentStatus()
	r.snapshot.Store(&st)
	if r.so.OnStatus != nil {
		r.so.OnStatus(st)
	}
}

// checkSource reads the source and reloads its document if it changed (or,
// with force, whenever it was read). It reports whether it tried a reload
// or has a new error to report, and whether the source could not be read.
func (r *Reloader) checkSource(force bool) (tried, unreadable bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.publish()
	ctx, cancel := context.WithTimeout(context.Background(), r.so.timeout())
	data, version, err := r.src.Load(ctx)
	cancel()
	r.status.CheckedAt = time.Now()
	if errors.Is(err, ErrNotModified) {
		r.fetchErr, r.status.Failures, r.reported = nil, 0, ""
		return false, false, nil
	}
	if err != nil {
		err = sourceError(r.src, err)
		r.fetchErr = err
		r.status.Failures++
		// An error is reported once, until it changes.
		if msg := err.Error(); msg != r.reported || force {
			r.reported = msg
			return true, true, err
		}
		return false, true, nil
	}
	r.fetchErr, r.status.Failures, r.reported = nil, 0, ""
	r.status.SourceVersion = version
	sum := sha256.Sum256(data)
	if sum == r.seen.sum && !force {
		return false, false, nil
	}
	r.seen.sum = sum
	if _, err := r.applyData(data, r.src.Name()); err != nil {
		r.docErr = err
		return true, false, err
	}
	r.docErr = nil
	r.status.LoadedAt, r.status.FromCache = r.status.CheckedAt, false
	r.saveCache(data)
	return true, false, nil
}

// saveCache writes data to SourceOptions.CachePath, if set, atomically.
// r.mu is held, or r is not shared yet.
func (r *Reloader) saveCache(data []byte) {
	if r.so.CachePath == "" {
		return
	}
	r.status.CacheErr = writeAtomic(r.so.CachePath, data)
}

// writeAtomic writes data to a temporary file beside path, syncs it and
// renames it to path.
func writeAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("config: saving rules: %w", err)
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("config: saving rules: %w", err)
	}
	return nil
}

// watchSource is Watch for a Reloader of a Source.
func (r *Reloader) watchSource(ctx context.Context, interval time.Duration, onReload func(error)) {
	if interval <= 0 {
		interval = r.so.interval()
	}
	var changes <-chan struct{}
	if n, ok := r.src.(Notifier); ok {
		changes = n.Changes(ctx)
	}
	failures := 0
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		wait := interval
		if failures > 0 {
			wait = r.so.backoff(interval, failures)
		}
		t.Reset(r.so.jittered(wait))
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-changes:
		}
		tried, unreadable, err := r.checkSource(false)
		if unreadable {
			failures++
		} else {
			failures = 0
		}
		if tried && onReload != nil {
			onReload(err)
		}
	}
}
