package main

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestExampleLogin plays the login scenario of the README on every
// framework, with the built-in rules and with rules.yaml: successful logins
// are free, the 6th failed attempt of an account from an address is
// refused and bans the pair for an hour, right password or not, while
// another account from the same address goes on.
func TestExampleLogin(t *testing.T) {
	t.Parallel()
	type attempt struct {
		user, password string
		times          int
		want           int
		retryAfter     string
	}
	attempts := []attempt{
		{"bob", demoPassword, 2, 200, ""},
		{"alice", "guess", 5, 401, ""},
		{"alice", "guess", 1, 429, "3600"},
		{"alice", demoPassword, 1, 429, "3600"},
		{"Alice", demoPassword, 1, 429, "3600"}, // accounts are case-insensitive
		{"carol", "guess", 1, 401, ""},
		{"bob", demoPassword, 1, 200, ""},
	}
	for name, serve := range frameworks {
		for _, file := range []bool{false, true} {
			t.Run(name+map[bool]string{false: "/builtin", true: "/rules.yaml"}[file], func(t *testing.T) {
				t.Parallel()
				lim, addr := serveDemo(t, serve, file)
				client := &http.Client{Timeout: 5 * time.Second}
				for _, a := range attempts {
					for i := range a.times {
						form := url.Values{"password": {a.password}}.Encode()
						req, _ := http.NewRequest("POST", "http://"+addr+"/login?user="+a.user, strings.NewReader(form))
						req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
						resp, err := client.Do(req)
						if err != nil {
							t.Fatal(err)
						}
						resp.Body.Close()
						if i == a.times-1 && (resp.StatusCode != a.want || resp.Header.Get("Retry-After") != a.retryAfter) {
							t.Fatalf("%s/%s ×%d: %d Retry-After %q, want %d %q", a.user, a.password, a.times,
								resp.StatusCode, resp.Header.Get("Retry-After"), a.want, a.retryAfter)
						}
					}
				}
				bans, total, err := lim.Bans(context.Background(), 0)
				if err != nil || total != 1 || bans[0].Key != "account:alice|ip:127.0.0.1" {
					t.Fatalf("Bans = %v, %d, %v", bans, total, err)
				}
			})
		}
	}
}
