package delayproxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A proxy of New runs in a process of its own: this binary again, which
// this package's init turns into the proxy when childEnv is set. In the
// test's own process, the goroutines that forward the bytes would wait
// to run behind the test's: Go runs a goroutine woken by the network
// after those already waiting, so on a busy machine a link of 20 ms
// would take 20 ms plus twice the test process's scheduling lag each
// way, and the test would measure its own load rather than the delay it
// set. In a process of its own, with a handful of goroutines, the proxy
// is late only as a redis-server is: when the machine does not run it.
//
// The parent drives the child over its standard input, a command per
// line, each answered with "ok" and the instant it took effect (Unix
// nanoseconds) on its standard output: "delay NS", "stop", "cut", "heal". The child's first line is the address it
// listens on; it closes the proxy and exits when its standard input
// ends, so that it never outlives the test.
const (
	childEnv       = "SLUICE_DELAYPROXY_CHILD"
	childTargetEnv = "SLUICE_DELAYPROXY_TARGET"
	childDelayEnv  = "SLUICE_DELAYPROXY_DELAY"
)

func init() {
	if os.Getenv(childEnv) != "1" {
		return
	}
	if err := serveChild(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "delayproxy:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// serveChild runs a local proxy for the parent that drives it over in
// and out, until in ends.
func serveChild(in io.Reader, out io.Writer) error {
	delay, err := time.ParseDuration(os.Getenv(childDelayEnv))
	if err != nil {
		return fmt.Errorf("%s: %w", childDelayEnv, err)
	}
	p, err := newLocal(os.Getenv(childTargetEnv), delay)
	if err != nil {
		return err
	}
	defer p.Close()
	if _, err := fmt.Fprintln(out, p.Addr()); err != nil {
		return err
	}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		cmd, arg, _ := strings.Cut(sc.Text(), " ")
		switch cmd {
		case "delay":
			ns, err := strconv.ParseInt(arg, 10, 64)
			if err != nil {
				return fmt.Errorf("delay %q: %w", arg, err)
			}
			p.SetDelay(time.Duration(ns))
		case "stop":
			p.Stop()
		case "cut":
			p.Cut()
		case "heal":
			p.Heal()
		default:
			return fmt.Errorf("unknown command %q", sc.Text())
		}
		if _, err := fmt.Fprintln(out, "ok", p.ChangedAt().UnixNano()); err != nil {
			return err
		}
	}
	return sc.Err()
}

// child is the parent's end of a proxy in a process of its own.
type child struct {
	mu    sync.Mutex // one command at a time
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Reader
	addr  string
	delay time.Duration
	// changed is when the child applied the latest command.
	changed time.Time
	err     error // the first failure to drive the child
}

// childStart starts this binary again as a proxy to target with delay,
// and waits for the address it listens on.
func childStart(target string, delay time.Duration) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1", childTargetEnv+"="+target, childDelayEnv+"="+delay.String())
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewReader(outPipe), delay: delay}
	line, err := c.out.ReadString('\n')
	if err != nil {
		_ = in.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("start the proxy process: %w", err)
	}
	c.addr = strings.TrimSpace(line)
	return c, nil
}

// do sends one command and waits for its "ok": when do returns, the
// proxy applies it to every byte it reads from then on.
func (c *child) do(command string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return
	}
	if _, err := io.WriteString(c.in, command+"\n"); err != nil {
		c.err = err
		return
	}
	line, err := c.out.ReadString('\n')
	if err == nil {
		ok, at, _ := strings.Cut(strings.TrimSpace(line), " ")
		ns, perr := strconv.ParseInt(at, 10, 64)
		if ok != "ok" || perr != nil {
			err = fmt.Errorf("%q answered %q", command, line)
		}
		c.changed = time.Unix(0, ns)
	}
	if err != nil {
		c.err = err
		// The tests rely on what they asked for; one that cannot be done
		// is not to be measured.
		panic(fmt.Sprintf("delayproxy: the proxy process failed: %v", err))
	}
}

// close ends the child and waits for it.
func (c *child) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	_ = c.in.Close()
	err := c.cmd.Wait()
	c.cmd = nil
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return fmt.Errorf("delayproxy: the proxy process: %w", err)
	}
	return err
}
