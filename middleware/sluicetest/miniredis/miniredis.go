// Package sluiceminiredis runs sluice's Redis store on miniredis
// (github.com/alicebob/miniredis/v2), an in-process Redis for tests, so
// that a user's tests exercise the store their servers use without
// starting a redis-server. It is a module of its own: users who do not
// import it never download miniredis.
//
// miniredis runs scripts with gopher-lua, which lacks the struct library
// that Redis's Lua has and sluice's scripts use: middleware.NewRedisStore
// refuses a plain miniredis, naming it. Enable adds the library to a
// miniredis: a pure-Lua struct.pack and struct.unpack (the formats sluice
// uses) at the top of every script it runs. Run starts a miniredis with
// it for a test; docs/testing.md shows a whole test, and lists what
// differs from a real server.
package sluiceminiredis

import (
	"crypto/sha1"
	_ "embed"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/alicebob/miniredis/v2/server"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/middleware"
)

//go:embed struct.lua
var structSrc string

// prelude is struct.lua on one line, so that a script's line numbers do
// not move.
var prelude = strings.Join(strings.Fields(structSrc), " ") + " "

// Enable gives every script m runs the struct library (m must have been
// started): a hook on m's
// server (miniredis's own pre-command hook) puts a pure-Lua struct.pack
// and struct.unpack (the formats sluice uses) at the top of the source of
// EVAL and SCRIPT LOAD, and points EVALSHA at the rewritten script. An
// EVALSHA of a source m has not seen yet gets NOSCRIPT, and the client
// sends the source (go-redis's Script.Run and sluice do). It works for
// every client of m. m.SetError and m.Restart replace the hook: call
// Enable again after them.
func Enable(m *miniredis.Miniredis) {
	h := &hook{src: map[string]string{}, ours: map[string]bool{}}
	m.Server().SetPreHook(h.rewrite)
}

type hook struct {
	mu   sync.Mutex
	src  map[string]string // digest of a source seen → the source
	ours map[string]bool   // digests of rewritten sources
}

func digest(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// wrap returns src with the prelude after any first line that must stay
// first ("#!lua flags=...", "--!df flags=...").
func wrap(src string) string {
	if strings.HasPrefix(src, "#!") || strings.HasPrefix(src, "--!") {
		if i := strings.IndexByte(src, '\n'); i >= 0 {
			return src[:i+1] + prelude + src[i+1:]
		}
	}
	return prelude + src
}

// source returns the script source src rewritten, and remembers it.
func (h *hook) source(src string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ours[digest(src)] {
		return src // already rewritten
	}
	w := wrap(src)
	h.src[digest(src)] = src
	h.ours[digest(w)] = true
	return w
}

// sha maps the digest an EVALSHA names.
func (h *hook) sha(sha string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ours[sha] {
		return sha
	}
	if src, ok := h.src[strings.ToLower(sha)]; ok {
		return digest(wrap(src))
	}
	return digest("sluiceminiredis: not seen: " + sha) // NOSCRIPT, then the source
}

// rewrite is the server's pre-command hook: it changes the arguments in
// place, and lets miniredis run the command.
func (h *hook) rewrite(_ *server.Peer, cmd string, args ...string) bool {
	if len(args) == 0 {
		return false
	}
	switch cmd {
	case "EVAL", "EVAL_RO":
		args[0] = h.source(args[0])
	case "EVALSHA", "EVALSHA_RO":
		args[0] = h.sha(args[0])
	case "SCRIPT":
		if strings.EqualFold(args[0], "load") && len(args) > 1 {
			args[1] = h.source(args[1])
		}
	}
	return false
}

// Run starts a miniredis for the test (miniredis.RunT), enables the
// struct library on it (Enable), and returns it with a client of it,
// closed when the test ends.
func Run(tb testing.TB) (*miniredis.Miniredis, *redis.Client) {
	tb.Helper()
	m := miniredis.RunT(tb)
	Enable(m)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	tb.Cleanup(func() { _ = c.Close() })
	return m, c
}

// StoreConfig is the configuration NewStore gives a Redis store on
// miniredis: limits generous enough for a loaded test machine, as
// miniredis compiles each script in gopher-lua on its first run (tens of
// milliseconds under the race detector) and serves one command at a time.
// With the defaults (a Timeout of 100ms), the store would take such a
// pause for a stalled server and fail the decision to the failure policy.
var StoreConfig = middleware.RedisConfig{Timeout: 5 * time.Second, StallThreshold: 2 * time.Second}

// NewStore returns a Redis store on c (a client of a miniredis on which
// Enable was called) with StoreConfig, closed when the test ends.
func NewStore(tb testing.TB, c redis.Scripter) *middleware.RedisStore {
	tb.Helper()
	s, err := middleware.NewRedisStore(c, StoreConfig)
	if err != nil {
		tb.Fatalf("sluiceminiredis: NewRedisStore: %v", err)
	}
	tb.Cleanup(func() { _ = s.Close() })
	return s
}
