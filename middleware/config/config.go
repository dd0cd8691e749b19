package config

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/headers"
	"github.com/sluicehq/sluice/internal/httptoken"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// MaxFileSize is the largest file Load and a Reloader read: a rules file is
// a few kilobytes, so anything larger is a mistake.
const MaxFileSize = 1 << 20

// maxErrors is how many problems Parse reports before it stops.
const maxErrors = 10

// Document is a rules document as loaded (by Load, Parse, Open or
// OpenSource): a rules file or an Envoy-style descriptor file, decoded into
// rules and the Limiter options it sets.
type Document struct {
	// File is the name the file was loaded under, as given to Parse or Load.
	File string

	// Rules are the file's rules, ready for middleware.NewRules or
	// Limiter.SetRules, with the top-level allow and shadow settings
	// already applied to each.
	Rules []middleware.Rule

	// HeaderStyle is the file's headers setting; headers.Both when the
	// file has none. It is a construction-time option of the Limiter: see
	// Options.
	HeaderStyle headers.Style

	// Shadow reports the file's top-level shadow setting. It is already
	// applied: every rule of Rules is a shadow rule when it is true.
	Shadow bool

	// Unmatched is the file's unmatched setting: what the Limiter does
	// with requests no rule applies to. It counts only when UnmatchedSet
	// is true (the file has the setting); Open and a Reloader then apply
	// it with Limiter.SetUnmatched, over any middleware.WithUnmatched.
	Unmatched middleware.UnmatchedPolicy

	// UnmatchedSet reports whether the file sets unmatched.
	UnmatchedSet bool

	// Domain is the domain of an Envoy/Lyft-style descriptor file, "" for
	// a file of rules.
	Domain string

	// Usage reports that a descriptor of the file has usage: true (see
	// DescriptorMatch.Usage).
	Usage bool

	sum         [sha256.Size]byte // of the file's contents
	headersLine int               // line of the headers field, 0 if none
}

// Options returns the Limiter options the file sets, for
// middleware.NewRules: the header style, and unmatched when the file sets
// it. Options passed after them win.
func (c *Document) Options() []middleware.Option {
	opts := []middleware.Option{middleware.WithHeaderStyle(c.HeaderStyle)}
	if c.UnmatchedSet {
		opts = append(opts, middleware.WithUnmatched(c.Unmatched))
	}
	return opts
}

// Env is what a program supplies to turn a file's key names and plans into
// functions. The zero value is usable by files that key by ip, api_key,
// header:<Name>, route, method and global only.
type Env struct {
	// User returns the authenticated user's ID from a request's context,
	// as the program's authentication middleware stored it. It is required
	// by the key names user_id and user_or_ip; see keyfunc.User.
	User func(context.Context) (string, bool)

	// APIKeyHeader is the header that carries API keys for the key name
	// api_key; "" means "X-API-Key". See keyfunc.APIKey.
	APIKeyHeader string

	// APIKeySecret keys the HMAC with which API keys are hashed; see
	// keyfunc.APIKey.
	APIKeySecret []byte

	// TrustedProxies, when not empty, makes the key name ip stand for
	// keyfunc.ClientIP: the address of the client behind these reverse
	// proxies, as reported in ProxyHeader. Without it, ip is
	// keyfunc.RemoteIP, the peer's address.
	TrustedProxies []netip.Prefix

	// ProxyHeader is the header the trusted proxies set: "X-Forwarded-For"
	// (when ""), "Forwarded" or "X-Real-IP".
	ProxyHeader string

	// Plan returns the plan of a request and its key (as the rule's key
	// function returned it), such as "free" or "pro", typically from a map
	// in memory: it is called on every request that a rule with plans
	// matches, and must be fast. A plan the rule does not list, or "",
	// gets the rule's limits. It is required by files that use plans.
	Plan func(r keyfunc.Request, key string) string

	// Keys adds key names, or replaces built-in ones, for the key field.
	// Names are lower case letters, digits and '_', starting with a
	// letter.
	Keys map[string]keyfunc.Func

	// DescriptorHeaders maps descriptor keys of an Envoy/Lyft-style file
	// to the request header each stands for, as Envoy's request_headers
	// action maps a header to a descriptor_key: {"client_id":
	// "X-Client-Id"} lets a file limit by key: client_id. It adds to the
	// built-in descriptor keys, or replaces them.
	DescriptorHeaders map[string]string

	// Descriptors maps descriptor keys to functions that return a
	// request's value for them, and false when it has none (the
	// descriptor then does not apply), for attributes neither the
	// built-ins nor DescriptorHeaders cover. They are called on every
	// request and must be fast. They win over DescriptorHeaders.
	Descriptors map[string]func(keyfunc.Request) (string, bool)

	// RateLimitService makes the rules of an Envoy/Lyft-style descriptor
	// file those of a rate limit service, as the Envoy ratelimit service
	// reads the file: any descriptor key is accepted, and the rules match
	// the descriptors of a DescriptorRequest, entry by entry, instead of
	// attributes of HTTP requests, which they never match. The other
	// descriptor fields of Env are then unused. adapters/envoyrls sets it.
	RateLimitService bool
}

var keyNameRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// check reports a problem with env that no file could work around.
func (env *Env) check() error {
	for name, fn := range env.Keys {
		if !keyNameRE.MatchString(name) {
			return fmt.Errorf("config: Env.Keys: bad name %q: want lower case letters, digits and '_', starting with a letter", name)
		}
		if fn == nil {
			return fmt.Errorf("config: Env.Keys: %q is nil", name)
		}
	}
	for key, h := range env.DescriptorHeaders {
		if key == "" || !httptoken.Valid(h) {
			return fmt.Errorf("config: Env.DescriptorHeaders: %q: bad header name %q", key, h)
		}
	}
	for key, fn := range env.Descriptors {
		if key == "" || fn == nil {
			return fmt.Errorf("config: Env.Descriptors: %q is nil or unnamed", key)
		}
	}
	if env.APIKeyHeader != "" && !httptoken.Valid(env.APIKeyHeader) {
		return fmt.Errorf("config: Env.APIKeyHeader: bad header name %q", env.APIKeyHeader)
	}
	if len(env.TrustedProxies) > 0 {
		var c keyCache
		if _, err := c.ipFunc(env); err != nil {
			return fmt.Errorf("config: %w", err)
		}
	} else if env.ProxyHeader != "" {
		return errors.New("config: Env.ProxyHeader is set but Env.TrustedProxies is empty: no proxy would be trusted")
	}
	return nil
}

// Error is a problem in a rules file.
type Error struct {
	// File is the file's name, as given to Parse or Load.
	File string
	// Line is the 1-based line of the problem, or 0 when it has none.
	Line int
	// Field is the path of the field at fault, as in
	// "rules[1].limits[0].window", or "" for a syntax error.
	Field string
	// Msg says what is wrong.
	Msg string
}

// Error returns "file:line: field: msg", leaving out the parts that are
// missing.
func (e *Error) Error() string {
	b := []byte(e.File)
	if e.Line > 0 {
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(e.Line), 10)
	}
	b = append(b, ": "...)
	if e.Field != "" {
		b = append(b, e.Field...)
		b = append(b, ": "...)
	}
	return string(append(b, e.Msg...))
}

// Load reads the rules file at path and parses it with Parse. Errors name the
// file as path.
func Load(path string, env Env) (*Document, error) {
	data, err := readFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path, env)
}

// readFile reads at most MaxFileSize bytes of the file at path.
func readFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if len(data) > MaxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file larger than %d bytes", MaxFileSize)}
	}
	return data, nil
}

