// Package adminpage is the operator page of the admin handler: one HTML
// page, its script and its style sheet, embedded, with no external
// scripts, fonts or other resources, so that it works on closed networks.
// The page reads the handler's JSON endpoints; it holds no data itself.
//
// After the sign-in, it shows each rule's top clients over the last minute
// or hour, the bans and per-client overrides in force, each rule's allowed
// and denied requests over the last 15 minutes, and the health of the
// store's servers; from it an operator peeks at a client's counters, bans a
// client, lifts a ban, and sets or removes an override. Serve answers for
// its files, with a strict Content-Security-Policy (CSP).
// docs/operations.md describes the page and the endpoints it reads.
package adminpage

import (
	"bytes"
	"embed"
	"net/http"
	"time"
)

//go:embed page
var files embed.FS

// assets maps the paths the page is served under to its files and their
// types.
var assets = map[string]struct{ file, ctype string }{
	"/":           {"page/index.html", "text/html; charset=utf-8"},
	"/index.html": {"page/index.html", "text/html; charset=utf-8"},
	"/ui.js":      {"page/ui.js", "text/javascript; charset=utf-8"},
	"/ui.css":     {"page/ui.css", "text/css; charset=utf-8"},
}

// CSP is the page's Content-Security-Policy: its own script, style and
// endpoints only, no inline script, no framing.
const CSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
	"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// started is the modification time of the files (for conditional GETs).
var started = time.Now()

// Serve answers a GET or HEAD of the page or one of its assets at path (as
// the handler sees it, "/" for the page) and reports whether path is one.
func Serve(w http.ResponseWriter, r *http.Request, path string) bool {
	a, ok := assets[path]
	if !ok {
		return false
	}
	b, err := files.ReadFile(a.file)
	if err != nil {
		http.Error(w, "missing asset", http.StatusInternalServerError)
		return true
	}
	h := w.Header()
	h.Set("Content-Type", a.ctype)
	h.Set("Content-Security-Policy", CSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-cache")
	http.ServeContent(w, r, a.file, started, bytes.NewReader(b))
	return true
}
