package middleware

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/adminauth"
)

// The /top, /rates and /health endpoints of AdminHandler, POST /bans, and
// the naming of clients by hash.

type adminTop struct {
	Rule        string           `json:"rule"`
	By          string           `json:"by"`
	Period      string           `json:"period"`
	K           int              `json:"k"`
	Total       uint64           `json:"total"`
	ErrorBound  uint64           `json:"error_bound"`
	Dropped     uint64           `json:"dropped"`
	Samples     uint64           `json:"samples"`
	Threshold   uint64           `json:"threshold"`
	Servers     int              `json:"servers"`
	ServerNames []string         `json:"server_names,omitempty"`
	LagMs       int64            `json:"lag_ms"`
	FleetError  string           `json:"fleet_error,omitempty"`
	At          string           `json:"at"`
	HashedKeys  bool             `json:"hashed_keys"`
	Clients     []adminTopClient `json:"clients"`
}

type adminTopClient struct {
	Key   string `json:"key"`
	Count uint64 `json:"count"`
	Error uint64 `json:"error"`
	// Low and High hold the client's true units with probability 99 %
	// (TopList.Bounds): [Count − Error, Count] widened by the sampling.
	Low        uint64 `json:"low_99"`
	High       uint64 `json:"high_99"`
	FirstSeen  string `json:"first_seen"`
	Banned     bool   `json:"banned"`
	BanUntil   string `json:"ban_until,omitempty"`
	Overridden bool   `json:"overridden"`
}

// serveTop answers GET /top?rule=R&by=denied|charged&period=1m|1h[&limit=N].
func (a *admin) serveTop(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	rule := q.Get("rule")
	if rule == "" {
		adminJSON(w, http.StatusBadRequest, map[string]string{"error": "rule is required"})
		return
	}
	by, period, limit, msg := topParams(q)
	if msg != "" {
		adminJSON(w, http.StatusBadRequest, map[string]string{"error": msg})
		return
	}
	l, err := a.lim.TopClients(r.Context(), rule, by, period, limit)
	if err != nil {
		if errors.Is(err, ErrUnknownRule) || errors.Is(err, ErrTopOff) {
			adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		} else {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
		}
		return
	}
	bans := map[string]time.Time{}
	if len(l.Clients) > 0 {
		list, _, err := a.lim.Bans(r.Context(), 0)
		if err == nil {
			for _, b := range list {
				if b.Rule == rule {
					bans[b.Key] = b.Until
				}
			}
		}
	}
	out := adminTop{Rule: rule, By: by.String(), Period: period.String(), K: l.K, Total: l.Total, ErrorBound: l.ErrorBound,
		Dropped: l.Dropped, Samples: l.Samples, Threshold: l.Threshold, Servers: l.Servers, ServerNames: l.ServerNames, LagMs: l.Lag.Milliseconds(),
		At: l.At.UTC().Format(time.RFC3339Nano), HashedKeys: len(a.cfg.HashKeys) > 0, Clients: make([]adminTopClient, len(l.Clients))}
	if l.FleetErr != nil {
		out.FleetError = "store unavailable: the list is this server's"
	}
	for i, c := range l.Clients {
		tc := adminTopClient{Key: a.show(c.Key), Count: c.Count, Error: c.Error, FirstSeen: c.FirstSeen.UTC().Format(time.RFC3339)}
		tc.Low, tc.High = l.Bounds(c, 0.99)
		if u, ok := bans[c.Key]; ok {
			tc.Banned, tc.BanUntil = true, u.UTC().Format(time.RFC3339)
		}
		_, tc.Overridden = a.lim.Override(rule, c.Key)
		out.Clients[i] = tc
	}
	adminJSON(w, http.StatusOK, out)
}

