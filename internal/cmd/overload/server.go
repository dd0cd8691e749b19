package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// service is a handler of fixed capacity: a request waits for one of the
// slots, holds it for the service time, and gives it back. The capacity
// can be lowered while it runs.
type service struct {
	tokens chan struct{}
	d      time.Duration
	mu     sync.Mutex
	taken  int // tokens withheld to lower the capacity
}

func newService(slots int, d time.Duration) *service {
	s := &service{tokens: make(chan struct{}, 1024), d: d}
	for range slots {
		s.tokens <- struct{}{}
	}
	return s
}

func (s *service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	select {
	case <-s.tokens:
	case <-r.Context().Done():
		return // the client gave up while the request queued
	}
	time.Sleep(s.d)
	s.tokens <- struct{}{}
	_, _ = w.Write([]byte("ok\n"))
}

// shrink withholds n slots: they are taken as they come free.
func (s *service) shrink(n int) {
	go func() {
		for range n {
			<-s.tokens
			s.mu.Lock()
			s.taken++
			s.mu.Unlock()
		}
	}()
}

// all is the key of limits over the whole server.
func all(keyfunc.Request) (string, error) { return "all", nil }

// limiterFor returns the limiter of a server mode, nil for none.
func limiterFor(mode string, static int) (*middleware.Limiter, error) {
	adaptive := &middleware.AdaptiveConcurrency{Min: 2, Max: 200}
	switch mode {
	case "none":
		return nil, nil
	case "static":
		return middleware.NewRules([]middleware.Rule{{Name: "static", Key: all, Concurrency: static, ConcurrencyStatus: http.StatusServiceUnavailable}})
	case "adaptive":
		return middleware.NewRules([]middleware.Rule{{Name: "adaptive", AdaptiveConcurrency: adaptive}})
	case "priority":
		return middleware.NewRules([]middleware.Rule{{Name: "adaptive", AdaptiveConcurrency: adaptive}},
			middleware.WithPriority(func(r keyfunc.Request) middleware.Priority {
				p, _ := middleware.ParsePriority(r.Header("X-Priority"))
				return p
			}))
	case "elastic":
		// Every request is protected by the adaptive limit; the client of
		// /client has a limit of 10/s with a ceiling of 50/s, and a high
		// priority, so that it is shed only after the other traffic.
		return middleware.NewRules([]middleware.Rule{
			{Name: "adaptive", AdaptiveConcurrency: adaptive},
			{Name: "client", Path: "/client", Key: keyfunc.Header("X-Client"), Priority: middleware.PriorityHigh,
				Limits: []middleware.Limit{{Requests: 10, Window: time.Second, Ceiling: 50}}},
		})
	}
	return nil, fmt.Errorf("unknown mode %q", mode)
}

// sample is one line of the server's report, every 100ms.
type sample struct {
	T        float64 `json:"t"` // seconds since the server started
	Limit    int     `json:"limit"`
	InFlight int     `json:"in_flight"`
	Spare    float64 `json:"spare"`
	Factor   float64 `json:"factor"`
	Slots    int     `json:"slots"`
}

func serverMain(fs *flag.FlagSet) error {
	mode := fs.String("mode", "adaptive", "none, static, adaptive, priority or elastic")
	slots := fs.Int("slots", 8, "slots of the handler")
	d := fs.Duration("service", 20*time.Millisecond, "service time of one request")
	static := fs.Int("static", 8, "the static concurrency limit (mode static)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	svc := newService(*slots, *d)
	lim, err := limiterFor(*mode, *static)
	if err != nil {
		return err
	}
	var h http.Handler = svc
	if lim != nil {
		h = lim.Handler(svc)
		defer lim.Close()
	}
	mux := http.NewServeMux()
	mux.Handle("/", h)
	mux.HandleFunc("/_slots", func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.Atoi(r.URL.Query().Get("withhold"))
		if err != nil || n < 0 || n > *slots {
			http.Error(w, "bad withhold", http.StatusBadRequest)
			return
		}
		svc.shrink(n)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	fmt.Printf("listening %s\n", ln.Addr())
	start := time.Now()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		enc := json.NewEncoder(os.Stdout)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			s := sample{T: time.Since(start).Seconds()}
			svc.mu.Lock()
			s.Slots = *slots - svc.taken
			svc.mu.Unlock()
			if lim != nil {
				st := lim.Capacity()
				if a, ok := st.Rules["adaptive"]; ok {
					s.Limit, s.InFlight, s.Spare = a.Limit, a.InFlight, a.Spare
				}
				s.Factor = st.Factor
			}
			_ = enc.Encode(s)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
