package middleware

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// statusRecorder is the http.ResponseWriter that Handler gives a handler
// when a rule counts requests by their response's status: it records the
// status the client gets.
//
// The status is the first final one written: WriteHeader with a status of
// 200 or more (or 101), or 200 at the first Write, Flush or ReadFrom, as
// net/http sends it. Informational statuses (100, 103) are not final. A
// connection taken over with Hijack (a WebSocket) has the status written
// before, or 101 Switching Protocols. A handler that writes nothing
// answers 200.
//
// It keeps the optional interfaces of the writer it wraps working:
// Unwrap lets http.ResponseController reach the writer's own methods
// (deadlines, full duplex); Flush, Hijack, ReadFrom and Push pass through
// to the wrapped writer when it has them (Hijack and Push return
// http.ErrNotSupported when it does not, and Flush then does nothing, as
// ResponseController does).
type statusRecorder struct {
	http.ResponseWriter
	status int
	// settle, when set, is what a request owes whose usage its rule's
	// header may report: it is settled from the header (which is
	// removed) before the header is sent, once.
	settle *settlement
}

// header settles the request's usage from the header about to be sent,
// once.
func (w *statusRecorder) header() {
	if s := w.settle; s != nil {
		w.settle = nil
		_ = s.settleFrom(w.ResponseWriter.Header())
	}
}

// newStatusRecorder returns a recorder for w. It is not pooled: a handler
// may leave goroutines that still hold it after it returns.
func newStatusRecorder(w http.ResponseWriter) *statusRecorder {
	return &statusRecorder{ResponseWriter: w}
}

// Status returns the status the client got, 200 if nothing was written.
func (w *statusRecorder) Status() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

func (w *statusRecorder) WriteHeader(code int) {
	w.header()
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusRecorder) Write(b []byte) (int, error) {
	w.header()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *statusRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush sends what was written so far: a streaming response has its
// status from then on.
func (w *statusRecorder) Flush() {
	w.header()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// FlushError is Flush that reports the wrapped writer's error, as
// http.ResponseController calls it.
func (w *statusRecorder) FlushError() error {
	w.header()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *statusRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.header()
	c, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && w.status == 0 {
		w.status = http.StatusSwitchingProtocols
	}
	return c, rw, err
}

func (w *statusRecorder) ReadFrom(r io.Reader) (int64, error) {
	w.header()
	if w.status == 0 {
		w.status = http.StatusOK
	}
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, r)
}

func (w *statusRecorder) Push(target string, opts *http.PushOptions) error {
	if p, ok := w.ResponseWriter.(http.Pusher); ok {
		return p.Push(target, opts)
	}
	return http.ErrNotSupported
}

// writerOnly hides every method but Write, so that io.Copy does not call
// ReadFrom again.
type writerOnly struct{ io.Writer }
