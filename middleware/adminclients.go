package middleware

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/window"
)

// The /bans and /overrides endpoints of AdminHandler.

// maxAdminBody bounds the body of a PUT /overrides.
const maxAdminBody = 64 << 10

type adminBan struct {
	Rule        string `json:"rule"`
	Key         string `json:"key"`
	Until       string `json:"until"`
	SecondsLeft int64  `json:"seconds_left"`
}

type adminOverride struct {
	Rule   string        `json:"rule"`
	Key    string        `json:"key"`
	Limits []adminLimDef `json:"limits"`
	Until  string        `json:"until,omitempty"`
}

// adminLearned is a budget learned of an upstream (Limiter.Learned), as
// GET /overrides lists it beside the overrides.
type adminLearned struct {
	Rule       string        `json:"rule"`
	Key        string        `json:"key"`
	Unit       string        `json:"unit"`
	Limits     []adminLimDef `json:"limits"`
	Configured []adminLimDef `json:"configured"`
	Pace       *adminLimDef  `json:"pace,omitempty"`
	Quotas     []adminQuota  `json:"quotas,omitempty"`
	SpreadMs   float64       `json:"spread_ms"`
	Fraction   float64       `json:"fraction"`
	Cuts       int64         `json:"cuts"`
	CutAt      string        `json:"cut_at,omitempty"`
}

type adminQuota struct {
	Units  int64  `json:"units"`
	Window string `json:"window,omitempty"`
	Margin int64  `json:"margin"`
}

// describeLearned describes l for the admin API.
func (a *admin) describeLearned(l Learned) adminLearned {
	out := adminLearned{Rule: l.Rule, Key: a.show(l.Key), Unit: l.Unit, SpreadMs: float64(l.Spread.Microseconds()) / 1000,
		Fraction: l.Fraction, Cuts: l.Cuts}
	for _, x := range l.Limits {
		out.Limits = append(out.Limits, describeLimit(x))
	}
	for _, x := range l.Configured {
		out.Configured = append(out.Configured, describeLimit(x))
	}
	if l.Pace.Requests > 0 {
		p := describeLimit(l.Pace)
		out.Pace = &p
	}
	for i, q := range l.Quotas {
		aq := adminQuota{Units: q.Units, Margin: l.Margins[i]}
		if q.Window > 0 {
			aq.Window = q.Window.String()
		}
		out.Quotas = append(out.Quotas, aq)
	}
	if !l.CutAt.IsZero() {
		out.CutAt = l.CutAt.UTC().Format(time.RFC3339)
	}
	return out
}

// adminOverrideBody is the body of PUT /overrides.
type adminOverrideBody struct {
	Limits []adminLimitIn `json:"limits"`
	TTL    string         `json:"ttl,omitempty"`
}

type adminLimitIn struct {
	Requests  int    `json:"requests"`
	Window    string `json:"window"`
	Algorithm string `json:"algorithm,omitempty"`
	Burst     int    `json:"burst,omitempty"`
	MaxDelay  string `json:"max_delay,omitempty"`
	Ban       string `json:"ban,omitempty"`
}

