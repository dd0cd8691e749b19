package middleware

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/adminauth"
	"github.com/sluicehq/sluice/internal/adminpage"
)

// The operator page of AdminHandler and its sign-in.
//
// The page is static (embedded) and shows nothing by itself: it reads the
// handler's JSON endpoints. A browser signs in once with the token the
// deployment's Authorize accepts as "Authorization: Bearer <token>"
// (POST /session); the handler keeps it in an HttpOnly, SameSite=Strict
// cookie, never in a URL, and authorizes each later request of that
// browser by asking Authorize about the request with the cookie's token
// in its Authorization header. Requests that change state must come from
// the same origin (Origin and Sec-Fetch-Site, when the browser sends
// them) and, when authorized by the cookie, carry the anti-forgery token
// (X-CSRF-Token) the page reads from GET /session: a page of another site
// can neither read the cookie nor ask for the token.

const (
	// adminCookie is the name of the sign-in cookie.
	adminCookie = "sluice_admin"
	// csrfHeader carries the anti-forgery token.
	csrfHeader = "X-CSRF-Token"
	// maxTokenLen bounds a token given to POST /session.
	maxTokenLen = 4096
)

// admin is an AdminHandler's state.
type admin struct {
	lim *Limiter
	cfg AdminConfig
}

// auth says how a request is authorized.
type auth struct {
	ok bool
	// cookie is the sign-in cookie's token, when it is what authorized
	// the request.
	cookie string
}

// authorize asks cfg.Authorize about r as it came, then, if it carries the
// sign-in cookie, about r with the cookie's token as its bearer token.
func (a *admin) authorize(r *http.Request) auth {
	if a.cfg.Authorize == nil {
		return auth{}
	}
	if a.cfg.Authorize(r) {
		return auth{ok: true}
	}
	c, err := r.Cookie(adminCookie)
	if err != nil || c.Value == "" || len(c.Value) > maxTokenLen {
		return auth{}
	}
	if a.cfg.Authorize(withBearer(r, c.Value)) {
		return auth{ok: true, cookie: c.Value}
	}
	return auth{}
}

// withBearer returns a shallow copy of r whose Authorization is token as a
// bearer token.
func withBearer(r *http.Request, token string) *http.Request {
	r2 := new(http.Request)
	*r2 = *r
	r2.Header = r.Header.Clone()
	r2.Header.Set("Authorization", "Bearer "+token)
	return r2
}

