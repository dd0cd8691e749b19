// Package redisprobe checks, when a Redis store is made, that the server
// has what sluice's scripts need, so that a server that lacks something
// (an older Redis, miniredis, a server that only claims compatibility)
// is refused at construction with an error that names what is missing,
// instead of failing every decision later (which the failure policy would
// turn into admitting everything, or denying everything).
//
// The probe is one script run (probe.lua): it packs and unpacks with the
// struct library, reads TIME, and sends HRANDFIELD ... WITHVALUES,
// PEXPIRE ... GT and NX, and ZADD ... XX GT to a key that holds nothing,
// so it writes nothing. docs/compatibility.md lists what each capability
// needs.
package redisprobe

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
)

//go:embed probe.lua
var probeSrc string

var probeScript = keyguard.Script(probeSrc)

// Timeout bounds the probe. A server that does not answer within it, or
// cannot be reached, is not refused: the store's failure policy covers a
// server that is down, and the probe cannot tell what it lacks.
const Timeout = time.Second

// Key returns the key the probe reads for a store of prefix: one that no
// counter uses (a bucket's hash tag has 3 characters).
func Key(prefix string) string { return prefix + "{probe}" }

// Error is the error Check returns for a server that lacks what sluice
// needs.
type Error struct {
	// Missing lists what the server lacks, or the error with which it
	// refused to run the probe.
	Missing []string
}

func (e *Error) Error() string {
	return "the Redis server lacks what sluice's scripts need: " + strings.Join(e.Missing, "; ") +
		" (docs/compatibility.md lists the servers and versions that work)"
}

// Check runs the probe through client on the server that holds
// Key(prefix). It returns an *Error when the server answers that it lacks
// something, and nil when it has everything or gives no answer (it is
// down, slow, loading its data, or the context ends).
func Check(ctx context.Context, client redis.Scripter, prefix string) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	v, err := probeScript.Run(ctx, client, []string{Key(prefix)}).Result()
	if err != nil {
		return refusal(err)
	}
	s, ok := v.(string)
	if !ok {
		return &Error{Missing: []string{fmt.Sprintf("the probe script returned %T, not a string", v)}}
	}
	if s == "" {
		return nil
	}
	return &Error{Missing: strings.Split(s, "\n")}
}

// refusal turns the error of the probe's run into an *Error when it is the
// server's answer that it cannot run the probe, and into nil when it says
// nothing of what the server has.
func refusal(err error) error {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return nil // no answer: down, slow, closed
	}
	msg := rerr.Error()
	switch {
	case strings.Contains(strings.ToLower(msg), "unknown command"):
		return &Error{Missing: []string{"Lua scripts (EVAL and EVALSHA): " + msg}}
	case strings.HasPrefix(msg, "NOPERM"):
		return &Error{Missing: []string{"permission to run scripts and the commands they call: " + msg}}
	case strings.Contains(strings.ToLower(msg), "script"):
		return &Error{Missing: []string{"a script that runs on Redis: " + msg}}
	}
	return nil // LOADING, BUSY, CLUSTERDOWN, TRYAGAIN, ...: nothing to conclude
}
