package middleware

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"
)

// AdminConfig configures AdminHandler.
type AdminConfig struct {
	// Authorize decides whether a request may use the handler. It is
	// required: without it every request is refused with 403, so that an
	// admin handler mounted by mistake exposes nothing. Check a token, a
	// client certificate or the peer address, as the deployment allows.
	Authorize func(r *http.Request) bool
	// Source, if set, reports where the rules in force come from and
	// their version (for example a file and its SHA-256, as
	// config.Reloader's Config reports them), shown by GET /rules.
	Source func() (source, version string)
	// HashKeys, if set, is the secret of a keyed hash shown in place of
	// every client key the handler answers with (top clients, bans,
	// overrides), for keys that are personal data: "h:" and 16 base64url
	// characters of HMAC-SHA256(HashKeys, key). Requests then name a
	// client by hash=H (one the handler showed, found among the rule's
	// top clients, bans and overrides) instead of key=K.
	HashKeys []byte
	// SignIn is how long a browser stays signed in to the operator page
	// (DefaultAdminSignIn if 0).
	SignIn time.Duration
}

// AdminHandler returns an http.Handler for operating lim: an operator page
// at its root, and JSON endpoints, which the page reads:
//
//	GET    /                             the operator page (HTML; signs in with POST /session)
//	GET    /rules                        the rules in force, with their source and version
//	GET    /limits?rule=R&key=K          where each limit of rule R stands for key K (Peek)
//	POST   /reset?key=K[&rule=R]         drop K's counters under R, or under every rule (Reset)
//	GET    /top?rule=R[&by=denied|charged][&period=1m|1h][&limit=N]   R's top clients (TopClients)
//	GET    /rates                        each rule's allowed and denied requests, 10 s apart, over 15 min (Rates)
//	GET    /health                       the store's health: breaker, Redis servers, syncers, regions (Health)
//	GET    /bans[?limit=N]               the bans in force (the fleet's, with Redis), soonest to end first
//	POST   /bans?rule=R&key=K[&for=D]    ban a client (Ban; R must have a limit with a ban)
//	DELETE /bans?rule=R&key=K            lift a ban (LiftBan)
//	GET    /overrides[?rule=R&key=K]     the overrides in force, or the one of R for K
//	PUT    /overrides?rule=R&key=K       set one (SetOverride)
//	DELETE /overrides?rule=R&key=K       remove one (RemoveOverride)
//	GET, POST, DELETE /session           whether a browser is signed in; sign in with {"token": "…"}; sign out
//
// The body of PUT /overrides is {"limits": [{"requests": 100, "window":
// "1m"}], "ttl": "24h"}: each limit may also have "algorithm"
// (sliding_window, fixed_window, sliding_log, token_bucket, leaky_bucket),
// "burst", "max_delay" and "ban"; "ttl", if given, ends the override that
// long from now. Bad input gets 400 with the reason and an unknown rule
// 404; neither changes anything.
//
// Keys are written as the rules' key functions produce them
// ("ip:192.0.2.1", "user:alice"), or as keyed hashes with
// cfg.HashKeys. Every request but those of the page, its assets and
// /session is refused (403) unless cfg.Authorize is set and approves it:
// as it came, or, from a browser signed in on the page, with the token it
// signed in with as its "Authorization: Bearer" header. That token is
// kept in an HttpOnly, SameSite=Strict cookie, never in a URL. Requests
// that change state (POST, PUT, DELETE) are refused when the browser says
// they come from another origin (Origin, Sec-Fetch-Site) and, when the
// cookie authorizes them, unless they carry the anti-forgery token of GET
// /session in X-CSRF-Token. Mount the handler with http.StripPrefix under
// a path of its own, on a listener that is not public.
func AdminHandler(lim *Limiter, cfg AdminConfig) http.Handler {
	a := &admin{lim: lim, cfg: cfg}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := "/" + strings.TrimLeft(r.URL.Path, "/")
		if a.servePublic(w, r, path) {
			return
		}
		au := a.authorize(r)
		if !au.ok {
			adminJSON(w, http.StatusForbidden, map[string]string{"error": "forbidden"})
			return
		}
		if forged(w, r, au) {
			return
		}
		a.serve(w, r, path)
	})
}

