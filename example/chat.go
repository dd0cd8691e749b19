package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// POST /v1/chat with an X-API-Key header: the demo's LLM endpoint, limited
// to 60 requests and 10,000 tokens a minute per API key. The body is the
// prompt; the request is charged its tokens (about a token per 4 bytes, as
// tokenizers average) when it arrives, and streams a fake completion as
// server-sent events, one token a millisecond, as many as the tokens query
// parameter asks (default 200, at most 2000). When the stream ends, or
// its client goes away, the handler settles what the request used: the
// prompt's tokens and those it produced. A client that spends its budget
// is in debt for what its last streams took past it, and waits it off.

const (
	chatRequests  = 60     // a minute per API key
	chatTokens    = 10_000 // a minute per API key
	chatMaxTokens = 4_000  // the most one request may use (Usage.Max)
	chatMaxStream = 2_000  // the most tokens one completion streams
)

// chatTokenEvery is the pace of a completion: a token a millisecond (the
// tests stream faster).
var chatTokenEvery = time.Millisecond

// chatRule is the rule of POST /v1/chat. rules.yaml has the same rule with
// a fixed estimate.
func chatRule() middleware.Rule {
	return middleware.Rule{
		Name: "chat", Path: "/v1/chat", Methods: []string{http.MethodPost},
		Key:    keyfunc.APIKey("X-API-Key", []byte("example-secret")),
		Limits: []middleware.Limit{middleware.PerMinute(chatRequests)},
		Usage: &middleware.Usage{
			Unit:         "tokens",
			Limits:       []middleware.Limit{middleware.PerMinute(chatTokens)},
			EstimateFunc: func(r keyfunc.Request) int { return promptTokens(r.Header("Content-Length")) },
			Max:          chatMaxTokens,
		},
	}
}

// promptTokens estimates the tokens of a prompt of contentLength bytes: a
// token per 4 bytes, at least 1.
func promptTokens(contentLength string) int {
	n, _ := strconv.Atoi(contentLength)
	return max(n/4, 1)
}

// completionTokens is how many tokens a request asks to stream: the
// tokens query parameter, 200 by default, at most chatMaxStream.
func completionTokens(q string) int {
	n, err := strconv.Atoi(q)
	if err != nil || n < 0 {
		return 200
	}
	return min(n, chatMaxStream)
}

// chat streams the completion of a request to w, one token every
// chatTokenEvery until n are sent or ctx is done (the client went away),
// flushing each, and settles the request's usage through ctx: the prompt's
// tokens and those sent. flush sends what was written.
func chat(ctx context.Context, w io.Writer, flush func() error, prompt, n int) {
	sent := 0
	defer func() { _ = middleware.Settle(ctx, prompt+sent) }()
	for sent < n {
		if _, err := fmt.Fprintf(w, "data: {\"token\":%d}\n\n", sent); err != nil {
			return
		}
		if err := flush(); err != nil {
			return
		}
		sent++
		select {
		case <-ctx.Done():
			return
		case <-time.After(chatTokenEvery):
		}
	}
	_, _ = fmt.Fprintf(w, "data: {\"done\":true,\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d}}\n\n", prompt, sent)
	_ = flush()
}
