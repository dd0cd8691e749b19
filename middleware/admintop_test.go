package middleware_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/adminauth"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// adminRules: logins with a ban after 2 a minute, and an API without one.
func adminTopRules() []middleware.Rule {
	login := middleware.PerMinute(2)
	login.Ban = time.Hour
	return []middleware.Rule{
		{Name: "login", Path: "/login", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{login}},
		{Name: "api", Path: "/api", Key: keyfunc.RemoteIP(), Limits: []middleware.Limit{middleware.PerMinute(100)}},
	}
}

const adminToken = "s3cret-token"

// loginsOf returns a limiter of adminTopRules after n requests of
// 192.0.2.1 to /login (2 allowed, then denied and banned).
func loginsOf(t *testing.T, n int) *middleware.Limiter {
	t.Helper()
	lim, err := middleware.NewRules(adminTopRules())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	for range n {
		doFrom(lim.Handler(ok200), "192.0.2.1:1", "/login")
	}
	return lim
}

func bearerAuth(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+adminToken }

// adminCall sends method target to h with the admin token and decodes the
// JSON answer.
func adminCall(t *testing.T, h http.Handler, method, target string, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	r := httptest.NewRequest(method, target, rd)
	r.Header.Set("Authorization", "Bearer "+adminToken)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	var out map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %s: %d, not JSON: %q", method, target, rec.Code, rec.Body.String())
	}
	return rec.Code, out
}

// TestAdminTop: GET /top lists a rule's top clients with their bounds, and
// says which are banned or overridden; POST /bans bans one, only under a
// rule that bans; bad parameters get 400 and unknown rules 404.
func TestAdminTop(t *testing.T) {
	t.Parallel()
	lim, err := middleware.NewRules(adminTopRules())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lim.Close() })
	h := lim.Handler(ok200)
	for range 5 {
		doFrom(h, "192.0.2.1:1", "/login") // 2 allowed, 3 denied (banned after the first)
	}
	for range 4 {
		doFrom(h, "192.0.2.2:1", "/api")
	}
	adm := middleware.AdminHandler(lim, middleware.AdminConfig{Authorize: bearerAuth})

	code, body := adminCall(t, adm, "GET", "/top?rule=login&by=denied&period=1m", "")
	if code != 200 || body["total"] != 3.0 || body["error_bound"] != 0.0 || body["servers"] != 1.0 || body["k"] != 100.0 {
		t.Fatalf("/top login: %d %v", code, body)
	}
	clients := body["clients"].([]any)
	c := clients[0].(map[string]any)
	if len(clients) != 1 || c["key"] != "ip:192.0.2.1" || c["count"] != 3.0 || c["error"] != 0.0 || c["banned"] != true || c["ban_until"] == "" || c["overridden"] != false {
		t.Errorf("/top login clients: %v", clients)
	}
	if err := lim.SetOverride(t.Context(), middleware.Override{Rule: "api", Key: "ip:192.0.2.2", Limits: []middleware.Limit{middleware.PerMinute(500)}}); err != nil {
		t.Fatal(err)
	}
	_, body = adminCall(t, adm, "GET", "/top?rule=api&by=charged&period=1h&limit=5", "")
	if c := body["clients"].([]any)[0].(map[string]any); c["key"] != "ip:192.0.2.2" || c["count"] != 4.0 || c["overridden"] != true || c["banned"] != false {
		t.Errorf("/top api: %v", body)
	}

	for target, want := range map[string]int{
		"/top":                            400,
		"/top?rule=api&by=stars":          400,
		"/top?rule=api&period=1d":         400,
		"/top?rule=api&limit=0":           400,
		"/top?rule=nope":                  404,
		"/bans?rule=api&key=ip:x":         400, // POST below: api has no ban
		"/bans?rule=login&key=ip:y&for=x": 400,
	} {
		method := "GET"
		if strings.HasPrefix(target, "/bans") {
			method = "POST"
		}
		if code, body := adminCall(t, adm, method, target, ""); code != want {
			t.Errorf("%s %s: %d %v, want %d", method, target, code, body, want)
		}
	}
	code, body = adminCall(t, adm, "POST", "/bans?rule=login&key=ip:192.0.2.9&for=10m", "")
	if code != 200 || body["until"] == "" {
		t.Fatalf("POST /bans: %d %v", code, body)
	}
	if rr := doFrom(h, "192.0.2.9:1", "/login"); rr.Code != 429 {
		t.Errorf("a banned client: %d, want 429", rr.Code)
	}
	_, body = adminCall(t, adm, "GET", "/bans", "")
	if body["total"] != 2.0 {
		t.Errorf("/bans after POST: %v", body)
	}
}

