package middleware_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// TestUnmatched checks both policies, SetUnmatched and the outcome
// reported for each request.
func TestUnmatched(t *testing.T) {
	t.Parallel()
	var outcomes []middleware.Outcome
	rules := []middleware.Rule{{Name: "api", Path: "/api/*", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(5)}}}
	lim, _ := newRulesLimiter(t, rules, middleware.WithObserver(&middleware.Hooks{OnDecided: func(_ keyfunc.Request, res *middleware.Result) {
		outcomes = append(outcomes, res.Outcome)
	}}))
	h := lim.Handler(rulesOK)
	if lim.Unmatched() != middleware.UnmatchedAllow {
		t.Fatal("default policy is not allow")
	}
	if got := rulesServe(h, rulesReq("GET", "/other", "192.0.2.1:1")).Code; got != http.StatusOK {
		t.Errorf("allow: %d", got)
	}
	lim.SetUnmatched(middleware.UnmatchedDeny)
	rec := rulesServe(h, rulesReq("GET", "/other", "192.0.2.1:1"))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "no rate-limit rule") || rec.Header().Get("Retry-After") != "" {
		t.Errorf("deny: %d %s %v", rec.Code, rec.Body, rec.Header())
	}
	if got := rulesServe(h, rulesReq("GET", "/api/x", "192.0.2.1:1")).Code; got != http.StatusOK {
		t.Errorf("matched: %d", got)
	}
	want := []middleware.Outcome{middleware.OutcomeUnlimited, middleware.OutcomeUnmatched, middleware.OutcomeAllowed}
	if len(outcomes) != len(want) || outcomes[0] != want[0] || outcomes[1] != want[1] || outcomes[2] != want[2] {
		t.Errorf("outcomes %v, want %v", outcomes, want)
	}
	if middleware.OutcomeUnmatched.String() != "unmatched" || middleware.UnmatchedDeny.String() != "deny" {
		t.Error("names")
	}
	if _, err := middleware.NewRules(rules, middleware.WithUnmatched(7)); err == nil {
		t.Error("WithUnmatched(7) accepted")
	}
	// In shadow mode the request passes, reported as shadow-denied.
	shadow, _ := newRulesLimiter(t, rules, middleware.WithUnmatched(middleware.UnmatchedDeny), middleware.WithShadowMode())
	if res, err := shadow.Decide(keyfunc.FromHTTP(rulesReq("GET", "/other", "192.0.2.1:1"))); err != nil || !res.Allowed || !res.Shadowed {
		t.Errorf("shadow: %+v, %v", res, err)
	}
}

// TestRuleConditions checks Headers, Query, Match and Deny, and that
// they are validated.
func TestRuleConditions(t *testing.T) {
	t.Parallel()
	ip := keyfunc.RemoteIP()
	one := []middleware.Limit{middleware.PerMinute(1)}
	lim, _ := newRulesLimiter(t, []middleware.Rule{
		{Name: "match", Match: func(r keyfunc.Request) bool { return r.Header("X-Beta") != "" }, Key: ip, Limits: one},
		{Name: "blocked", Deny: true, Query: map[string]string{"evil": "1"}, Key: ip},
		{Name: "shadow-block", Deny: true, Shadow: true, Headers: map[string]string{"x-probe": "yes"}, Key: ip},
		{Name: "allowlisted", Deny: true, Headers: map[string]string{"X-Probe": "yes"}, Key: ip, AllowKeys: []string{"ip:192.0.2.9"}},
	})
	decide := func(target, remote string, hdr ...string) middleware.Result {
		res, err := lim.Decide(keyfunc.FromHTTP(rulesReq("GET", target, remote, hdr...)))
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := decide("/", "192.0.2.1:1", "X-Beta", "1"); !res.Allowed || res.Rule != "match" {
		t.Errorf("match: %+v", res)
	}
	if res := decide("/", "192.0.2.1:1", "X-Beta", "1"); res.Allowed {
		t.Errorf("match, second: %+v", res)
	}
	if res := decide("/", "192.0.2.1:1"); !res.Allowed || res.Applied {
		t.Errorf("no match: %+v", res)
	}
	res := decide("/?evil=1", "192.0.2.1:1")
	if res.Allowed || res.Outcome != middleware.OutcomeDenied || res.Policy != "blocked" || middleware.DenyStatus(&res) != 429 {
		t.Errorf("deny: %+v", res)
	}
	if body := string(middleware.DenyBody(&res)); body != `{"error":"request denied by rule","policy":"blocked"}`+"\n" {
		t.Errorf("deny body %s", body)
	}
	hdr := http.Header{}
	lim.WriteHeaders(hdr, &res)
	if len(hdr) != 0 {
		t.Errorf("deny headers %v", hdr)
	}
	if res := decide("/", "192.0.2.9:1", "X-Probe", "yes"); !res.Allowed || !res.Shadowed || res.ShadowPolicy != "shadow-block" {
		t.Errorf("shadow deny, allowlisted by the other: %+v", res)
	}
	if res := decide("/", "192.0.2.1:1", "X-Probe", "yes"); res.Allowed || res.Policy != "allowlisted" {
		t.Errorf("deny over shadow deny: %+v", res)
	}
	for _, bad := range []middleware.Rule{
		{Name: "a", Key: ip, Limits: one, Headers: map[string]string{"bad name": "x"}},
		{Name: "a", Key: ip, Limits: one, Query: map[string]string{"": "x"}},
		{Name: "a", Key: ip, Limits: one, Deny: true},
	} {
		if _, err := middleware.NewRules([]middleware.Rule{bad}); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
