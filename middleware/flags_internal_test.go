package middleware

import (
	"context"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/keyfunc"
)

// TestRuleSetFlags: the rules in force say which capabilities decide
// must look at, and stay right as rules are replaced and overrides come
// and go: an override set makes the rules in force say so (and SetRules
// keeps it), the last one removed makes them say not.
func TestRuleSetFlags(t *testing.T) {
	t.Parallel()
	plain := []Rule{{Name: "api", Key: keyfunc.RemoteIP(), Limits: []Limit{PerMinute(10)}}}
	elastic := []Rule{{Name: "api", Key: keyfunc.RemoteIP(), Limits: []Limit{{Requests: 10, Window: 60e9, Ceiling: 20}}}}
	lim, err := NewRules(plain)
	if err != nil {
		t.Fatal(err)
	}
	defer lim.Close()
	set := lim.rules.Load()
	if set.overrides || set.signals || set.overload || set.banning || set.fleet != nil {
		t.Fatalf("plain rules: %+v", *set)
	}
	ctx := context.Background()
	if err := lim.SetOverride(ctx, Override{Rule: "api", Key: "ip:192.0.2.1", Limits: []Limit{PerMinute(1)}}); err != nil {
		t.Fatal(err)
	}
	if !lim.rules.Load().overrides {
		t.Fatal("an override is set, the rules in force do not say so")
	}
	if err := lim.SetRules(elastic); err != nil {
		t.Fatal(err)
	}
	if set := lim.rules.Load(); !set.overrides || !set.signals {
		t.Fatalf("after SetRules with an override in force and an elastic limit: %+v", *set)
	}
	if ok, err := lim.RemoveOverride(ctx, "api", "ip:192.0.2.1"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if lim.rules.Load().overrides {
		t.Fatal("the last override is gone, the rules in force still say there is one")
	}
	// The override applies while it is in force, and not after.
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.RemoteAddr = "192.0.2.1:1"
	r := keyfunc.FromHTTP(req)
	if err := lim.SetOverride(ctx, Override{Rule: "api", Key: "ip:192.0.2.1", Limits: []Limit{PerMinute(1)}}); err != nil {
		t.Fatal(err)
	}
	if res, err := lim.Decide(r); err != nil || res.Limit.Requests != 1 {
		t.Fatalf("with the override: %+v %v", res, err)
	}
	if ok, err := lim.RemoveOverride(ctx, "api", "ip:192.0.2.1"); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if res, err := lim.Decide(r); err != nil || res.Limit.Requests == 1 {
		t.Fatalf("after the override: %+v %v", res, err)
	}
}

// TestHTTPView: the view Handler gives key functions reads the request as
// keyfunc.FromHTTP does, and carries the scratch's arena.
func TestHTTPView(t *testing.T) {
	t.Parallel()
	req := httptest.NewRequest(http.MethodPost, "/a/b?x=1", nil)
	req.RemoteAddr = "192.0.2.7:4000"
	req.Pattern = "POST /a/{id}"
	req.Header.Add("X-Tenant", "t1")
	req.Header.Add("X-Tenant", "t2")
	var s scratch
	s.view = httpView{req, &s.arena}
	v, want := keyfunc.Request(&s.view), keyfunc.FromHTTP(req)
	if v.Context() != want.Context() || v.Method() != want.Method() || v.Path() != want.Path() ||
		v.Route() != want.Route() || v.RemoteAddr() != want.RemoteAddr() || v.Header("x-tenant") != want.Header("x-tenant") ||
		strings.Join(v.Values("X-Tenant"), ",") != strings.Join(want.Values("X-Tenant"), ",") {
		t.Errorf("the view reads %v, keyfunc.FromHTTP %v", v, want)
	}
	if s.view.Arena() != &s.arena {
		t.Error("the view does not carry the scratch's arena")
	}
	if q, ok := v.(keyfunc.QueryRequest); !ok || q.Query("x") != "1" {
		t.Error("the view does not read the query")
	}
	// Every method keyfunc's view has (the optional interfaces' too),
	// this one has.
	mine := reflect.TypeOf(v)
	theirs := reflect.TypeOf(want)
	for i := range theirs.NumMethod() {
		if _, ok := mine.MethodByName(theirs.Method(i).Name); !ok {
			t.Errorf("keyfunc.FromHTTP's view has %s, Handler's has not", theirs.Method(i).Name)
		}
	}
	for _, key := range []keyfunc.Func{keyfunc.RemoteIP(), keyfunc.RemoteIPWithPrefix(24, 64)} {
		a, errA := key(v)
		b, errB := key(want)
		if a != b || errA != nil || errB != nil {
			t.Errorf("keys %q (%v) and %q (%v)", a, errA, b, errB)
		}
	}
}