// TestAdminRatesAndHealth: /rates has 90 points per rule, the last with
// this interval's requests; /health names the store and its breaker.
func TestAdminRatesAndHealth(t *testing.T) {
	t.Parallel()
	adm := middleware.AdminHandler(loginsOf(t, 3), middleware.AdminConfig{Authorize: bearerAuth})
	code, body := adminCall(t, adm, "GET", "/rates", "")
	if code != 200 || body["interval_ms"] != 10000.0 {
		t.Fatalf("/rates: %d %v", code, body)
	}
	rules := body["rules"].([]any)
	login := rules[0].(map[string]any)
	pts := login["points"].([]any)
	last := pts[len(pts)-1].(map[string]any)
	if len(rules) != 2 || login["rule"] != "login" || len(pts) != 90 || last["allowed"] != 2.0 || last["denied"] != 1.0 {
		t.Errorf("/rates: %v", body)
	}
	code, body = adminCall(t, adm, "GET", "/health", "")
	if code != 200 || body["store"] != "memory" || body["breaker_open"] != false {
		t.Errorf("/health: %d %v", code, body)
	}
}

// TestAdminHashKeys: with HashKeys, every key the handler answers with is
// a keyed hash, and hash= names a client it showed.
func TestAdminHashKeys(t *testing.T) {
	t.Parallel()
	secret := []byte("hash secret")
	adm := middleware.AdminHandler(loginsOf(t, 4), middleware.AdminConfig{Authorize: bearerAuth, HashKeys: secret})
	hash := adminauth.KeyHash(secret, "ip:192.0.2.1")
	for _, target := range []string{"/top?rule=login", "/bans"} {
		_, body := adminCall(t, adm, "GET", target, "")
		if s := toJSON(body); strings.Contains(s, "192.0.2.1") || !strings.Contains(s, hash) {
			t.Errorf("%s: %s, want the key as %s", target, s, hash)
		}
	}
	code, body := adminCall(t, adm, "GET", "/limits?rule=login&hash="+hash, "")
	if code != 200 || body["key"] != hash {
		t.Errorf("/limits by hash: %d %v", code, body)
	}
	if code, body := adminCall(t, adm, "GET", "/limits?rule=login&hash=h:AAAAAAAAAAAAAAAA", ""); code != 404 {
		t.Errorf("/limits by an unknown hash: %d %v", code, body)
	}
	code, body = adminCall(t, adm, "DELETE", "/bans?rule=login&hash="+hash, "")
	if code != 200 || body["lifted"] != true || body["key"] != hash {
		t.Errorf("DELETE /bans by hash: %d %v", code, body)
	}
}

