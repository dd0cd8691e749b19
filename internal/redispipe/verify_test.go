package redispipe

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestVerify asks a live server, then a hung one (SIGSTOP), whether they
// answer: the live one does, at once; the hung one does not, after
// verifyWait, or maxVerifyWait at most on a busy machine.
func TestVerify(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	p := newPipeliner(t, srv.Client(t, nil), Config{})
	d := p.single
	for i := range 3 {
		if v := d.verify(time.Now()); !v.answered || v.err != nil {
			t.Fatalf("verification %d of a live server: %+v", i, v)
		}
	}
	// A verdict stands for those who ask for one made since it.
	before := time.Now()
	v := d.verify(before)
	if again := d.verify(before); again != v {
		t.Errorf("a second verification since %v gave %+v after %+v", before, again, v)
	}

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	start := time.Now()
	v = d.verify(start)
	took := time.Since(start)
	if v.answered {
		t.Fatalf("a hung server answered: %+v", v)
	}
	if took < verifyWait || took > maxVerifyWait+slowCall {
		t.Errorf("the verification of a hung server took %v, want %v to %v", took, verifyWait, maxVerifyWait+slowCall)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// The late PONG of the hung server's PING must not be taken for the
	// answer to the next one; a fresh connection is dialed.
	if v := d.verify(time.Now()); !v.answered {
		t.Errorf("after the resume: %+v", v)
	}
}

// TestPeek checks the look at a socket that the verdict of a verification
// rests on: nothing before the server replies, the reply after, however
// long after, without consuming it; and EOF once the server closed the
// connection.
func TestPeek(t *testing.T) {
	if !canPeek {
		t.Skip("no peek on this system")
	}
	t.Parallel()
	srv := redistest.Standalone(t)
	conn, err := net.Dial("tcp", srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sock, sealed := socketOf(conn)
	if sock == nil || sealed {
		t.Fatalf("socketOf a TCP connection: %v, %v", sock, sealed)
	}
	var buf [64]byte
	if ok, err := peek(sock, buf[:]); ok || err != nil {
		t.Fatalf("peek before any request: %v, %v", ok, err)
	}
	if _, err := conn.Write(pingCommand); err != nil {
		t.Fatal(err)
	}
	// This goroutine is late to look, as a starved one would be.
	time.Sleep(20 * time.Millisecond)
	for range 2 {
		if ok, err := peek(sock, buf[:]); !ok || err != nil {
			t.Fatalf("peek after a PING: %v, %v", ok, err)
		}
	}
	if err := drain(sock, buf[:]); err != nil {
		t.Fatal(err)
	}
	if ok, err := peek(sock, buf[:]); ok || err != nil {
		t.Fatalf("peek after drain: %v, %v", ok, err)
	}
	if _, err := conn.Write([]byte("*1\r\n$4\r\nQUIT\r\n")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(20 * time.Millisecond)
	_ = drain(sock, buf[:]) // +OK, then EOF
	if ok, err := peek(sock, buf[:]); ok || err == nil {
		t.Errorf("peek of a connection the server closed: %v, %v; want EOF", ok, err)
	}
}

// TestLateLane delays every lane 100 ms after it takes a batch and before
// it sends it, as a process short of CPU would delay the lane's reading
// of a reply: the batches outstanding pass the stall threshold, and their
// callers' deadline of 50 ms, but the server answers its verifications,
// so no call fails and the destination never goes down.
func TestLateLane(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	key := srv.Prefix(t) + "late"
	c := srv.Client(t, nil)
	var log stateLog
	// A lane for each call: a call still queued at its deadline, every
	// lane asleep, has no reply on its way and rightly fails, which is
	// not what this test is about.
	p := newPipeliner(t, c, Config{OnStateChange: log.record, MaxInFlight: 8})
	// The destination dials its watch connection in the background; a
	// call past its deadline waits for a verification only once it is
	// there (not for a dial, which a busy machine may make slow).
	warm(t, p, key)
	awaitWatch(t, p)
	p.send = func(d *dest, ctx context.Context, sent []*call) bool {
		time.Sleep(100 * time.Millisecond)
		client := d.client.Load()
		pipe := client.Pipeline()
		d.p.commands(ctx, pipe, sent, nil, nil)
		_, err := pipe.Exec(ctx)
		d.finish(ctx, client, sent)
		return err == nil || isRedisError(err)
	}
	// The calls go out together.
	errs := make(chan error, 8)
	start := make(chan struct{})
	for range cap(errs) {
		go func() {
			<-start
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err := p.RunBy(ctx, time.Now().Add(50*time.Millisecond), batchDecide, []string{key}, decideArgs...)
			errs <- err
		}()
	}
	close(start)
	for range cap(errs) {
		if err := <-errs; err != nil {
			t.Errorf("a call answered late: %v", err)
		}
	}
	if ev := log.list(); len(ev) > 0 {
		t.Errorf("state changes %s, want none", describe(ev))
	}

	// A server that is hung, not late, still goes down.
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	_, err := p.RunBy(context.Background(), time.Now().Add(time.Second), batchDecide, []string{key}, decideArgs...)
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrStalled) {
		t.Errorf("a call to a hung server: %v, want ErrUnavailable (ErrStalled)", err)
	}
}

// awaitWatch waits, for up to 5 s, until every destination of p has its
// watch connection.
func awaitWatch(t *testing.T, p *Pipeliner) {
	t.Helper()
	p.mu.Lock()
	dests := make([]*dest, 0, len(p.byName)+1)
	for _, d := range p.byName {
		dests = append(dests, d)
	}
	p.mu.Unlock()
	if p.single != nil {
		dests = append(dests, p.single)
	}
	for _, d := range dests {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			d.watch.mu.Lock()
			ready := d.watch.conn != nil
			d.watch.mu.Unlock()
			if ready {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s has no watch connection after 5 s", d.name)
			}
		}
	}
}

// TestDirectCallRefused makes calls to a server that refuses
// connections: go-redis dials five times, 100 ms apart, unless a context
// deadline stops it, and no call must wait for that. One is a direct
// call, its destination having answered a call before the server was
// killed (go-redis finds the pooled connection closed and dials again);
// the other is a destination's first call, which goes to a lane (see
// directLocked).
func TestDirectCallRefused(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	key := srv.Prefix(t) + "refused"
	served := newPipeliner(t, srv.Client(t, nil), Config{})
	served.busy = func(time.Time) bool { return false }
	warm(t, served, key)
	first := newPipeliner(t, srv.Client(t, nil), Config{})
	first.busy = func(time.Time) bool { return false }
	srv.Kill()
	for _, c := range []struct {
		name string
		p    *Pipeliner
	}{{"a direct call", served}, {"a first call", first}} {
		start := time.Now()
		_, err := c.p.RunBy(context.Background(), start.Add(time.Second), batchDecide, []string{key}, decideArgs...)
		took := time.Since(start)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%s to a killed server: %v, want ErrUnavailable", c.name, err)
		}
		if took > MaxStallThreshold+verifyWait+slowCall {
			t.Errorf("%s to a killed server took %v, want at most %v", c.name, took, MaxStallThreshold+verifyWait+slowCall)
		}
	}
}
