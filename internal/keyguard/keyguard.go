// Package keyguard checks, in tests, that every Lua script sluice runs
// touches only the keys it declares in KEYS: what Redis Cluster needs to
// route a script, and what Dragonfly enforces (it refuses a script that
// touches an undeclared key unless it runs with
// --default_lua_flags=allow-undeclared-keys).
//
// Every script of sluice is made by Script or Wrap (TestEveryScriptGuarded
// checks the sources). When the environment variable SLUICE_KEYGUARD is
// "1" as the process starts (make test sets it), they prepend to the
// script a prelude, on the script's first line so that the line numbers
// of errors do not move, that shadows redis.call and redis.pcall with
// functions that look the command up in Commands, check every key it
// names against KEYS, and fail the script with an error naming the
// command and the key otherwise, before the command runs. A command that
// is not in Commands fails the script too, so the table stays complete.
//
// There is no exception: a key that is not in KEYS fails the script even
// when it shares the hash tag (the Redis Cluster slot) of one that is, as
// it fails on Dragonfly.
//
// Otherwise Script is redis.NewScript and Wrap returns its source
// unchanged: production runs the scripts as written, and pays one
// environment lookup when the program starts.
package keyguard

import (
	_ "embed"
	"os"
	"sort"
	"strings"

	"github.com/redis/go-redis/v9"
)

// Env is the environment variable that switches the guard on.
const Env = "SLUICE_KEYGUARD"

// Enabled reports whether the guard is on: SLUICE_KEYGUARD was "1" when
// the process started.
var Enabled = os.Getenv(Env) == "1"

// Spec says where a command's keys are among its arguments.
type Spec string

// The specs of the commands sluice's scripts call.
const (
	// First: the first argument is the command's only key.
	First Spec = "first"
	// All: every argument is a key (DEL).
	All Spec = "all"
	// None: the command names no key (TIME; PUBLISH names a channel).
	None Spec = "none"
)

// Commands is every command that a script of sluice may call, by name in
// upper case, with where its keys are. The guard refuses any other, so a
// script that starts to call a new command fails its tests until the
// command is added here, and TestCommandsDocumented until
// docs/compatibility.md lists it; TestSpecsMatchServer checks each entry
// against COMMAND GETKEYS on a real server.
var Commands = map[string]Spec{
	"DEL":              All,
	"GET":              First,
	"HDEL":             First,
	"HEXISTS":          First,
	"HGET":             First,
	"HGETALL":          First,
	"HINCRBY":          First,
	"HLEN":             First,
	"HMGET":            First,
	"HRANDFIELD":       First,
	"HSET":             First,
	"INCR":             First,
	"PEXPIRE":          First,
	"PUBLISH":          None,
	"SET":              First,
	"TIME":             None,
	"ZADD":             First,
	"ZCARD":            First,
	"ZCOUNT":           First,
	"ZRANGE":           First,
	"ZRANGEBYSCORE":    First,
	"ZREM":             First,
	"ZREMRANGEBYSCORE": First,
	"ZSCORE":           First,
}

//go:embed prelude.lua
var preludeSrc string

// prelude is preludeSrc on one line, with the table of Commands in it.
var prelude = func() string {
	names := make([]string, 0, len(Commands))
	for n := range Commands {
		names = append(names, n)
	}
	sort.Strings(names)
	var specs []string
	for _, n := range names {
		// Upper and lower case, so that the common spellings are found
		// without string.upper.
		specs = append(specs, n+" = '"+string(Commands[n])+"'", strings.ToLower(n)+" = '"+string(Commands[n])+"'")
	}
	src := strings.Replace(preludeSrc, "SPECS", strings.Join(specs, ", "), 1)
	return strings.Join(strings.Fields(src), " ") + " "
}()

// Prelude returns the Lua code that Wrap puts before a script when the
// guard is on: one line, ending in a space.
func Prelude() string { return prelude }

// Wrap returns src with the guard's prelude on its first line when the
// guard is on (after a "#!" line, which must stay first), and src itself
// otherwise.
func Wrap(src string) string {
	if !Enabled {
		return src
	}
	return Guard(src)
}

// Guard returns src with the guard's prelude on its first line, whether
// the guard is on or not: for the tests of the guard itself. A "#!" line
// (Redis's "#!lua flags=...") must stay first: the prelude goes on the
// second.
func Guard(src string) string {
	if strings.HasPrefix(src, "#!") {
		i := strings.IndexByte(src, '\n')
		if i < 0 {
			return src + "\n" + prelude
		}
		return src[:i+1] + prelude + src[i+1:]
	}
	return prelude + src
}

// Script returns redis.NewScript(Wrap(src)): the way sluice makes every
// script it runs.
func Script(src string) *redis.Script { return redis.NewScript(Wrap(src)) }
