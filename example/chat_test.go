package main

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The completions of the tests come as fast as the client reads them.
func init() { chatTokenEvery = 0 }

// TestChat streams completions of POST /v1/chat on every framework until
// the token budget is spent: each answer reports both policies, the
// stream arrives whole, and once the last streams took the key past its
// 10,000 tokens the next request is refused with a Retry-After; a client
// that goes away mid-stream is charged what it was sent.
func TestChat(t *testing.T) {
	t.Parallel()
	for name, serve := range frameworks {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, addr := serveDemo(t, serve, false)
			client := &http.Client{Timeout: 10 * time.Second}
			post := func(ctx context.Context, tokens int) *http.Response {
				t.Helper()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+"/v1/chat?tokens="+strconv.Itoa(tokens), strings.NewReader("Tell me a story"))
				req.Header.Set("X-API-Key", "demo-"+name)
				resp, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				return resp
			}
			// A client that goes away after 10 events.
			ctx, cancel := context.WithCancel(context.Background())
			resp := post(ctx, 2000)
			buf := make([]byte, 10*len("data: {\"token\":0}\n\n"))
			if _, err := io.ReadFull(resp.Body, buf); err != nil {
				t.Fatal(err)
			}
			cancel()
			resp.Body.Close()
			// Streams of 1,990 tokens (and their prompts' 3) until the
			// budget is spent: the one that takes it past 10,000 is
			// served whole, the next refused.
			served := 0
			for i := range 8 {
				resp := post(context.Background(), 1990)
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					if resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), `"policy":"chat-tokens"`) {
						t.Fatalf("once spent: Retry-After %q, %s", resp.Header.Get("Retry-After"), body)
					}
					break
				}
				if resp.StatusCode != 200 || !strings.Contains(string(body), `"completion_tokens":1990`) {
					t.Fatalf("stream %d: %d %.80q", i, resp.StatusCode, body)
				}
				if rl := resp.Header.Get("RateLimit"); !strings.Contains(rl, `"chat-tokens";r=`) || !strings.Contains(rl, `"chat";r=`) {
					t.Errorf("stream %d: RateLimit %q, want both policies", i, rl)
				}
				served++
			}
			// 10,000 tokens hold 5 of them, and a 6th while the cancelled
			// stream took fewer than 35.
			if served < 5 || served > 6 {
				t.Errorf("%d streams served before the budget was spent, want 5 or 6", served)
			}
		})
	}
}
