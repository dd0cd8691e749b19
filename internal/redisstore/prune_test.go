package redisstore

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redispipe"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/window"
)

// TestPruneBoundsBucket adds a new client's counter to one bucket every
// 51 ms of a fake clock, 3,000 in all, each charged once under a sliding
// window of 5.1 s, so that 200 counters are live at any time (a counter
// matters for two windows) and 2,800 have expired by the end. The sampling
// of decide.lua must keep the bucket near twice its live counters (it
// drops, on average, as many expired counters per new one as it samples
// two), never drop a live one, and keep the bucket's expiry.
//
// The bucket's expiry runs in Redis's real time, two windows after its
// newest counter's instant: windows of seconds keep it alive however
// slowly a loaded machine runs the test (windows of 100 ms let it expire
// between the last write and the checks, 200 round trips later).
func TestPruneBoundsBucket(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	s := newTestStore(t, c, srv.Prefix(t))
	bucket := string(s.appendKey(nil, "churn"))
	const (
		clients = 3000
		step    = 51  // ms between two new clients (odd: the sampling reads the instant mod 4)
		live    = 200 // 2 windows of 100 steps
	)
	field := func(i int) []byte {
		sum := sha256.Sum256(binary.LittleEndian.AppendUint64(nil, uint64(i)))
		return sum[:fieldLen]
	}
	limit := window.Limit{Requests: 10, Window: live / 2 * step * time.Millisecond}
	base := window.Millis(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	head := string(redispipe.AppendHeader(nil, 1, 1))
	if err := script.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	for from := 0; from < clients; from += 100 {
		p := c.Pipeline()
		for i := from; i < from+100; i++ {
			ch := window.Charge{Limit: limit, Cost: 1}
			req := appendCharge(appendRequest(nil, base+int64(i*step), true), field(i), &ch, -1)
			script.EvalSha(ctx, p, []string{bucket}, 1, head, string(req))
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	n, err := c.HLen(ctx, bucket).Result()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d counters in the bucket after %d clients, %d of them live", n, clients, live)
	if n > 3*live {
		t.Errorf("%d counters in the bucket, want at most %d (3 × the %d live ones)", n, 3*live, live)
	}
	p := c.Pipeline()
	exists := make([]*redis.BoolCmd, 0, live)
	for i := clients - live; i < clients; i++ {
		exists = append(exists, p.HExists(ctx, bucket, string(field(i))))
	}
	if _, err := p.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	for k, e := range exists {
		if !e.Val() {
			t.Fatalf("live counter %d is gone", clients-live+k)
		}
	}
	if ttl := c.PTTL(ctx, bucket).Val(); ttl <= 0 {
		t.Errorf("the bucket's TTL is %s", ttl)
	}
}

// TestNewBucketExpires checks that the bucket a new counter makes gets an
// expiry of two windows whether or not the new counter samples it (when
// it does not, decide.lua cannot tell a new bucket from one that exists
// and tries NX after GT), and that a counter added to an existing bucket
// extends its expiry, never shortens it.
func TestNewBucketExpires(t *testing.T) {
	t.Parallel()
	srv := redistest.Shared(t)
	c := srv.Client(t, nil)
	ctx := context.Background()
	s := newTestStore(t, c, srv.Prefix(t))
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, sample := range []bool{false, true} {
		key := "new-bucket/" + strconv.FormatBool(sample)
		ch := newCounter(key, now, sample)
		take(t, s, now, ch)
		bucket := string(s.appendKey(nil, key))
		want := 2 * ch.Limit.Window
		if ttl := c.PTTL(ctx, bucket).Val(); ttl <= want-time.Second || ttl > want {
			t.Errorf("sample %v: a new bucket's TTL is %s, want %s", sample, ttl, want)
		}
		// A counter of a shorter window added later leaves the expiry.
		short := xc(key, "short", swl(10, time.Second), 1)
		take(t, s, now.Add(time.Millisecond), short)
		if ttl := c.PTTL(ctx, bucket).Val(); ttl <= want-time.Second {
			t.Errorf("sample %v: a shorter counter cut the bucket's TTL to %s", sample, ttl)
		}
	}
}
