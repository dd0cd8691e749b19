// Package config loads a Limiter's rules from a YAML (or JSON) file, or
// from a rules service (an HTTP(S) URL or a key in Redis), and reloads them
// while the server runs. It also reads the configuration files of the
// Envoy (Lyft) ratelimit service.
//
// A file lists rules; each says which requests it matches, who they are
// counted against and how much they may do:
//
//	rules:
//	  - name: api
//	    match: {path: "/api/*"}
//	    key: user_or_ip
//	    limits: [{requests: 100, window: 1m}]
//	  - name: login
//	    match: {path: "/api/login", methods: [POST]}
//	    key: ip
//	    limits: [{requests: 5, window: 5m}]
//
// Every rule of the file becomes a middleware.Rule, and every rule that
// matches a request applies. The file format (every field, the key names
// such as ip, user_or_ip and api_key|ip, the algorithms, plans, errors and
// reloading) is documented once, in [docs/rules.md]; rules sources and
// Envoy descriptor files are in [docs/rules-sources.md]. A rule's fields
// reach every capability of middleware.Rule, each with its own page:
// algorithms and concurrency (docs/algorithms.md), counting by outcome
// and bans (docs/logins.md), usage limits settled after the response
// (docs/usage.md), fleet modes (docs/fleet.md), scopes across regions
// (docs/regions.md), elastic limits and adaptive concurrency
// (docs/overload.md), and top clients (docs/operations.md).
//
// Open loads a file, builds a Limiter and returns a Reloader; Load and
// Parse only read a file or a document into a Document, and NewReloader
// keeps a Limiter built from such a Document in step with its file. A
// Reloader re-reads its file on request (Reload, say on SIGHUP) or when it
// changes (Check, Watch), and swaps the rules of its Limiter with
// middleware.Limiter.SetRules: requests in flight finish under the rules
// they started with, and counters of rules whose name and windows did not
// change carry on. A document that does not load leaves the rules in force
// and is reported. Only rules are reloaded: headers is a construction-time
// setting of the Limiter, and a reload that changes it is rejected.
//
// OpenSource reads the rules from a Source instead (HTTPSource, RedisSource
// or FileSource) and keeps them in step, with SourceOptions for the poll
// interval, back-off and a cache of the last good document; PublishRedis
// is the writer's side of RedisSource. A document with a top-level domain
// field is read as an Envoy ratelimit configuration.
//
// Errors name the file (or source), the line and the field, and are of
// type *Error, or several joined with errors.Join:
//
//	rules.yaml:7: rules[1].limits[0].window: bad duration "5x"
//
// Parsed with Env.RateLimitService, a descriptor file is that of a rate
// limit service (the module adapters/envoyrls serves it over Envoy's gRPC
// API): any descriptor key is accepted, and its rules match the
// descriptors of a DescriptorRequest, entry by entry, as the Envoy service
// matches them, never an HTTP request.
//
// [docs/rules.md]: https://github.com/sluicehq/sluice/blob/main/docs/rules.md
// [docs/rules-sources.md]: https://github.com/sluicehq/sluice/blob/main/docs/rules-sources.md
package config
