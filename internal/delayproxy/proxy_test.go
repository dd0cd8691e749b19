package delayproxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// echo starts a TCP server that writes back every byte it reads.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// dial connects to the echo server through p, until the test ends.
func dial(t *testing.T, p *Proxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatalf("dial through the proxy: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c, bufio.NewReader(c)
}

// roundTrip writes line and returns how long its echo took to come back.
func roundTrip(t *testing.T, c net.Conn, r *bufio.Reader, line string) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := r.ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	if got != line+"\n" {
		t.Fatalf("echo %q, want %q", got, line)
	}
	return time.Since(start)
}

// TestSetDelay changes the delay of an open connection: each round trip
// takes twice the delay in force, give or take this machine's scheduling.
func TestSetDelay(t *testing.T) {
	t.Parallel()
	p := Start(t, echo(t), 0)
	c, r := dial(t, p)
	for i, d := range []time.Duration{0, 30 * time.Millisecond, 5 * time.Millisecond, 60 * time.Millisecond, 0} {
		p.SetDelay(d)
		if got := p.Delay(); got != d {
			t.Fatalf("Delay() = %v after SetDelay(%v)", got, d)
		}
		rtt := roundTrip(t, c, r, "line "+strconv.Itoa(i))
		t.Logf("delay %v: round trip %v", d, rtt)
		if rtt < 2*d || rtt > 2*d+150*time.Millisecond {
			t.Errorf("delay %v: round trip %v, want about %v", d, rtt, 2*d)
		}
	}
}

// TestOrderKeptWhenDelayFalls writes a burst under a long delay, lowers
// the delay to zero, writes more, and reads everything back in order: the
// later bytes wait behind the earlier, which reach the echo server after
// 80 ms (their way back is then without delay). The proxy reads the burst
// in its own process: when it read it only after the delay fell (the
// burst came back within 80 ms), the attempt proves nothing about order
// and is made again, with longer for the proxy to read the burst.
func TestOrderKeptWhenDelayFalls(t *testing.T) {
	t.Parallel()
	for _, settle := range []time.Duration{5 * time.Millisecond, 20 * time.Millisecond, 100 * time.Millisecond} {
		if orderKept(t, settle) {
			return
		}
	}
	t.Fatal("the proxy never read the burst before the delay fell, in 3 attempts")
}

// orderKept is an attempt of TestOrderKeptWhenDelayFalls that gives the
// proxy settle to read the burst; it reports whether the burst was held.
func orderKept(t *testing.T, settle time.Duration) bool {
	t.Helper()
	p := Start(t, echo(t), 80*time.Millisecond)
	c, r := dial(t, p)
	start := time.Now()
	for i := range 100 {
		fmt.Fprintf(c, "%d\n", i)
	}
	time.Sleep(settle) // let the proxy read the burst
	p.SetDelay(0)
	for i := 100; i < 200; i++ {
		fmt.Fprintf(c, "%d\n", i)
	}
	held := true
	for i := range 200 {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line != strconv.Itoa(i)+"\n" {
			t.Fatalf("line %d is %q: order lost", i, line)
		}
		if i == 0 && time.Since(start) < 80*time.Millisecond {
			held = false
		}
	}
	return held
}

// TestStop holds every byte without closing anything, accepts new
// connections that carry nothing, and delivers what it held, in order,
// once forwarding resumes.
func TestStop(t *testing.T) {
	t.Parallel()
	p := Start(t, echo(t), 0)
	c, r := dial(t, p)
	roundTrip(t, c, r, "before")

	p.Stop()
	if _, err := io.WriteString(c, "held\n"); err != nil {
		t.Fatal(err)
	}
	c2, r2 := dial(t, p) // accepted, though nothing goes through
	if _, err := io.WriteString(c2, "second\n"); err != nil {
		t.Fatal(err)
	}
	for _, conn := range []net.Conn{c, c2} {
		_ = conn.SetReadDeadline(time.Now().Add(150 * time.Millisecond))
		var b [1]byte
		if n, err := conn.Read(b[:]); n != 0 || !isTimeout(err) {
			t.Fatalf("read while stopped: %d bytes, %v; want a timeout", n, err)
		}
		_ = conn.SetReadDeadline(time.Time{})
	}

	p.SetDelay(0)
	if got, err := r.ReadString('\n'); err != nil || got != "held\n" {
		t.Fatalf("after resuming: %q, %v; want the held line", got, err)
	}
	if got, err := r2.ReadString('\n'); err != nil || got != "second\n" {
		t.Fatalf("second connection after resuming: %q, %v", got, err)
	}
	roundTrip(t, c, r, "after")
}

// TestCutHeal closes the connections through a cut link and refuses new
// ones until it heals.
func TestCutHeal(t *testing.T) {
	t.Parallel()
	p := Start(t, echo(t), 0)
	c, r := dial(t, p)
	roundTrip(t, c, r, "before")
	p.Cut()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := r.ReadString('\n'); err == nil || isTimeout(err) {
		t.Fatalf("read on a cut link: %v, want the connection closed", err)
	}
	p.Heal()
	c2, r2 := dial(t, p)
	roundTrip(t, c2, r2, "after")
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestOwnProcess checks that the proxy forwards from a process of its own
// (see child.go), which ends with Close, and that a Close twice is
// harmless.
func TestOwnProcess(t *testing.T) {
	t.Parallel()
	p, err := New(echo(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	proc := p.ctl.cmd.Process
	if proc.Pid == os.Getpid() {
		t.Fatalf("the proxy runs in this process (%d)", proc.Pid)
	}
	c, r := dial(t, p)
	roundTrip(t, c, r, "through another process")
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	if err := proc.Signal(syscall.Signal(0)); err == nil {
		t.Errorf("the proxy process %d still runs after Close", proc.Pid)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Errorf("%s still accepts connections after Close", p.Addr())
	}
}

// TestChangedAt checks that ChangedAt tells when the proxy process applied
// the latest change: between the call and its return.
func TestChangedAt(t *testing.T) {
	t.Parallel()
	p := Start(t, echo(t), 0)
	for _, change := range []func(){func() { p.SetDelay(time.Millisecond) }, p.Stop, p.Cut, p.Heal} {
		before := time.Now()
		change()
		after := time.Now()
		if at := p.ChangedAt(); at.Before(before) || at.After(after) {
			t.Errorf("ChangedAt() = %v, want between %v and %v", at, before, after)
		}
	}
}