// serveClients answers the /bans and /overrides endpoints.
func (a *admin) serveClients(w http.ResponseWriter, r *http.Request, path string) {
	lim, q := a.lim, r.URL.Query()
	rule := q.Get("rule")
	key, err := a.clientKey(r.Context(), q, rule)
	if err != nil {
		adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
		return
	}
	needBoth := func() bool {
		if rule == "" || key == "" {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": "rule and key are required"})
			return false
		}
		return true
	}
	now := lim.localNow(lim.clock())
	switch {
	case path == "/bans" && r.Method == http.MethodGet:
		limit := 0
		if s := q.Get("limit"); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				adminJSON(w, http.StatusBadRequest, map[string]string{"error": "limit must be a positive integer"})
				return
			}
			limit = n
		}
		bans, total, err := lim.Bans(r.Context(), limit)
		if err != nil {
			adminError(w, err)
			return
		}
		out := make([]adminBan, len(bans))
		for i, b := range bans {
			out[i] = adminBan{Rule: b.Rule, Key: a.show(b.Key), Until: b.Until.UTC().Format(time.RFC3339),
				SecondsLeft: int64((b.Until.Sub(now) + time.Second - 1) / time.Second)}
		}
		adminJSON(w, http.StatusOK, map[string]any{"bans": out, "total": total})
	case path == "/bans" && r.Method == http.MethodPost:
		if needBoth() {
			a.serveBan(w, r, rule, key)
		}
	case path == "/bans" && r.Method == http.MethodDelete:
		if !needBoth() {
			return
		}
		lifted, err := lim.LiftBan(r.Context(), rule, key)
		if err != nil {
			adminError(w, err)
			return
		}
		adminJSON(w, http.StatusOK, map[string]any{"rule": rule, "key": a.show(key), "lifted": lifted})
	case path == "/overrides" && r.Method == http.MethodGet:
		if rule == "" && key == "" {
			list := lim.Overrides()
			out := make([]adminOverride, len(list))
			for i, o := range list {
				out[i] = a.describeOverride(o)
			}
			learned := lim.Learned()
			ls := make([]adminLearned, len(learned))
			for i, l := range learned {
				ls[i] = a.describeLearned(l)
			}
			adminJSON(w, http.StatusOK, map[string]any{"overrides": out, "learned": ls})
			return
		}
		if !needBoth() {
			return
		}
		o, ok := lim.Override(rule, key)
		if !ok {
			adminJSON(w, http.StatusNotFound, map[string]string{"error": "no override of rule " + strconv.Quote(rule) + " for this key"})
			return
		}
		adminJSON(w, http.StatusOK, a.describeOverride(o))
	case path == "/overrides" && r.Method == http.MethodPut:
		if !needBoth() {
			return
		}
		o, err := readOverride(r, rule, key, now)
		if err != nil {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		if err := lim.SetOverride(r.Context(), o); err != nil {
			switch {
			case errors.Is(err, ErrUnknownRule):
				adminJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
			case errors.Is(err, ErrStore):
				adminError(w, err)
			default:
				adminJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			}
			return
		}
		adminJSON(w, http.StatusOK, a.describeOverride(o))
	case path == "/overrides" && r.Method == http.MethodDelete:
		if !needBoth() {
			return
		}
		removed, err := lim.RemoveOverride(r.Context(), rule, key)
		if err != nil {
			adminError(w, err)
			return
		}
		adminJSON(w, http.StatusOK, map[string]any{"rule": rule, "key": a.show(key), "removed": removed})
	default:
		adminJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed"})
	}
}

// readOverride decodes the body of PUT /overrides.
func readOverride(r *http.Request, rule, key string, now time.Time) (Override, error) {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	var body adminOverrideBody
	if err := dec.Decode(&body); err != nil {
		return Override{}, fmt.Errorf("sluice: override body: %v", err)
	}
	o := Override{Rule: rule, Key: key}
	if body.TTL != "" {
		d, err := time.ParseDuration(body.TTL)
		if err != nil || d <= 0 {
			return Override{}, fmt.Errorf("sluice: override body: ttl %q: want a positive duration such as 24h", body.TTL)
		}
		o.Until = now.Add(d)
	}
	for i, in := range body.Limits {
		l := Limit{Requests: in.Requests, Burst: in.Burst}
		var err error
		field := func(name, s string) time.Duration {
			if s == "" || err != nil {
				return 0
			}
			d, perr := time.ParseDuration(s)
			if perr != nil {
				err = fmt.Errorf("sluice: override body: limits[%d].%s %q: want a duration such as 1m", i, name, s)
			}
			return d
		}
		if in.Window == "" {
			return Override{}, fmt.Errorf("sluice: override body: limits[%d].window is required", i)
		}
		l.Window = field("window", in.Window)
		l.MaxDelay = field("max_delay", in.MaxDelay)
		l.Ban = field("ban", in.Ban)
		if err != nil {
			return Override{}, err
		}
		if in.Algorithm != "" {
			a, err := window.ParseAlgorithm(in.Algorithm)
			if err != nil {
				return Override{}, fmt.Errorf("sluice: override body: limits[%d].algorithm: %v", i, err)
			}
			l.Algorithm = Algorithm(a)
		}
		o.Limits = append(o.Limits, l)
	}
	return o, nil
}

func (a *admin) describeOverride(o Override) adminOverride {
	out := adminOverride{Rule: o.Rule, Key: a.show(o.Key)}
	for _, l := range o.Limits {
		out.Limits = append(out.Limits, describeLimit(l))
	}
	if !o.Until.IsZero() {
		out.Until = o.Until.UTC().Format(time.RFC3339)
	}
	return out
}
