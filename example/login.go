package main

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// POST /login?user=NAME with the form field password: the demo's login,
// guarded by 5 failed attempts (401) per 15 minutes per account and
// address, then a ban of an hour for that account from that address.
// Successful logins are free. The password of every account is
// demoPassword.

const demoPassword = "correct horse"

// accountKey keys a login by its account, the user query parameter,
// lowercased and escaped: "account:alice". A request without one has no
// key (400).
func accountKey(r keyfunc.Request) (string, error) {
	q, ok := r.(keyfunc.QueryRequest)
	if !ok {
		return "", fmt.Errorf("example: no query: %w", keyfunc.ErrNoKey)
	}
	u := q.Query("user")
	if u == "" || len(u) > 64 {
		return "", fmt.Errorf("example: no user (or a long one): %w", keyfunc.ErrNoKey)
	}
	return "account:" + keyfunc.Escape(strings.ToLower(u)), nil
}

// loginRule is the rule of POST /login. rules.yaml has the same rule,
// named login-failures: key account+ip, limits [{requests: 5, window: 15m,
// ban: 1h}], count {status: [401]}.
func loginRule() middleware.Rule {
	return middleware.Rule{
		Name: "login", Path: "/login", Methods: []string{http.MethodPost},
		Key:    keyfunc.Join(accountKey, keyfunc.RemoteIP()),
		Limits: []middleware.Limit{{Requests: 5, Window: 15 * time.Minute, Ban: time.Hour}},
		Count:  middleware.Count{Status: []middleware.Status{http.StatusUnauthorized}},
	}
}

// login answers a login attempt: 200 with a token for the right password,
// 401 otherwise.
func login(password string) (status int, body string) {
	if password != demoPassword {
		return http.StatusUnauthorized, `{"error":"wrong user or password"}`
	}
	return http.StatusOK, `{"token":"demo"}`
}
