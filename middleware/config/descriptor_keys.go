package config

import (
	"errors"
	"fmt"
	"net/netip"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/internal/keytext"
	"github.com/sluicehq/sluice/keyfunc"
)

// builtinDescriptors are the descriptor keys Parse knows without
// Env.DescriptorHeaders and Env.Descriptors, as error messages list them.
var builtinDescriptors = []string{"remote_address", "path", "method", "user", "api_key", "header:<Name>", "query:<name>"}

// attribute is what a descriptor key stands for in a request.
type attribute struct {
	// value returns the request's value, false when it has none.
	value func(keyfunc.Request) (string, bool)
	// key counts each value.
	key keyfunc.Func
	// canon, when not nil, puts a value written in the file in the form
	// value returns, or reports that it is bad.
	canon func(string) (string, error)
}

// attribute returns what the descriptor key key stands for.
func (d *decoder) attribute(key string, b *descBuild) (*attribute, error) {
	if a, ok := b.attrs[key]; ok {
		return a, nil
	}
	a, err := d.newAttribute(key)
	if err != nil {
		return nil, err
	}
	b.attrs[key] = a
	return a, nil
}

func (d *decoder) newAttribute(key string) (*attribute, error) {
	env := d.env
	if env.RateLimitService {
		// The descriptor request's entries carry every key's value.
		return &attribute{}, nil
	}
	if fn, ok := env.Descriptors[key]; ok {
		return valueAttribute(key, fn), nil
	}
	if h, ok := env.DescriptorHeaders[key]; ok {
		return headerAttribute(h), nil
	}
	switch key {
	case "remote_address":
		ip, err := d.keys.ipFunc(env)
		if err != nil {
			return nil, err
		}
		return &attribute{
			value: func(r keyfunc.Request) (string, bool) {
				k, err := ip(r)
				if err != nil {
					return "", false
				}
				return strings.TrimPrefix(k, "ip:"), true
			},
			key:   ip,
			canon: canonicalAddress,
		}, nil
	case "path":
		return valueAttribute(key, func(r keyfunc.Request) (string, bool) {
			p := r.Path()
			if p == "" {
				return "/", true
			}
			return path.Clean("/" + p), true
		}), nil
	case "method":
		return &attribute{
			value: func(r keyfunc.Request) (string, bool) {
				if m := r.Method(); m != "" {
					return m, true
				}
				return "GET", true
			},
			key: keyfunc.Method(),
		}, nil
	case "user", "user_id":
		if env.User == nil {
			return nil, fmt.Errorf("%s needs Env.User, which the program did not supply", key)
		}
		user := env.User
		return &attribute{
			value: func(r keyfunc.Request) (string, bool) { return user(r.Context()) },
			key:   keyfunc.User(user),
		}, nil
	case "api_key":
		h := env.APIKeyHeader
		if h == "" {
			h = DefaultAPIKeyHeader
		}
		if d.keys.apiKey == nil {
			d.keys.apiKey = keyfunc.APIKey(h, env.APIKeySecret)
		}
		return &attribute{
			value: func(r keyfunc.Request) (string, bool) {
				v := r.Header(h)
				return v, v != ""
			},
			key: d.keys.apiKey,
		}, nil
	}
	if h, ok := strings.CutPrefix(key, "header:"); ok {
		if !httptoken.Valid(h) {
			return nil, fmt.Errorf("%q: bad header name %q", key, h)
		}
		return headerAttribute(h), nil
	}
	if q, ok := strings.CutPrefix(key, "query:"); ok {
		if q == "" {
			return nil, fmt.Errorf("%q: empty query parameter name", key)
		}
		return valueAttribute(key, func(r keyfunc.Request) (string, bool) {
			qr, ok := r.(keyfunc.QueryRequest)
			if !ok {
				return "", false
			}
			v := qr.Query(q)
			return v, v != ""
		}), nil
	}
	known := builtinDescriptors
	if len(env.DescriptorHeaders) > 0 || len(env.Descriptors) > 0 {
		known = slices.Clone(known)
		known = append(known, sortedKeys(env.DescriptorHeaders)...)
		known = append(known, sortedKeys(env.Descriptors)...)
	}
	return nil, fmt.Errorf("unknown descriptor key %q (want %s, or map it with Env.DescriptorHeaders or Env.Descriptors)", key, strings.Join(known, ", "))
}

// headerAttribute is the attribute of a request header.
func headerAttribute(name string) *attribute {
	return &attribute{
		value: func(r keyfunc.Request) (string, bool) {
			v := r.Header(name)
			return v, v != ""
		},
		key: keyfunc.Header(name),
	}
}

// valueAttribute is the attribute of a value function: requests are
// counted under "d:", the key, ":" and the Hash of the value.
func valueAttribute(key string, fn func(keyfunc.Request) (string, bool)) *attribute {
	prefix := "d:" + keyfunc.Escape(key) + ":"
	errMissing := fmt.Errorf("config: descriptor %q: no value: %w", key, keyfunc.ErrNoKey)
	return &attribute{
		value: fn,
		key: func(r keyfunc.Request) (string, error) {
			v, ok := fn(r)
			if !ok || v == "" {
				return "", errMissing
			}
			return prefix + keyfunc.Hash(v), nil
		},
	}
}

// canonicalAddress writes a remote_address value as keyfunc writes the
// client's address: an IPv4 address, or the /64 of an IPv6 one.
func canonicalAddress(s string) (string, error) {
	a, err := netip.ParseAddr(s)
	if err != nil || a.Zone() != "" {
		return "", errors.New("bad remote_address " + strconv.Quote(s) + ": want an IP address such as 203.0.113.7, or a prefix ending in *")
	}
	return string(keytext.AppendIP(nil, a, keyfunc.DefaultIPv4Prefix, keyfunc.DefaultIPv6Prefix)), nil
}
