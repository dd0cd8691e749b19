package middleware

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestStatusRecorder(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		write func(w http.ResponseWriter)
		want  int
	}{
		{"nothing", func(http.ResponseWriter) {}, 200},
		{"write", func(w http.ResponseWriter) { _, _ = w.Write([]byte("x")) }, 200},
		{"status", func(w http.ResponseWriter) { w.WriteHeader(401) }, 401},
		{"status twice", func(w http.ResponseWriter) { w.WriteHeader(503); w.WriteHeader(200) }, 503},
		{"write then status", func(w http.ResponseWriter) { _, _ = w.Write(nil); w.WriteHeader(500) }, 200},
		{"early hints", func(w http.ResponseWriter) { w.WriteHeader(103); w.WriteHeader(403) }, 403},
		{"flush", func(w http.ResponseWriter) { w.(http.Flusher).Flush(); w.WriteHeader(500) }, 200},
		{"controller flush", func(w http.ResponseWriter) {
			_ = http.NewResponseController(w).Flush()
			w.WriteHeader(500)
		}, 200},
		{"read from", func(w http.ResponseWriter) {
			_, _ = w.(io.ReaderFrom).ReadFrom(strings.NewReader("body"))
			w.WriteHeader(500)
		}, 200},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rr := httptest.NewRecorder()
			rec := newStatusRecorder(rr)
			c.write(rec)
			if got := rec.Status(); got != c.want {
				t.Errorf("Status() = %d, want %d", got, c.want)
			}
			if rr.Code != c.want && c.name != "nothing" && c.name != "early hints" { // the recorder keeps a 1xx
				t.Errorf("the client got %d, the recorder says %d", rr.Code, c.want)
			}
		})
	}
}

// TestStatusRecorderServer checks the optional interfaces on a real
// server: deadlines through Unwrap, streaming with Flush, and a hijacked
// connection, which counts as 101.
func TestStatusRecorderServer(t *testing.T) {
	t.Parallel()
	got := make(chan int, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := newStatusRecorder(w)
		defer func() { got <- rec.Status() }()
		rc := http.NewResponseController(rec)
		if err := rc.SetWriteDeadline(time.Now().Add(5 * time.Second)); err != nil {
			t.Errorf("SetWriteDeadline through the recorder: %v", err)
		}
		switch r.URL.Path {
		case "/stream":
			_, _ = rec.Write([]byte("first\n"))
			if err := rc.Flush(); err != nil {
				t.Errorf("Flush: %v", err)
			}
			rec.WriteHeader(500) // too late: the client has a 200
			_, _ = rec.Write([]byte("second\n"))
		case "/hijack":
			conn, brw, err := rc.Hijack()
			if err != nil {
				t.Errorf("Hijack: %v", err)
				return
			}
			_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n")
			_ = brw.Flush()
			_ = conn.Close()
		}
	}))
	defer srv.Close()

	resp, err := http.Get(srv.URL + "/stream")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	line, _ := br.ReadString('\n')
	_, _ = io.Copy(io.Discard, br)
	resp.Body.Close()
	if resp.StatusCode != 200 || line != "first\n" {
		t.Fatalf("stream: %d %q", resp.StatusCode, line)
	}
	if s := <-got; s != 200 {
		t.Errorf("stream counted as %d, want 200 (its status when first written)", s)
	}

	req, _ := http.NewRequest("GET", srv.URL+"/hijack", nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "test")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 101 {
		t.Errorf("hijack: client got %d", resp.StatusCode)
	}
	if s := <-got; s != 101 {
		t.Errorf("hijacked connection counted as %d, want 101", s)
	}
}
