package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// capacity is the handler's: 8 slots of 20ms.
const capacity = 400.0

func runMain(fs *flag.FlagSet) error {
	scenarios := fs.String("scenarios", "capacity,shrink,elastic,priority", "the scenarios to run, comma-separated")
	dur := fs.Duration("duration", 20*time.Second, "length of each load (the elastic scenario runs 1.5 times as long)")
	factor := fs.Float64("overload", 3, "load as a multiple of the handler's capacity (400/s)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	r := &runner{exe: exe, dur: *dur, rate: capacity * *factor}
	fmt.Printf("handler: 8 slots × 20ms (capacity %.0f/s); open-loop load %.0f/s (%.1f×) for %s; deadline 1s\n\n", capacity, r.rate, *factor, *dur)
	for _, s := range strings.Split(*scenarios, ",") {
		var err error
		switch s {
		case "capacity":
			err = r.capacity()
		case "shrink":
			err = r.shrink()
		case "elastic":
			err = r.elastic()
		case "priority":
			err = r.priority()
		default:
			err = fmt.Errorf("unknown scenario %q", s)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", s, err)
		}
		fmt.Println()
	}
	return nil
}

type runner struct {
	exe  string
	dur  time.Duration
	rate float64
}

// server is a running server process.
type server struct {
	cmd     *exec.Cmd
	addr    string
	mu      sync.Mutex
	samples []sample
	done    chan struct{}
}

func (r *runner) startServer(mode string) (*server, error) {
	cmd := exec.Command(r.exe, "server", "-mode", mode)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, done: make(chan struct{})}
	sc := bufio.NewScanner(out)
	if !sc.Scan() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, errors.New("server said nothing")
	}
	s.addr = strings.TrimPrefix(sc.Text(), "listening ")
	go func() {
		defer close(s.done)
		for sc.Scan() {
			var smp sample
			if json.Unmarshal(sc.Bytes(), &smp) == nil {
				s.mu.Lock()
				s.samples = append(s.samples, smp)
				s.mu.Unlock()
			}
		}
	}()
	return s, nil
}

func (s *server) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	<-s.done
	_ = s.cmd.Wait()
}

// load runs a load process and returns its report.
func (r *runner) load(url string, rate float64, dur time.Duration, header string) (*loadResult, error) {
	args := []string{"load", "-url", url, "-rate", fmt.Sprint(rate), "-duration", dur.String(), "-deadline", "1s"}
	if header != "" {
		args = append(args, "-header", header)
	}
	cmd := exec.Command(r.exe, args...)
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Run(); err != nil {
		return nil, err
	}
	var res loadResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		return nil, fmt.Errorf("load report: %w", err)
	}
	return &res, nil
}

func (r *runner) capacity() error {
	fmt.Println("## Goodput at 3× capacity")
	fmt.Println()
	fmt.Println("| limiter | goodput/s | % of capacity | admitted p50 ms | admitted p99 ms | refused | late (>1s) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	for _, mode := range []string{"none", "static", "adaptive"} {
		srv, err := r.startServer(mode)
		if err != nil {
			return err
		}
		res, err := r.load("http://"+srv.addr+"/", r.rate, r.dur, "")
		srv.stop()
		if err != nil {
			return err
		}
		c := res.Classes["all"]
		good := float64(c.Good) / r.dur.Seconds()
		name := map[string]string{"none": "none", "static": "static concurrency 8", "adaptive": "adaptive {min 2, max 200}"}[mode]
		fmt.Printf("| %s | %.0f | %.0f %% | %.1f | %.1f | %d | %d |\n", name, good, 100*good/capacity, c.P50, c.P99, c.Refused, c.Late)
	}
	return nil
}

