package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// classResult is what one class of requests (one value of the header the
// load sets) got.
type classResult struct {
	Sent int `json:"sent"`
	// Good answered 2xx within the deadline.
	Good int `json:"good"`
	// Refused answered 429 or 503 (the limiter), Late missed the deadline,
	// Other anything else.
	Refused, Late, Other int
	// P50 and P99 are latencies of the Good requests, in ms, measured
	// from the instant each request was due to be sent.
	P50, P99 float64
	// PerSecond are the Good requests and the requests refused with 429
	// (a rate limit) in each second of the run.
	GoodPerSecond []int `json:"good_per_second"`
	RatePerSecond []int `json:"rate_limited_per_second"`
	lat           []time.Duration
}

// loadResult is the report of a load process, by class.
type loadResult struct {
	Classes map[string]*classResult `json:"classes"`
}

func loadMain(fs *flag.FlagSet) error {
	url := fs.String("url", "", "the URL to send GET requests to")
	rate := fs.Float64("rate", 1200, "requests per second")
	dur := fs.Duration("duration", 20*time.Second, "how long to send")
	deadline := fs.Duration("deadline", time.Second, "deadline of each request")
	header := fs.String("header", "", "NAME:value=share,value=share: a header whose value is drawn with these shares (the classes of the report)")
	seed := fs.Uint64("seed", 1, "seed of the draws")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return err
	}
	if *url == "" || *rate <= 0 || *dur <= 0 {
		return errors.New("load: need -url, a positive -rate and -duration")
	}
	name, values, shares, err := parseMix(*header)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{
		MaxIdleConns: 4096, MaxIdleConnsPerHost: 4096, IdleConnTimeout: 30 * time.Second,
	}}
	res := loadResult{Classes: map[string]*classResult{}}
	seconds := int(dur.Seconds() + 0.999)
	for _, v := range values {
		res.Classes[v] = &classResult{GoodPerSecond: make([]int, seconds), RatePerSecond: make([]int, seconds)}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	rng := rand.New(rand.NewPCG(*seed, 7))
	interval := time.Duration(float64(time.Second) / *rate)
	n := int(float64(*dur) / float64(interval))
	start := time.Now()
	for i := range n {
		due := start.Add(time.Duration(i) * interval)
		if d := time.Until(due); d > 0 {
			time.Sleep(d)
		}
		class := values[0]
		if len(values) > 1 {
			x := rng.Float64()
			for k, s := range shares {
				if x < s || k == len(shares)-1 {
					class = values[k]
					break
				}
				x -= s
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithDeadline(context.Background(), due.Add(*deadline))
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, *url, nil)
			if name != "" {
				req.Header.Set(name, class)
			}
			status := 0
			resp, err := client.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				status = resp.StatusCode
			}
			lat := time.Since(due)
			sec := min(int(due.Sub(start)/time.Second), seconds-1)
			mu.Lock()
			defer mu.Unlock()
			c := res.Classes[class]
			c.Sent++
			switch {
			case err == nil && status/100 == 2 && lat <= *deadline:
				c.Good++
				c.GoodPerSecond[sec]++
				c.lat = append(c.lat, lat)
			case status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable:
				c.Refused++
				if status == http.StatusTooManyRequests {
					c.RatePerSecond[sec]++
				}
			case err != nil && errors.Is(err, context.DeadlineExceeded) || lat > *deadline:
				c.Late++
			default:
				c.Other++
			}
		}()
	}
	wg.Wait()
	for _, c := range res.Classes {
		slices.Sort(c.lat)
		c.P50, c.P99 = pct(c.lat, 0.50), pct(c.lat, 0.99)
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// pct returns the p-quantile of sorted latencies, in ms.
func pct(s []time.Duration, p float64) float64 {
	if len(s) == 0 {
		return 0
	}
	i := min(int(float64(len(s))*p), len(s)-1)
	return float64(s[i]) / float64(time.Millisecond)
}

// parseMix parses "NAME:a=0.2,b=0.8".
func parseMix(s string) (name string, values []string, shares []float64, err error) {
	if s == "" {
		return "", []string{"all"}, []float64{1}, nil
	}
	name, rest, ok := strings.Cut(s, ":")
	if !ok || name == "" || rest == "" {
		return "", nil, nil, fmt.Errorf("load: bad -header %q", s)
	}
	for part := range strings.SplitSeq(rest, ",") {
		v, sh, ok := strings.Cut(part, "=")
		x := 1.0
		if ok {
			if x, err = strconv.ParseFloat(sh, 64); err != nil || x < 0 {
				return "", nil, nil, fmt.Errorf("load: bad share in %q", part)
			}
		}
		values, shares = append(values, v), append(shares, x)
	}
	return name, values, shares, nil
}
