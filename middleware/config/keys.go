package config

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/keyfunc"
)

// builtinKeys are the key names Parse knows without Env.Keys, as error
// messages list them.
var builtinKeys = []string{"ip", "user_id", "api_key", "header:<Name>", "route", "method", "global", "user_or_ip"}

// DefaultAPIKeyHeader is the header the key name api_key reads when
// Env.APIKeyHeader is empty.
const DefaultAPIKeyHeader = "X-API-Key"

// DefaultProxyHeader is the header the key name ip reads from trusted
// proxies when Env.ProxyHeader is empty.
const DefaultProxyHeader = "X-Forwarded-For"

// keyExpr is a parsed key expression.
type keyExpr struct {
	fn keyfunc.Func
	// mayHaveIP reports whether keys may have an "ip:" part, against which
	// allow.cidrs are checked: the expression names ip, user_or_ip or a
	// program's own key function.
	mayHaveIP bool
}

// keyCache holds the key functions built for one file, so that rules that
// share a key name share its function.
type keyCache struct {
	ip, apiKey keyfunc.Func
}

// parse parses a key expression: names joined by | (First) and + (Join),
// | binding tighter.
func (c *keyCache) parse(s string, env *Env) (keyExpr, error) {
	var out keyExpr
	if strings.TrimSpace(s) == "" {
		return out, fmt.Errorf("empty: want a key name such as %s", strings.Join(builtinKeys, ", "))
	}
	var seen []string
	var joined []keyfunc.Func
	for term := range strings.SplitSeq(s, "+") {
		var first []keyfunc.Func
		for name := range strings.SplitSeq(term, "|") {
			name = strings.TrimSpace(name)
			if name == "" {
				return out, fmt.Errorf("%q: empty name next to + or |", s)
			}
			if slices.Contains(seen, name) {
				return out, fmt.Errorf("%q names %s twice", s, name)
			}
			seen = append(seen, name)
			fn, ip, err := c.name(name, env)
			if err != nil {
				return out, err
			}
			first = append(first, fn)
			out.mayHaveIP = out.mayHaveIP || ip
		}
		if len(first) == 1 {
			joined = append(joined, first[0])
		} else {
			joined = append(joined, keyfunc.First(first...))
		}
	}
	if len(joined) == 1 {
		out.fn = joined[0]
	} else {
		out.fn = keyfunc.Join(joined...)
	}
	return out, nil
}

// name returns the key function of one name and whether its keys may have
// an "ip:" part.
func (c *keyCache) name(name string, env *Env) (keyfunc.Func, bool, error) {
	if fn, ok := env.Keys[name]; ok {
		return fn, true, nil
	}
	switch name {
	case "ip":
		fn, err := c.ipFunc(env)
		return fn, true, err
	case "user_id":
		if env.User == nil {
			return nil, false, errors.New("user_id needs Env.User, which the program did not supply")
		}
		return keyfunc.User(env.User), false, nil
	case "user_or_ip":
		if env.User == nil {
			return nil, false, errors.New("user_or_ip needs Env.User, which the program did not supply")
		}
		ip, err := c.ipFunc(env)
		if err != nil {
			return nil, false, err
		}
		return keyfunc.First(keyfunc.User(env.User), ip), true, nil
	case "api_key":
		if c.apiKey == nil {
			h := env.APIKeyHeader
			if h == "" {
				h = DefaultAPIKeyHeader
			}
			c.apiKey = keyfunc.APIKey(h, env.APIKeySecret)
		}
		return c.apiKey, false, nil
	case "route":
		return keyfunc.Route(), false, nil
	case "method":
		return keyfunc.Method(), false, nil
	case "global":
		return keyfunc.Global(), false, nil
	}
	if h, ok := strings.CutPrefix(name, "header:"); ok {
		if !httptoken.Valid(h) {
			return nil, false, fmt.Errorf("%q: bad header name %q", name, h)
		}
		return keyfunc.Header(h), false, nil
	}
	known := builtinKeys
	if len(env.Keys) > 0 {
		known = append(slices.Clone(known), sortedKeys(env.Keys)...)
	}
	return nil, false, fmt.Errorf("unknown key name %q (want %s)", name, strings.Join(known, ", "))
}

// ipFunc returns the key function of the name ip.
func (c *keyCache) ipFunc(env *Env) (keyfunc.Func, error) {
	if c.ip != nil {
		return c.ip, nil
	}
	if len(env.TrustedProxies) == 0 {
		c.ip = keyfunc.RemoteIP()
		return c.ip, nil
	}
	h := env.ProxyHeader
	if h == "" {
		h = DefaultProxyHeader
	}
	fn, err := keyfunc.ClientIP(keyfunc.ProxyConfig{Trusted: env.TrustedProxies, Header: h})
	if err != nil {
		return nil, fmt.Errorf("ip: Env.TrustedProxies or Env.ProxyHeader: %w", err)
	}
	c.ip = fn
	return fn, nil
}