// serve answers an authorized request.
func (a *admin) serve(w http.ResponseWriter, r *http.Request, path string) {
	lim, cfg, q := a.lim, a.cfg, r.URL.Query()
	switch {
	case path == "/rules" && r.Method == http.MethodGet:
		out := adminRules{}
		if cfg.Source != nil {
			out.Source, out.Version = cfg.Source()
		}
		for _, rule := range lim.Rules() {
			out.Rules = append(out.Rules, describeRule(rule))
		}
		adminJSON(w, http.StatusOK, out)
	case path == "/limits" && r.Method == http.MethodGet:
		rule := q.Get("rule")
		key, err := a.clientKey(r.Context(), q, rule)
		if err != nil {
			adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		if rule == "" || key == "" {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": "rule and key are required"})
			return
		}
		states, err := lim.Peek(r.Context(), rule, key)
		if err != nil {
			adminError(w, err)
			return
		}
		out := make([]adminLimit, len(states))
		for i, s := range states {
			out[i] = adminLimit{Policy: s.Policy, Limit: describeLimit(s.Limit), Remaining: s.Remaining,
				ResetAfterMs: s.ResetAfter.Milliseconds(), NextAfterMs: s.NextAfter.Milliseconds()}
		}
		adminJSON(w, http.StatusOK, map[string]any{"rule": rule, "key": a.show(key), "limits": out})
	case path == "/reset" && r.Method == http.MethodPost:
		rule := q.Get("rule")
		key, err := a.clientKey(r.Context(), q, rule)
		if err != nil {
			adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			return
		}
		if key == "" {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": "key is required"})
			return
		}
		if err := lim.Reset(r.Context(), rule, key); err != nil {
			adminError(w, err)
			return
		}
		adminJSON(w, http.StatusOK, map[string]string{"reset": a.show(key), "rule": rule})
	case path == "/top" && r.Method == http.MethodGet:
		a.serveTop(w, r)
	case path == "/rates" && r.Method == http.MethodGet:
		a.serveRates(w)
	case path == "/health" && r.Method == http.MethodGet:
		a.serveHealth(w)
	case path == "/bans" || path == "/overrides": // adminclients.go
		a.serveClients(w, r, path)
	case path == "/rules" || path == "/limits" || path == "/reset" || path == "/top" || path == "/rates" || path == "/health":
		adminJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed"})
	default:
		adminJSON(w, http.StatusNotFound, map[string]string{"error": "not found"})
	}
}

type adminRules struct {
	Source  string      `json:"source,omitempty"`
	Version string      `json:"version,omitempty"`
	Rules   []adminRule `json:"rules"`
}

type adminRule struct {
	Name        string        `json:"name"`
	Path        string        `json:"path,omitempty"`
	Methods     []string      `json:"methods,omitempty"`
	Limits      []adminLimDef `json:"limits,omitempty"`
	Plans       bool          `json:"plans,omitempty"`
	Concurrency int           `json:"concurrency,omitempty"`
	Cost        int           `json:"cost,omitempty"`
	Overage     float64       `json:"overage,omitempty"`
	Shadow      bool          `json:"shadow,omitempty"`
}

type adminLimDef struct {
	Requests   int    `json:"requests"`
	Window     string `json:"window"`
	Algorithm  string `json:"algorithm"`
	Burst      int    `json:"burst,omitempty"`
	TimeZone   string `json:"time_zone,omitempty"`
	MaxDelayMs int64  `json:"max_delay_ms,omitempty"`
	Ban        string `json:"ban,omitempty"`
}

type adminLimit struct {
	Policy       string      `json:"policy"`
	Limit        adminLimDef `json:"limit"`
	Remaining    int         `json:"remaining"`
	ResetAfterMs int64       `json:"reset_after_ms"`
	NextAfterMs  int64       `json:"next_after_ms"`
}

func describeRule(r Rule) adminRule {
	out := adminRule{Name: r.Name, Path: r.Path, Methods: r.Methods, Plans: r.LimitsFunc != nil,
		Concurrency: r.Concurrency, Cost: r.Cost, Overage: r.Overage, Shadow: r.Shadow}
	for _, l := range r.Limits {
		out.Limits = append(out.Limits, describeLimit(l))
	}
	return out
}

func describeLimit(l Limit) adminLimDef {
	d := adminLimDef{Requests: l.Requests, Window: windowName(l), Algorithm: l.Algorithm.String(), Burst: l.Burst,
		MaxDelayMs: l.MaxDelay.Milliseconds()}
	if l.Location != nil {
		d.TimeZone = l.Location.String()
	}
	if l.Ban > 0 {
		d.Ban = l.Ban.String()
	}
	return d
}

func adminError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrUnknownRule):
		adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
	default:
		adminJSON(w, http.StatusServiceUnavailable, map[string]string{"error": "store unavailable"})
	}
}

func adminJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", ContentTypeJSON)
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
