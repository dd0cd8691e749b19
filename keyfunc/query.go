package keyfunc

import (
	"net/url"
	"strings"
)

// QueryRequest is a Request that can also read the query parameters of its
// URL. The Requests of FromHTTP and of the Gin, Echo and Fiber adapters
// implement it; rules that match on query parameters
// (middleware.Rule.Query) match no request that does not.
type QueryRequest interface {
	Request
	// Query returns the first value of the named query parameter,
	// unescaped, or "" when the URL has none.
	Query(name string) string
}

// queryValue returns the first value of the parameter name in rawQuery, a
// URL's query without the '?', unescaped as url.ParseQuery would ('+' is a
// space), or "" when there is none. It allocates only for a value that is
// escaped. Parameters whose name or value is badly escaped are skipped, as
// url.ParseQuery skips them.
func queryValue(rawQuery, name string) string {
	for rawQuery != "" {
		var pair string
		pair, rawQuery, _ = strings.Cut(rawQuery, "&")
		if pair == "" || strings.Contains(pair, ";") {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			uk, err := url.QueryUnescape(k)
			if err != nil || uk != name {
				continue
			}
		}
		if !strings.ContainsAny(v, "%+") {
			return v
		}
		uv, err := url.QueryUnescape(v)
		if err != nil {
			continue
		}
		return uv
	}
	return ""
}

// Query implements QueryRequest.
func (h httpRequest) Query(name string) string { return queryValue(h.r.URL.RawQuery, name) }
