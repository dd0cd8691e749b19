package middleware

import (
	"context"
	"net/http"

	"github.com/sluicehq/sluice/internal/arena"
	"github.com/sluicehq/sluice/keyfunc"
)

// httpView is the view of a net/http request that Handler gives the key
// functions: what keyfunc.FromHTTP gives (its methods, the optional ones
// such as Query included: TestHTTPView holds them to the same set), and
// the Arena of the request's scratch (arena.Holder), so that keys are
// carved from it without a trip to the arenas' pool. It lives in the
// scratch: like every Request, it is valid only during the decision.
type httpView struct {
	r *http.Request
	a *arena.Arena
}

func (v *httpView) Context() context.Context    { return v.r.Context() }
func (v *httpView) Method() string              { return v.r.Method }
func (v *httpView) Path() string                { return v.r.URL.Path }
func (v *httpView) Route() string               { return v.r.Pattern }
func (v *httpView) RemoteAddr() string          { return v.r.RemoteAddr }
func (v *httpView) Header(name string) string   { return v.r.Header.Get(name) }
func (v *httpView) Values(name string) []string { return v.r.Header.Values(name) }
func (v *httpView) Arena() *arena.Arena         { return v.a }

// Query implements keyfunc.QueryRequest, as keyfunc.FromHTTP's view does.
func (v *httpView) Query(name string) string {
	return keyfunc.FromHTTP(v.r).(keyfunc.QueryRequest).Query(name)
}
