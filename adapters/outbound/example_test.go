package outbound_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/adapters/outbound"
	"github.com/sluicehq/sluice/keyfunc"
	"github.com/sluicehq/sluice/middleware"
)

// An http.Client whose requests to each host share 2 requests a second:
// the third waits for its turn, or fails unsent when its deadline comes
// first. With middleware.WithStore(redisStore) the budget is the
// fleet's.
func ExampleNew() {
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer api.Close()

	lim, err := middleware.NewRules([]middleware.Rule{{
		Name:   "partner",
		Key:    outbound.Host(),
		Limits: []middleware.Limit{middleware.PerSecond(2).TokenBucket(1)},
	}}, middleware.WithPauses())
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	t, err := outbound.New(lim, outbound.Options{MaxWait: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: t}

	start := time.Now()
	for range 2 {
		resp, err := client.Get(api.URL)
		if err != nil {
			panic(err)
		}
		resp.Body.Close()
	}
	fmt.Println("the second request waited its turn:", time.Since(start) >= 450*time.Millisecond)

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api.URL, nil)
	_, err = client.Do(req)
	var we *outbound.WaitError
	fmt.Println("the third, with 100ms to live, was not sent:", errors.As(err, &we), errors.Is(err, outbound.ErrTooLong))
	// Output:
	// the second request waited its turn: true
	// the third, with 100ms to live, was not sent: true true
}

// A budget per tenant at the upstream: the key the caller puts in the
// request's context, joined to the host.
func ExampleFromContext() {
	api := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer api.Close()
	lim, err := middleware.NewRules([]middleware.Rule{{
		Name:   "per-tenant",
		Key:    keyfunc.Join(outbound.Host(), outbound.FromContext()),
		Limits: []middleware.Limit{middleware.PerMinute(600)},
	}}, middleware.WithPauses())
	if err != nil {
		panic(err)
	}
	defer lim.Close()
	t, err := outbound.New(lim, outbound.Options{})
	if err != nil {
		panic(err)
	}
	client := &http.Client{Transport: t}

	ctx := outbound.WithKey(context.Background(), "tenant-42")
	req, _ := http.NewRequestWithContext(ctx, "GET", api.URL+"/v1/items", nil)
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	host := api.Listener.Addr().String()
	for _, tenant := range []string{"tenant-42", "tenant-7"} {
		st, _ := lim.Peek(context.Background(), "per-tenant", "host:"+host+"|ctx:"+tenant)
		fmt.Println(tenant, "has", st[0].Remaining, "left")
	}
	// Output:
	// tenant-42 has 599 left
	// tenant-7 has 600 left
}
