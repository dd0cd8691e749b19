package keyfunc

import (
	"errors"
	"fmt"
	"slices"
)

// maxJoinStack is how many keys Join collects without allocating a slice.
const maxJoinStack = 8

// First returns a Func that tries fns in order and returns the first key
// found. It moves on to the next function only when one returns an error
// wrapping ErrNoKey; any other error is returned at once. If every function
// returns ErrNoKey, First returns the last function's error.
//
// First builds the hybrid key that counts authenticated users by their ID
// and everyone else by address:
//
//	keyfunc.First(keyfunc.User(userFromContext), keyfunc.RemoteIP())
//
// The prefixes of the keys ("user:", "ip:") keep the two kinds from sharing
// a counter.
//
// First panics if fns is empty or holds a nil function.
func First(fns ...Func) Func {
	fns = checkFuncs("First", fns)
	return func(r Request) (string, error) {
		var err error
		for _, fn := range fns {
			var key string
			if key, err = fn(r); err == nil {
				return key, nil
			}
			if !errors.Is(err, ErrNoKey) {
				return "", err
			}
		}
		return "", err
	}
}

// Join returns a Func that builds a composite key from all of fns, joined
// by "|", as in "ip:192.0.2.1|route:GET /search", so that each combination
// gets its own counter. If any function returns an error, Join returns it.
//
// Each key is escaped (see Escape) before it is joined, so a value that
// contains "|" cannot make one combination look like another. The keys of
// this package contain neither '|' nor control characters and are joined
// unchanged unless they contain '%' (from an escaped value).
//
// Join panics if fns is empty or holds a nil function.
func Join(fns ...Func) Func {
	fns = checkFuncs("Join", fns)
	return func(r Request) (string, error) {
		var stack [maxJoinStack]string
		keys := stack[:0]
		n := len(fns) - 1
		for _, fn := range fns {
			key, err := fn(r)
			if err != nil {
				return "", err
			}
			keys = append(keys, key)
			n += escapedLen(key)
		}
		var buf [128]byte
		b := buf[:0]
		if n > len(buf) {
			b = make([]byte, 0, n)
		}
		for i, key := range keys {
			if i > 0 {
				b = append(b, '|')
			}
			b = appendEscape(b, key)
		}
		return string(b), nil
	}
}

// checkFuncs panics if fns is empty or holds a nil function, and returns a
// copy of fns that the caller cannot change afterwards.
func checkFuncs(name string, fns []Func) []Func {
	if len(fns) == 0 {
		panic("keyfunc: " + name + " expects at least one function")
	}
	for i, fn := range fns {
		if fn == nil {
			panic(fmt.Sprintf("keyfunc: %s: function %d is nil", name, i))
		}
	}
	return slices.Clone(fns)
}
