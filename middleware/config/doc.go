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
// Every rule that matches a request applies, as with middleware.Rule, which
// each rule of the file becomes. The whole schema, field by field:
//
//	headers: both          # optional: both (default), legacy, draft or none
//	shadow: false          # optional: true makes every rule a shadow rule
//	unmatched: allow       # optional: allow (default) or deny (503) requests no rule applies to
//	allow:                 # optional: never limited by any rule
//	  cidrs: [203.0.113.0/24, 2001:db8::/32]
//	  keys: ["user:ops"]
//	rules:                 # required, at least one
//	  - name: uploads      # required, [A-Za-z0-9_.-]{1,64}, unique
//	    match:             # optional; without it the rule matches everything
//	      path: /upload/*  # "", "/*", "/exact", "/prefix/*", "/users/{id}/posts"
//	      methods: [POST]  # optional, standard methods only, any case
//	      headers: {X-Tenant: gold}  # optional, exact first values, names in any case
//	      query: {plan: free}        # optional, exact first values, unescaped
//	    key: user_or_ip    # required, see below
//	    algorithm: sliding_window # optional, the default for its limits
//	    time_zone: UTC     # optional, the default for its calendar windows
//	    limits:            # required, one limit per window
//	      - {requests: 20, window: 1h}
//	      - requests: 4            # required, 1 to 2^50
//	        window: 1s             # required: a duration or a calendar period
//	        algorithm: token_bucket  # optional, overrides the rule's
//	        burst: 8               # token_bucket only: capacity (default requests)
//	      - {requests: 3, window: calendar_day, time_zone: Europe/Paris}
//	      - {requests: 5, window: 5m, algorithm: sliding_log, max_log: 1000}
//	      - {requests: 2, window: 1s, algorithm: leaky_bucket, burst: 10, max_delay: 5s}
//	    concurrency: 2     # optional, requests of one key in flight at once
//	    concurrency_status: 429  # optional, 429 (default) or 503
//	    cost: 1            # optional, units each request consumes (>= 1)
//	    overage: 0.1       # optional, fraction admitted over each limit (0 to 10)
//	    shadow: false      # optional, count and report but never deny
//	    allow: {cidrs: [], keys: []}   # optional, merged with the top-level allow
//	    plans:             # optional, limits per plan (Env.Plan names the plan)
//	      pro: [{requests: 200, window: 1h}]
//
// Windows are Go durations ("500ms", "1m", "1h30m"), whole days ("1d",
// "30d") or whole weeks ("1w"), positive, a whole number of milliseconds
// and at most 3660 days. Requests are integers from 1 to 2^50, so that
// "1000000 per 30d" and "1000000000 per 1h" are ordinary limits. Requests
// and cost are integers; a quoted number is an error. Cost may not exceed
// any limit of the rule or of its plans (a token bucket's burst): such a
// rule could never admit a request.
//
// # Algorithms
//
// algorithm, on a limit or on the rule for all its limits, chooses how the
// limit counts (the README's "Choosing an algorithm" compares them):
//
//   - sliding_window (the default): a count per window and a weighted share
//     of the previous one; at most requests + 1 in any interval of one
//     window, at constant memory.
//   - token_bucket: refills requests tokens per window into a bucket of
//     burst tokens (burst defaults to requests); a request spends a token
//     per unit of cost. "4 a second, bursts of 8" is
//     {requests: 4, window: 1s, algorithm: token_bucket, burst: 8}.
//   - fixed_window: a count per window, renewed whole when the window
//     ends. A duration's windows are aligned to the Unix epoch (1d renews
//     at 00:00 UTC); window: calendar_day, calendar_week (from Monday) or
//     calendar_month renews at midnight in time_zone (an IANA name such as
//     Europe/Paris; UTC by default), however long the day or month is. A
//     calendar window implies fixed_window.
//   - sliding_log: one entry per admitted request, exact: never more than
//     requests in any interval of one window. Its memory per client grows
//     with requests, so requests may not exceed 1000 unless max_log raises
//     that bound (up to 100000), which says the memory is accepted.
//   - leaky_bucket: a queue released at requests per window; an early
//     request waits for its turn (Decide holds it) if at most burst wait
//     ahead of it (burst defaults to requests) and its wait is at most
//     max_delay (a duration; none by default), and is denied otherwise.
//
// A rule's concurrency limits how many requests of one key may be in
// flight at once (the README's "Concurrency limits and queueing"); a rule
// may have it alone, without limits.
//
// burst is accepted only with token_bucket and leaky_bucket, max_delay only
// with leaky_bucket, max_log only with sliding_log,
// and time_zone only with a calendar window (on the rule, only if one of
// its limits has one). A limit's counter is kept per rule, key, window and
// algorithm: changing a limit's algorithm (or a calendar window's time
// zone) on reload starts its counters afresh, and leaves the other limits'
// counters as they were.
//
// # Keys
//
// The key names who a request is counted against. The names are those of
// the keyfunc built-ins, set up from the Env the program supplies:
//
//   - ip: the client address: keyfunc.RemoteIP, or keyfunc.ClientIP when
//     Env.TrustedProxies is set.
//   - user_id: keyfunc.User(Env.User); Env.User is required.
//   - api_key: keyfunc.APIKey(Env.APIKeyHeader, Env.APIKeySecret).
//   - header:<Name>: keyfunc.Header(Name), as in header:X-Tenant.
//   - route, method, global: keyfunc.Route, keyfunc.Method, keyfunc.Global.
//   - user_or_ip: the user if authenticated, else the address; the same as
//     user_id|ip.
//   - any name in Env.Keys, which may also replace a built-in name.
//
// Names combine: a|b is keyfunc.First(a, b), the first that finds a key
// (api_key|ip), and a+b is keyfunc.Join(a, b), a counter per combination
// (ip+route). | binds tighter than +, so user_id|ip+route counts each user,
// or else each address, per route. Header names in key expressions cannot
// contain '+' or '|'.
//
// A request for which a rule finds no key (an anonymous request under
// user_id, a missing API key) is answered by the Limiter's NoKeyPolicy: 400
// by default. Fall back to the address (user_or_ip, api_key|ip) to limit
// such requests instead.
//
// # Plans
//
// A rule with plans gets a Rule.LimitsFunc that calls Env.Plan with the
// request and its key and returns that plan's limits, from memory; the
// rule's limits apply to every request whose plan has no entry (the default
// plan). Counters are kept per rule, key, window and algorithm, so a
// client whose plan changes keeps its count for the windows both plans
// share.
//
// # Errors
//
// Parse and Load reject anything they do not understand, naming the file,
// the line and the field:
//
//	rules.yaml:7: rules[1].limits[0].window: bad duration "5x"
//	rules.yaml:3: rules[0].kye: unknown field (want name, match, key, ...)
//
// The error is an *Error, or several joined with errors.Join when the file
// has more than one problem; errors.As finds the first.
//
// # Requests no rule applies to
//
// A request that no rule matches (by path, methods, headers and query)
// passes unlimited, unless the file says unmatched: deny, which answers it
// with 503 Service Unavailable (middleware.WithUnmatched). The setting is
// reloadable and, when present, wins over the program's WithUnmatched; a
// reload of a file without it goes back to allow, or to the program's
// setting when the first file loaded did not set it.
//
// # Reloading
//
// A Reloader re-reads the file on request (Reload, say on SIGHUP) or when it
// changes (Check, Watch), and swaps the rules of its Limiter with
// middleware.Limiter.SetRules: requests in flight finish under the rules
// they started with, and counters of rules whose name and windows did not
// change carry on. A file that does not load is rejected with an error and
// the rules in force stay. Only rules are reloaded: headers is a
// construction-time setting of the Limiter, and a reload that changes it is
// rejected, as is one that fails to load.
//
// # Rules from a rules service
//
// OpenSource reads the rules from a Source instead of a file and returns a
// Reloader whose Watch keeps them in step: HTTPSource polls a URL with
// conditional requests (ETag, Last-Modified), RedisSource reads a hash at
// a key and reloads as soon as PublishRedis announces a new document on
// the key's pub/sub channel, polling as a backstop, and FileSource reads a
// file. Polls are spread by SourceOptions.Jitter, and back off
// exponentially while the source cannot be read. Every document goes
// through Parse, so errors name the source as the file:
//
//	config: https://rules.internal/sluice.yaml: GET: unexpected status 500 Internal Server Error
//	https://rules.internal/sluice.yaml:7: rules[1].limits[0].window: bad duration "5x"
//	redis:sluice:rules:3: rules[0].key: unknown key name "nobody" (want ip, ...)
//
// A document that cannot be read or does not load leaves the rules in
// force, and is reported once. SourceOptions.CachePath keeps the last good
// document on disk (written atomically), and OpenSource starts from it when
// the source cannot be read at start; without it, OpenSource fails and
// says so. Reloader.Status and SourceOptions.OnStatus report the source's
// state: the version in force, the last good load, the last attempt, the
// failures in a row and the last error.
//
// # Envoy/Lyft descriptor files
//
// A document with a top-level domain field is a configuration of the Envoy
// ratelimit service, read as rules:
//
//	domain: edge_proxy_per_ip           # required
//	headers: both                       # optional, as in a rules file
//	unmatched: allow                    # optional, as in a rules file
//	descriptors:                        # required, at least one
//	  - key: remote_address             # required: see the mapping below
//	    value: 50.0.0.5                 # optional: exact, or a prefix ending in *
//	    rate_limit:                     # optional
//	      unit: second                  # second, minute, hour or day
//	      requests_per_unit: 0          # 0 denies every request
//	      unlimited: false              # true: applies without a limit
//	      name: blocked                 # optional rule name
//	      replaces: [{name: other}]     # the named rule gives way here
//	    shadow_mode: false              # count and report, never deny
//	    detailed_metric: false          # accepted, ignored
//	    descriptors: []                 # nested: limited by the combination
//
// The descriptor keys stand for request attributes: remote_address is the
// client address as the key name ip gives it (Env.TrustedProxies applies,
// as Envoy's remote_address uses the trusted X-Forwarded-For hops; IPv6
// by /64), path the cleaned path, method the method, user (or user_id)
// Env.User, api_key the API key header, header:<Name> a header,
// query:<name> a query parameter, a key of Env.DescriptorHeaders the
// header it names (as Envoy's request_headers action does) and a key of
// Env.Descriptors the program's function. Any other key is an error.
//
// Each descriptor with a rate_limit, or with neither a rate_limit nor
// descriptors (allowlisted, as in Envoy), becomes a rule named by its
// rate_limit's name or else domain.key_value.key (as Envoy names its
// stats). The rule applies to a request that has every attribute along
// the descriptor's path, equal to its value where one is given; at each
// level an exact value is tried first, then a wildcard, then the key
// alone, as Envoy does. Levels without a value are counted per value, by
// the combination when nested (keyfunc.Join). Limits are fixed windows of
// one unit aligned to the epoch, as Envoy counts; requests_per_unit: 0
// makes a middleware.Rule with Deny, and unlimited: true a rule that
// applies without a limit.
package config