// signIn posts token to /session as a page of the handler's own origin
// would, and returns the answer.
func signIn(h http.Handler, target, token string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", target, strings.NewReader(`{"token":"`+token+`"}`))
	r.Header.Set("Origin", "http://example.com")
	r.Header.Set("Sec-Fetch-Site", "same-origin")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// TestAdminSignIn: the page needs no authorization and says its CSP; a
// browser signs in with the token, which comes back as an HttpOnly,
// SameSite=Strict cookie scoped to the handler's path; the cookie
// authorizes reads, and requests that change state only with the
// anti-forgery token and from the same origin; signing out clears it.
func TestAdminSignIn(t *testing.T) {
	t.Parallel()
	lim := loginsOf(t, 0)
	mux := http.NewServeMux()
	mux.Handle("/admin/", http.StripPrefix("/admin", middleware.AdminHandler(lim, middleware.AdminConfig{Authorize: bearerAuth})))

	page := httptest.NewRecorder()
	mux.ServeHTTP(page, httptest.NewRequest("GET", "/admin/", nil))
	if page.Code != 200 || !strings.Contains(page.Body.String(), "<title>sluice") || !strings.Contains(page.Header().Get("Content-Security-Policy"), "script-src 'self'") {
		t.Fatalf("page: %d %q %v", page.Code, page.Body.String()[:min(80, page.Body.Len())], page.Header())
	}
	for _, asset := range []string{"/admin/ui.js", "/admin/ui.css"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest("GET", asset, nil))
		if rec.Code != 200 || rec.Body.Len() < 100 {
			t.Errorf("%s: %d", asset, rec.Code)
		}
	}
	if rec := signIn(mux, "/admin/session", "wrong"); rec.Code != 403 || len(rec.Result().Cookies()) != 0 {
		t.Fatalf("wrong token: %d %v", rec.Code, rec.Result().Cookies())
	}
	rec := signIn(mux, "/admin/session", adminToken)
	cookies := rec.Result().Cookies()
	if rec.Code != 200 || len(cookies) != 1 {
		t.Fatalf("sign-in: %d %v", rec.Code, cookies)
	}
	c := cookies[0]
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/admin/" || c.Value != adminToken || c.MaxAge != int(middleware.DefaultAdminSignIn/time.Second) {
		t.Errorf("cookie %+v", c)
	}
	var st struct {
		SignedIn bool   `json:"signed_in"`
		CSRF     string `json:"csrf"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &st); err != nil || !st.SignedIn || st.CSRF == "" {
		t.Fatalf("sign-in answer %q", rec.Body.String())
	}

	send := func(method, target string, hdr map[string]string) int {
		r := httptest.NewRequest(method, target, nil)
		r.AddCookie(c)
		for k, v := range hdr {
			r.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, r)
		return rec.Code
	}
	same := map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}
	withToken := map[string]string{"Origin": "http://example.com", "Sec-Fetch-Site": "same-origin", "X-CSRF-Token": st.CSRF}
	for _, tc := range []struct {
		name, method, target string
		hdr                  map[string]string
		want                 int
	}{
		{"read with the cookie", "GET", "/admin/rules", nil, 200},
		{"session read", "GET", "/admin/session", nil, 200},
		{"change without the anti-forgery token", "POST", "/admin/bans?rule=login&key=ip:192.0.2.5", same, 403},
		{"change with a wrong token", "POST", "/admin/bans?rule=login&key=ip:192.0.2.5", map[string]string{"X-CSRF-Token": "x"}, 403},
		{"change from another origin", "POST", "/admin/bans?rule=login&key=ip:192.0.2.5",
			map[string]string{"Origin": "http://127.0.0.1:1", "Sec-Fetch-Site": "same-site", "X-CSRF-Token": st.CSRF}, 403},
		{"change with the token", "POST", "/admin/bans?rule=login&key=ip:192.0.2.5", withToken, 200},
		{"lift with the token", "DELETE", "/admin/bans?rule=login&key=ip:192.0.2.5", withToken, 200},
	} {
		if got := send(tc.method, tc.target, tc.hdr); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
	// The bearer token itself: a program is not a browser, but a browser's
	// cross-site request is refused whatever authorizes it.
	r := httptest.NewRequest("POST", "/admin/bans?rule=login&key=ip:192.0.2.6", nil)
	r.Header.Set("Authorization", "Bearer "+adminToken)
	r.Header.Set("Sec-Fetch-Site", "cross-site")
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, r)
	if rec.Code != 403 {
		t.Errorf("cross-site request with the bearer token: %d, want 403", rec.Code)
	}
	// Sign out.
	r = httptest.NewRequest("DELETE", "/admin/session", nil)
	r.AddCookie(c)
	for k, v := range withToken {
		r.Header.Set(k, v)
	}
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, r)
	if out := rec.Result().Cookies(); rec.Code != 200 || len(out) != 1 || out[0].MaxAge >= 0 {
		t.Errorf("sign-out: %d %v", rec.Code, out)
	}
	// Mounted without its slash: a redirect that keeps relative links right.
	rec = httptest.NewRecorder()
	http.StripPrefix("/ops", middleware.AdminHandler(lim, middleware.AdminConfig{Authorize: bearerAuth})).ServeHTTP(rec, httptest.NewRequest("GET", "/ops", nil))
	if rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/ops/" {
		t.Errorf("/ops: %d to %q", rec.Code, rec.Header().Get("Location"))
	}
}
