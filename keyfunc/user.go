package keyfunc

import (
	"context"
	"fmt"
)

// maxUserLen is the longest user ID that User puts into a key as is.
const maxUserLen = 64

// errNotAuthenticated is returned by User for an anonymous request.
var errNotAuthenticated = fmt.Errorf("keyfunc: request not authenticated: %w", ErrNoKey)

// User returns a Func that keys a request by the authenticated user, as
// reported by from, which typically reads what the caller's authentication
// middleware stored in the request's context.
//
// The key is "user:" followed by the ID with '%', '|' and control
// characters escaped (see Escape), as in "user:42". An ID longer than 64
// bytes is hashed instead, as "user#" followed by its Hash, so keys stay
// short whatever the user store allows.
//
// The Func returns an error wrapping ErrNoKey when from reports false or an
// empty ID, so First can fall back to another key for anonymous requests.
// User panics if from is nil.
func User(from func(context.Context) (string, bool)) Func {
	if from == nil {
		panic("keyfunc: User expects a non-nil function")
	}
	return func(r Request) (string, error) {
		id, ok := from(r.Context())
		if !ok || id == "" {
			return "", errNotAuthenticated
		}
		return boundedKey("user", id, maxUserLen), nil
	}
}
