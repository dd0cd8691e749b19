package keyfunc

import (
	"context"
	"net/http"
)

// testRequest is a Request built field by field. Header lookups are case
// insensitive, as with net/http.
type testRequest struct {
	ctx                         context.Context
	method, path, route, remote string
	header                      http.Header
}

// newRequest returns a GET request for "/" from remote with the given
// header lines, as name, value pairs; a name given twice adds a second line.
func newRequest(remote string, headerLines ...string) *testRequest {
	r := &testRequest{method: http.MethodGet, path: "/", remote: remote, header: http.Header{}}
	for i := 0; i+1 < len(headerLines); i += 2 {
		r.header.Add(headerLines[i], headerLines[i+1])
	}
	return r
}

func (r *testRequest) Context() context.Context {
	if r.ctx == nil {
		return context.Background()
	}
	return r.ctx
}

func (r *testRequest) Method() string              { return r.method }
func (r *testRequest) Path() string                { return r.path }
func (r *testRequest) Route() string               { return r.route }
func (r *testRequest) RemoteAddr() string          { return r.remote }
func (r *testRequest) Header(name string) string   { return r.header.Get(name) }
func (r *testRequest) Values(name string) []string { return r.header.Values(name) }

// userKey is the context key under which tests store the user ID.
type userKey struct{}

// withUser returns r with id stored as the authenticated user.
func withUser(r *testRequest, id string) *testRequest {
	r.ctx = context.WithValue(r.Context(), userKey{}, id)
	return r
}

// userFromContext reads the user stored by withUser.
func userFromContext(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(userKey{}).(string)
	return id, ok
}