// topParams reads by, period and limit, or says what is wrong with them.
func topParams(q url.Values) (TopBy, TopPeriod, int, string) {
	by, period := TopDenied, TopMinute
	switch q.Get("by") {
	case "", "denied":
	case "charged":
		by = TopCharged
	default:
		return 0, 0, 0, "by must be denied or charged"
	}
	switch q.Get("period") {
	case "", "1m":
	case "1h":
		period = TopHour
	default:
		return 0, 0, 0, "period must be 1m or 1h"
	}
	limit := 0
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return 0, 0, 0, "limit must be a positive integer"
		}
		limit = n
	}
	return by, period, limit, ""
}

type adminRates struct {
	IntervalMs int64           `json:"interval_ms"`
	Rules      []adminRuleRate `json:"rules"`
}

type adminRuleRate struct {
	Rule   string           `json:"rule"`
	Points []adminRatePoint `json:"points"`
}

type adminRatePoint struct {
	Start        int64  `json:"start"`
	Allowed      uint64 `json:"allowed"`
	Denied       uint64 `json:"denied"`
	AllowedUnits uint64 `json:"allowed_units"`
	DeniedUnits  uint64 `json:"denied_units"`
}

// serveRates answers GET /rates.
func (a *admin) serveRates(w http.ResponseWriter) {
	rates, err := a.lim.Rates()
	if err != nil {
		adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	}
	out := adminRates{Rules: make([]adminRuleRate, len(rates))}
	for i, rr := range rates {
		out.IntervalMs = rr.Interval.Milliseconds()
		pts := make([]adminRatePoint, len(rr.Points))
		for j, p := range rr.Points {
			pts[j] = adminRatePoint{Start: p.Start.UnixMilli(), Allowed: p.Allowed, Denied: p.Denied, AllowedUnits: p.AllowedUnits, DeniedUnits: p.DeniedUnits}
		}
		out.Rules[i] = adminRuleRate{Rule: rr.Rule, Points: pts}
	}
	adminJSON(w, http.StatusOK, out)
}

type adminHealth struct {
	Store       string         `json:"store"`
	BreakerOpen bool           `json:"breaker_open"`
	Servers     []adminServer  `json:"servers"`
	Sync        *adminSync     `json:"sync,omitempty"`
	Regions     []adminRegion  `json:"regions"`
	Top         adminTopHealth `json:"top"`
}

type adminServer struct {
	Server string `json:"server"`
	Up     bool   `json:"up"`
	Error  string `json:"error,omitempty"`
	// OutOfMemory: the server refuses writes (OOM); MayEvict: its
	// maxmemory-policy may evict counters; Policy, MaxMemory and Evicted
	// are its figures when last read ("" and -1 when unknown).
	OutOfMemory bool   `json:"out_of_memory,omitempty"`
	MayEvict    bool   `json:"may_evict,omitempty"`
	Policy      string `json:"maxmemory_policy,omitempty"`
	MaxMemory   int64  `json:"maxmemory,omitempty"`
	Evicted     int64  `json:"evicted_keys"`
}

type adminSync struct {
	At         string `json:"at"`
	AgeMs      int64  `json:"age_ms"`
	Calls      int    `json:"calls"`
	DurationMs int64  `json:"duration_ms"`
	Error      string `json:"error,omitempty"`
}

type adminRegion struct {
	Peer      string `json:"peer"`
	Reachable bool   `json:"reachable"`
	Failing   bool   `json:"failing"`
	LastSync  string `json:"last_sync"`
	LagMs     int64  `json:"lag_ms"`
}

type adminTopHealth struct {
	Server    string `json:"server,omitempty"`
	Published string `json:"published,omitempty"`
	AgeMs     int64  `json:"age_ms,omitempty"`
	Error     string `json:"error,omitempty"`
}