func (r *runner) shrink() error {
	fmt.Println("## Capacity 8 → 4 slots mid-run (adaptive)")
	fmt.Println()
	srv, err := r.startServer("adaptive")
	if err != nil {
		return err
	}
	began := time.Now()
	var shrunkAt time.Time
	go func() {
		time.Sleep(r.dur / 2)
		shrunkAt = time.Now()
		resp, err := http.Post("http://"+srv.addr+"/_slots?withhold=4", "text/plain", nil)
		if err == nil {
			resp.Body.Close()
		}
	}()
	res, err := r.load("http://"+srv.addr+"/", r.rate, r.dur, "")
	srv.stop()
	if err != nil {
		return err
	}
	c := res.Classes["all"]
	half := len(c.GoodPerSecond) / 2
	sum := func(s []int) (n int) {
		for _, v := range s {
			n += v
		}
		return n
	}
	// The server's clock started before the load's: align on the
	// instant of the shrink.
	srv.mu.Lock()
	samples := srv.samples
	srv.mu.Unlock()
	if len(samples) == 0 || shrunkAt.IsZero() {
		return errors.New("no samples")
	}
	serverStart := began.Add(-time.Duration(samples[0].T * float64(time.Second))).Add(100 * time.Millisecond)
	at := shrunkAt.Sub(serverStart).Seconds()
	var before, last []float64
	end := samples[len(samples)-1].T
	for _, s := range samples {
		switch {
		case s.T > at-3 && s.T <= at:
			before = append(before, float64(s.Limit))
		case s.T > end-5:
			last = append(last, float64(s.Limit))
		}
	}
	final := mean(last)
	// The limit moves every 100ms window; the settling is read on its
	// means over 1 s, the first instant after which every such mean
	// stays within ±30 % of the final level.
	var after []sample
	for _, s := range samples {
		if s.T > at {
			after = append(after, s)
		}
	}
	settle := -1.0
	for i := len(after) - 10; i >= 0; i-- {
		m := 0.0
		for _, s := range after[i : i+10] {
			m += float64(s.Limit) / 10
		}
		if m < 0.7*final || m > 1.3*final {
			break
		}
		settle = after[i].T - at
	}
	fmt.Printf("limit: mean %.1f over the 3 s before the shrink, %.1f over the last 5 s; its 1 s means stay within ±30%% of the latter from %.1f s after the shrink\n", mean(before), final, settle)
	fmt.Printf("goodput: %.0f/s in the first half (capacity 400), %.0f/s in the second (capacity 200); admitted p50 %.1f ms, p99 %.1f ms over the run\n",
		float64(sum(c.GoodPerSecond[:half]))/float64(half), float64(sum(c.GoodPerSecond[half:]))/float64(len(c.GoodPerSecond)-half), c.P50, c.P99)
	fmt.Print("limit every 0.5 s from 2 s before the shrink:")
	for _, s := range samples {
		if s.T >= at-2 && s.T <= at+8 && int(s.T*10)%5 == 0 {
			fmt.Printf(" %d", s.Limit)
		}
	}
	fmt.Println()
	return nil
}

func mean(s []float64) float64 {
	if len(s) == 0 {
		return 0
	}
	t := 0.0
	for _, v := range s {
		t += v
	}
	return t / float64(len(s))
}

func (r *runner) elastic() error {
	fmt.Println("## Elastic: a client with limit 10/s and ceiling 50/s sending 60/s")
	fmt.Println()
	srv, err := r.startServer("elastic")
	if err != nil {
		return err
	}
	phase := r.dur / 2
	var other *loadResult
	var otherErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(phase)
		other, otherErr = r.load("http://"+srv.addr+"/", r.rate, phase, "")
	}()
	res, err := r.load("http://"+srv.addr+"/client", 60, 3*phase, "X-Client:c1")
	wg.Wait()
	srv.stop()
	if err != nil {
		return err
	}
	if otherErr != nil {
		return otherErr
	}
	c := res.Classes["c1"]
	p := int(phase.Seconds())
	avg := func(from, to int) float64 {
		n := 0
		for _, v := range c.GoodPerSecond[from:to] {
			n += v
		}
		return float64(n) / float64(to-from)
	}
	fmt.Printf("client admitted and answered per second: %v\n", c.GoodPerSecond)
	fmt.Printf("client refused with 429 per second:      %v\n", c.RatePerSecond)
	fmt.Printf("other traffic (%.0f/s from %d s to %d s): goodput %.0f/s, refused %d, late %d\n",
		r.rate, p, 2*p, float64(other.Classes["all"].Good)/phase.Seconds(), other.Classes["all"].Refused, other.Classes["all"].Late)
	down := -1
	for s := p; s < 2*p; s++ {
		if c.GoodPerSecond[s] <= 15 {
			down = s - p
			break
		}
	}
	fmt.Printf("idle (s 1..%d): %.1f/s; saturated (s %d..%d): %.1f/s, at most 15/s from second %d of the saturation; after (last 3 s): %.1f/s\n",
		p-1, avg(1, p), p+2, 2*p, avg(p+2, 2*p), down, avg(3*p-3, 3*p))
	return nil
}

func (r *runner) priority() error {
	fmt.Println("## Priorities: 20% critical, 80% sheddable at 3× capacity (adaptive)")
	fmt.Println()
	srv, err := r.startServer("priority")
	if err != nil {
		return err
	}
	res, err := r.load("http://"+srv.addr+"/", r.rate, r.dur, "X-Priority:critical=0.2,sheddable=0.8")
	srv.stop()
	if err != nil {
		return err
	}
	fmt.Println("| class | sent | good | success | refused | late | p50 ms | p99 ms |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	for _, k := range []string{"critical", "sheddable"} {
		c := res.Classes[k]
		fmt.Printf("| %s | %d | %d | %.2f %% | %d | %d | %.1f | %.1f |\n", k, c.Sent, c.Good, 100*float64(c.Good)/float64(max(c.Sent, 1)), c.Refused, c.Late, c.P50, c.P99)
	}
	return nil
}