// Parse parses a rules file, YAML or JSON, and builds its rules with env.
// filename names the file in errors. The schema is documented in docs/rules.md
// (https://github.com/sluicehq/sluice/blob/main/docs/rules.md).
//
// Parse checks everything middleware.NewRules would, so the rules of a
// Document it returns are accepted by NewRules and SetRules. When the file has
// problems, Parse returns an *Error, or up to ten of them joined with
// errors.Join. A problem with env itself, which no file could fix, is a
// plain error prefixed "config: ".
func Parse(data []byte, filename string, env Env) (*Document, error) {
	if err := env.check(); err != nil {
		return nil, err
	}
	root, err := parseYAML(data, filename)
	if err != nil {
		return nil, err
	}
	d := &decoder{file: filename, env: &env}
	cfg := d.root(root)
	if err := d.err(); err != nil {
		return nil, err
	}
	cfg.sum = sha256.Sum256(data)
	// Parse mirrors the Limiter's checks; this makes sure of it.
	if _, err := middleware.NewRules(cfg.Rules, middleware.WithStore(nopStore{})); err != nil {
		return nil, &Error{File: filename, Line: root.Line, Field: "rules", Msg: err.Error()}
	}
	return cfg, nil
}

// yamlErrorRE matches the position the YAML parser puts in its errors.
var yamlErrorRE = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parseYAML parses data into the node of its single document.
func parseYAML(data []byte, filename string) (root *yaml.Node, err error) {
	defer func() {
		// The parser is not known to panic, but a config file must never
		// take the server down.
		if p := recover(); p != nil {
			root, err = nil, &Error{File: filename, Msg: fmt.Sprintf("YAML parser failed: %v", p)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{File: filename, Line: 1, Msg: "empty file: want a mapping with rules"}
		}
		return nil, yamlError(filename, data, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		if err != nil {
			return nil, yamlError(filename, data, err)
		}
		return nil, &Error{File: filename, Line: extra.Line, Msg: "more than one YAML document"}
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 {
		return nil, &Error{File: filename, Line: 1, Msg: "empty file: want a mapping with rules"}
	}
	return doc.Content[0], nil
}

// yamlError turns an error of the YAML parser into an *Error.
func yamlError(filename string, data []byte, err error) error {
	msg, line := err.Error(), 0
	if m := yamlErrorRE.FindStringSubmatch(msg); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	// The parser reports some errors without a line, and "did not find
	// expected ..." at the line before the enclosing block starts rather
	// than where the problem is.
	if line == 0 || strings.HasPrefix(msg, "did not find expected") {
		if l := problemLine(data, max(line, 1), msg); l > 0 {
			line = l
		}
	}
	return &Error{File: filename, Line: line, Msg: msg}
}

// maxProblemScan bounds the bytes problemLine parses in all.
const maxProblemScan = 4 << 20

// problemLine returns the first line, from line from on, at which the
// document cut after that line fails to parse with message msg, or 0.
func problemLine(data []byte, from int, msg string) int {
	budget := maxProblemScan
	line, end := 1, 0
	for end < len(data) && budget > 0 {
		nl := bytes.IndexByte(data[end:], '\n')
		if nl < 0 {
			end = len(data)
		} else {
			end += nl + 1
		}
		if line >= from {
			budget -= end
			err := parseAll(data[:end])
			if err != nil {
				got := err.Error()
				if m := yamlErrorRE.FindStringSubmatch(got); m != nil {
					got = m[2]
				}
				if strings.TrimPrefix(got, "yaml: ") == msg {
					return line
				}
			}
		}
		line++
	}
	return 0
}

// parseAll parses every document of data and returns the first error.
func parseAll(data []byte) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	for {
		var n yaml.Node
		if err := dec.Decode(&n); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// nopStore admits everything; Parse uses it to check rules with
// middleware.NewRules without starting a store.
type nopStore struct{}

func (nopStore) Take(context.Context, time.Time, []middleware.Charge, []middleware.Decision) (bool, error) {
	return true, nil
}

// Acquire, Release and Renew make nopStore a middleware.SlotStore, so that
// rules with a concurrency limit can be checked too.
func (nopStore) Acquire(context.Context, time.Time, *middleware.Slot) (bool, int, error) {
	return true, 1, nil
}

func (nopStore) Release(context.Context, *middleware.Slot) error { return nil }

func (nopStore) Renew(context.Context, time.Time, []*middleware.Slot) error { return nil }
