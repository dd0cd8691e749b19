package main

import (
	"bytes"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// clientEnv carries the flags of a client process: the test binary runs
// main with them instead of its tests.
const clientEnv = "SLUICE_EXAMPLE_OUTBOUND_CLIENT"

func TestMain(m *testing.M) {
	if args := os.Getenv(clientEnv); args != "" {
		os.Args = append(os.Args[:1], strings.Split(args, "\x1f")...)
		main()
		os.Exit(0)
	}
	redistest.Main(m)
}

// clientProcess runs a client process: this test binary, running main.
func clientProcess(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), clientEnv+"="+strings.Join(args, "\x1f"))
	return cmd
}

var upstreamLine = regexp.MustCompile(`upstream: (\d+) admitted, (\d+) refused`)

// TestDemo runs the example's two client processes toward its upstream
// (50 requests a second, 25 requests each): sharing their budget in Redis,
// they send all 50 and the upstream refuses none.
func TestDemo(t *testing.T) {
	t.Parallel()
	srv := redistest.Standalone(t)
	var out bytes.Buffer
	var mu sync.Mutex
	w := writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	})
	if err := demo(w, clientProcess, srv.Addr(), 50, 25); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	m := upstreamLine.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no upstream report in %q", out.String())
	}
	ok, _ := strconv.Atoi(m[1])
	refused, _ := strconv.Atoi(m[2])
	if ok != 50 || refused != 0 {
		t.Errorf("the upstream admitted %d and refused %d, want 50 and none", ok, refused)
	}
	if n := strings.Count(out.String(), "25 sent"); n != 2 {
		t.Errorf("%d clients report 25 sent, want 2", n)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