// serveHealth answers GET /health.
func (a *admin) serveHealth(w http.ResponseWriter) {
	h := a.lim.Health()
	now := time.Now()
	out := adminHealth{Store: h.Store, BreakerOpen: h.BreakerOpen, Servers: []adminServer{}, Regions: []adminRegion{}}
	for _, s := range h.Servers {
		as := adminServer{Server: s.Server, Up: s.Up, OutOfMemory: s.OutOfMemory, MayEvict: s.Memory.MayEvict(),
			Policy: s.Memory.Policy, MaxMemory: s.Memory.MaxMemory, Evicted: s.Memory.Evicted}
		if s.Memory.CheckedAt.IsZero() {
			as.Evicted = -1
		}
		if s.Cause != nil {
			as.Error = s.Cause.Error()
		}
		out.Servers = append(out.Servers, as)
	}
	if s := h.Sync; s != nil {
		out.Sync = &adminSync{At: s.At.UTC().Format(time.RFC3339Nano), AgeMs: now.Sub(s.At).Milliseconds(), Calls: s.Calls, DurationMs: s.Duration.Milliseconds()}
		if s.Err != nil {
			out.Sync.Error = s.Err.Error()
		}
	}
	for _, p := range h.Regions {
		out.Regions = append(out.Regions, adminRegion{Peer: p.Peer, Reachable: p.Reachable, Failing: p.Failing,
			LastSync: p.LastSync.UTC().Format(time.RFC3339Nano), LagMs: max(now.Sub(p.LastSync).Milliseconds(), 0)})
	}
	out.Top.Server = h.TopServer
	if !h.TopPublished.IsZero() {
		out.Top.Published, out.Top.AgeMs = h.TopPublished.UTC().Format(time.RFC3339Nano), now.Sub(h.TopPublished).Milliseconds()
	}
	if h.TopErr != nil {
		out.Top.Error = "store unavailable"
	}
	adminJSON(w, http.StatusOK, out)
}

// serveBan answers POST /bans?rule=R&key=K[&for=D].
func (a *admin) serveBan(w http.ResponseWriter, r *http.Request, rule, key string) {
	var d time.Duration
	if s := r.URL.Query().Get("for"); s != "" {
		var err error
		if d, err = time.ParseDuration(s); err != nil || d <= 0 {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": "for must be a positive duration such as 10m"})
			return
		}
	}
	until, err := a.lim.Ban(r.Context(), rule, key, d)
	switch {
	case errors.Is(err, ErrCannotBan):
		adminJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	case err != nil && !errors.Is(err, ErrStore) && !errors.Is(err, ErrUnknownRule):
		adminJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
	case err != nil:
		adminError(w, err)
	default:
		adminJSON(w, http.StatusOK, map[string]any{"rule": rule, "key": a.show(key), "until": until.UTC().Format(time.RFC3339)})
	}
}

// errNoClient is the error of a hash= that names no client the handler
// knows.
var errNoClient = errors.New("no client with this hash among the rule's top clients, bans and overrides")

// clientKey returns the client a request names under rule: key=, or, with
// AdminConfig.HashKeys, hash= (the keyed hash the handler shows), found
// among the rule's top clients, bans and overrides. "" with no error when
// the request names none.
func (a *admin) clientKey(ctx context.Context, q url.Values, rule string) (string, error) {
	if key := q.Get("key"); key != "" || len(a.cfg.HashKeys) == 0 {
		return key, nil
	}
	h := q.Get("hash")
	if h == "" {
		return "", nil
	}
	match := func(key string) bool { return adminauth.KeyHash(a.cfg.HashKeys, key) == h }
	for _, by := range []TopBy{TopDenied, TopCharged} {
		for _, p := range []TopPeriod{TopMinute, TopHour} {
			l, err := a.lim.TopClients(ctx, rule, by, p, 0)
			if err != nil {
				break
			}
			for _, c := range l.Clients {
				if match(c.Key) {
					return c.Key, nil
				}
			}
		}
	}
	if bans, _, err := a.lim.Bans(ctx, 0); err == nil {
		for _, b := range bans {
			if b.Rule == rule && match(b.Key) {
				return b.Key, nil
			}
		}
	}
	for _, o := range a.lim.Overrides() {
		if o.Rule == rule && match(o.Key) {
			return o.Key, nil
		}
	}
	return "", errNoClient
}