// changesState reports whether r's method changes state.
func changesState(r *http.Request) bool {
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// forged reports, and answers 403, when r changes state but comes from
// another origin or, authorized by the cookie, lacks the anti-forgery
// token.
func forged(w http.ResponseWriter, r *http.Request, au auth) bool {
	if !changesState(r) {
		return false
	}
	if !adminauth.SameOrigin(r) {
		adminJSON(w, http.StatusForbidden, map[string]string{"error": "cross-origin request refused"})
		return true
	}
	if au.cookie != "" && !adminauth.ValidCSRF(au.cookie, r.Header.Get(csrfHeader)) {
		adminJSON(w, http.StatusForbidden, map[string]string{"error": "missing or wrong " + csrfHeader})
		return true
	}
	return false
}

// servePublic answers the requests that need no authorization: the page
// and its assets, and the sign-in. It reports whether it answered.
func (a *admin) servePublic(w http.ResponseWriter, r *http.Request, path string) bool {
	if path == "/session" {
		a.serveSession(w, r)
		return true
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		return false
	}
	if r.URL.Path == "" {
		// Mounted under a prefix without its slash: the page's relative
		// links need it.
		http.Redirect(w, r, mountPath(r)+"/", http.StatusMovedPermanently)
		return true
	}
	return adminpage.Serve(w, r, path)
}

// mountPath returns the path prefix the handler is mounted under
// (http.StripPrefix leaves the request's RequestURI whole).
func mountPath(r *http.Request) string {
	uri := r.RequestURI
	if i := strings.IndexAny(uri, "?#"); i >= 0 {
		uri = uri[:i]
	}
	if !strings.HasPrefix(uri, "/") {
		return "" // absolute form or unknown: mounted at the root
	}
	p := r.URL.EscapedPath()
	if p == "" || p == "/" {
		return strings.TrimSuffix(uri, "/")
	}
	if strings.HasSuffix(uri, p) {
		return uri[:len(uri)-len(p)]
	}
	return ""
}

// sessionState is the answer of GET and POST /session.
type sessionState struct {
	SignedIn bool `json:"signed_in"`
	// CSRF is the anti-forgery token of a cookie sign-in.
	CSRF string `json:"csrf,omitempty"`
	// HashedKeys reports that client keys are shown as keyed hashes
	// (AdminConfig.HashKeys): requests name clients by hash=.
	HashedKeys bool `json:"hashed_keys"`
}

// serveSession answers /session: GET tells whether the browser is signed
// in (and its anti-forgery token), POST signs in with {"token": "…"},
// DELETE signs out.
func (a *admin) serveSession(w http.ResponseWriter, r *http.Request) {
	au := a.authorize(r)
	switch r.Method {
	case http.MethodGet:
		st := sessionState{SignedIn: au.ok, HashedKeys: len(a.cfg.HashKeys) > 0}
		if au.cookie != "" {
			st.CSRF = adminauth.CSRFToken(au.cookie)
		}
		adminJSON(w, http.StatusOK, st)
	case http.MethodPost:
		if !adminauth.SameOrigin(r) {
			adminJSON(w, http.StatusForbidden, map[string]string{"error": "cross-origin request refused"})
			return
		}
		// The page posts JSON; without its script, the form posts
		// token=… and is sent back to the page.
		form := strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded")
		var body struct {
			Token string `json:"token"`
		}
		var err error
		r.Body = http.MaxBytesReader(w, r.Body, maxTokenLen+64)
		if form {
			err = r.ParseForm()
			body.Token = r.PostForm.Get("token")
		} else {
			err = json.NewDecoder(r.Body).Decode(&body)
		}
		if err != nil || !cookieSafe(body.Token) {
			adminJSON(w, http.StatusBadRequest, map[string]string{"error": `want {"token": "…"}`})
			return
		}
		if a.cfg.Authorize == nil || !a.cfg.Authorize(withBearer(r, body.Token)) {
			adminJSON(w, http.StatusForbidden, map[string]string{"error": "forbidden"})
			return
		}
		http.SetCookie(w, a.cookie(r, body.Token, a.signIn()))
		if form {
			http.Redirect(w, r, mountPath(r)+"/", http.StatusSeeOther)
			return
		}
		adminJSON(w, http.StatusOK, sessionState{SignedIn: true, CSRF: adminauth.CSRFToken(body.Token), HashedKeys: len(a.cfg.HashKeys) > 0})
	case http.MethodDelete:
		if forged(w, r, au) {
			return
		}
		http.SetCookie(w, a.cookie(r, "", -1))
		adminJSON(w, http.StatusOK, sessionState{HashedKeys: len(a.cfg.HashKeys) > 0})
	default:
		adminJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method not allowed"})
	}
}

// cookieSafe reports whether token can be a cookie's value as it is: 1
// to maxTokenLen printable ASCII characters but for the double quote, the
// semicolon, the comma and the backslash (RFC 6265), as bearer tokens are.
func cookieSafe(token string) bool {
	if token == "" || len(token) > maxTokenLen {
		return false
	}
	for i := 0; i < len(token); i++ {
		if b := token[i]; b <= ' ' || b >= 0x7f || b == '"' || b == ';' || b == ',' || b == '\\' {
			return false
		}
	}
	return true
}

func (a *admin) signIn() time.Duration {
	if a.cfg.SignIn > 0 {
		return a.cfg.SignIn
	}
	return DefaultAdminSignIn
}

// cookie returns the sign-in cookie holding token for maxAge (negative:
// deleted), scoped to the handler's mount path.
func (a *admin) cookie(r *http.Request, token string, maxAge time.Duration) *http.Cookie {
	c := &http.Cookie{
		Name: adminCookie, Value: token, Path: mountPath(r) + "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		MaxAge: int(maxAge / time.Second),
	}
	if maxAge < 0 {
		c.MaxAge = -1
	}
	return c
}

// show returns key as the handler shows it: itself, or its keyed hash.
func (a *admin) show(key string) string {
	if len(a.cfg.HashKeys) == 0 {
		return key
	}
	return adminauth.KeyHash(a.cfg.HashKeys, key)
}
