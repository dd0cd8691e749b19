// Package keyfunc says who a request is counted against.
//
// A Func reads a Request, a small view of an incoming request that net/http
// and every adapter (Gin, Echo, Fiber) provide without converting to one
// another, and returns the key that names the client's counter, for example
// "ip:192.0.2.1" or "user:42". Keys carry a prefix per kind so that the
// namespaces of different kinds never collide.
//
// Key functions are safe by default: RemoteIP never reads a header, ClientIP
// reads forwarding headers only from trusted proxies, IPv6 clients are
// grouped by prefix, and values a client chooses freely (headers, API keys)
// are hashed, so a hostile value can neither be long nor collide with another
// client's key.
//
// The keys, by function:
//
//	RemoteIP, ClientIP  ip:192.0.2.1, ip:2001:db8:1:2::/64
//	User                user:42, or user#<hash> for an ID over 64 bytes
//	APIKey              key:<hash>, an HMAC-SHA256 when given a secret
//	Header              h:x-tenant:<hash>
//	Method              m:GET
//	Route               route:GET /users/{id}, or path:/users/42 when no
//	                    route matched (path#<hash> over 128 bytes)
//	Global              global
//	First               the first that finds one: user:42, else ip:192.0.2.1
//	Join                ip:192.0.2.1|route:GET /users/{id}
//
// A <hash> is 22 characters of unpadded base64url (see Hash). Values that
// appear in a key unhashed are escaped (see Escape), so that none contains
// the "|" that Join puts between keys. The keys of this package never share
// memory with the Request.
//
// docs/rules.md lists the key names of a rules file and the functions
// they stand for; docs/adapters.md says why no adapter uses its
// framework's idea of the client's address, and how to configure
// ClientIP behind proxies.
package keyfunc

import (
	"context"
	"errors"
	"net/http"
)

// ErrNoKey is returned (possibly wrapped) by a Func when the request carries
// nothing to key it by, for example a missing API key header. First moves on
// to its next function only on this error.
var ErrNoKey = errors.New("keyfunc: no key for request")

// Func returns the key a request is counted against. It returns an error
// wrapping ErrNoKey when the request has no usable key.
//
// A Func must not keep the Request or any string it returned past the call:
// some front ends (Fiber) reuse their buffers once the handler returns.
type Func func(Request) (string, error)

// Request is the part of an incoming request that key functions read.
//
// net/http requests are adapted by FromHTTP; the Gin, Echo and Fiber adapters
// provide their own implementations that read the framework's request
// directly.
type Request interface {
	// Context is the request's context, where a caller's authentication
	// middleware may have stored the user.
	Context() context.Context
	// Method is the HTTP method, such as "GET".
	Method() string
	// Path is the request's URL path, as sent by the client.
	Path() string
	// Route is the pattern of the route that matched, such as
	// "/users/{id}", or "" when the front end does not know it yet.
	Route() string
	// RemoteAddr is the network address of the peer that sent the request,
	// "host:port" or a bare host, as the server saw it.
	RemoteAddr() string
	// Header returns the first value of the named header, or "".
	Header(name string) string
	// Values returns every value of the named header, in the order they
	// were received, one element per header line.
	Values(name string) []string
}

// FromHTTP adapts a net/http request. It does not allocate.
func FromHTTP(r *http.Request) Request { return httpRequest{r} }

type httpRequest struct{ r *http.Request }

func (h httpRequest) Context() context.Context    { return h.r.Context() }
func (h httpRequest) Method() string              { return h.r.Method }
func (h httpRequest) Path() string                { return h.r.URL.Path }
func (h httpRequest) Route() string               { return h.r.Pattern }
func (h httpRequest) RemoteAddr() string          { return h.r.RemoteAddr }
func (h httpRequest) Header(name string) string   { return h.r.Header.Get(name) }
func (h httpRequest) Values(name string) []string { return h.r.Header.Values(name) }
