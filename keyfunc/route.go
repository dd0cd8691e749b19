package keyfunc

import "net/http"

// maxMethodLen and maxPathLen are the longest method and path that Method
// and Route put into a key as is.
const (
	maxMethodLen = 32
	maxPathLen   = 128
)

// Method returns a Func that keys a request by its HTTP method, as in
// "m:GET". It is meant for Join, to count each method separately.
//
// Standard methods are keyed without allocating. The method is chosen by the
// client and net/http accepts any token, so others are escaped (see Escape),
// and one longer than 32 bytes is hashed, as "m#" followed by its Hash. An
// empty method is keyed as GET, as net/http treats it.
func Method() Func {
	return func(r Request) (string, error) {
		switch m := r.Method(); m {
		case http.MethodGet, "":
			return "m:GET", nil
		case http.MethodHead:
			return "m:HEAD", nil
		case http.MethodPost:
			return "m:POST", nil
		case http.MethodPut:
			return "m:PUT", nil
		case http.MethodPatch:
			return "m:PATCH", nil
		case http.MethodDelete:
			return "m:DELETE", nil
		case http.MethodConnect:
			return "m:CONNECT", nil
		case http.MethodOptions:
			return "m:OPTIONS", nil
		case http.MethodTrace:
			return "m:TRACE", nil
		default:
			return boundedKey("m", m, maxMethodLen), nil
		}
	}
}

// Route returns a Func that keys a request by the route that matched it,
// "route:" followed by the pattern, as in "route:GET /users/{id}", so that
// every request matching a route shares one key. It is meant for Join, to
// give each route its own limit.
//
// When the front end does not know the route (Request.Route returns ""),
// Route falls back to the path: "path:" followed by the path, or "path#"
// followed by its Hash if it is longer than 128 bytes. Patterns and paths
// are escaped (see Escape). Unlike patterns, paths are chosen by the client:
// one client can create a key per path it makes up, so the store's cap on
// the number of keys is what bounds memory. Register routes with patterns,
// or apply the limiter after routing, where the pattern is known.
func Route() Func {
	return func(r Request) (string, error) {
		if p := r.Route(); p != "" {
			return "route:" + Escape(p), nil
		}
		return boundedKey("path", r.Path(), maxPathLen), nil
	}
}

// Global returns a Func that gives every request the same key, "global",
// so that all clients share one counter. Use it for a limit on the total
// rate a server accepts, such as protecting a fragile backend; it lets one
// client use up the limit for everyone.
func Global() Func {
	return func(Request) (string, error) { return "global", nil }
}
