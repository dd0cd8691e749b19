// Package redistest starts real redis-server processes for tests: a
// standalone server, a three-master Redis Cluster with or without replicas,
// or a master and replica watched by three Sentinels, each on free loopback
// ports, with persistence off and a temporary working directory.
//
// Standalone, Cluster, ClusterWithReplicas and Sentinel start servers
// owned by one test and stopped by its cleanup. Shared and SharedCluster
// start, once per test binary, servers that many tests use together; a
// package that calls them runs its tests through Main, which stops them:
//
//	func TestMain(m *testing.M) { redistest.Main(m) }
//
// Tests that share a server keep apart by using the key prefix from
// (*Server).Prefix or (*ClusterServer).Prefix, which also deletes the keys
// when the test ends. Nothing here ever flushes a database.
//
// It needs redis-server 7.0 or later (for --cluster-port and CLUSTER
// ADDSLOTSRANGE) in PATH; Sentinel runs it with --sentinel. When it is
// missing, tests are skipped, or fail if the CI environment variable is
// set, with a message that says how to install it.
//
// # Failures
//
// Every server can be killed with SIGKILL, as a crash would, by Kill or
// Stop, brought back on the same port by Restart, and hung by Pause. The
// replicated topologies add what resilience tests need around that: which
// master serves a key, waiting for replicas to catch up before a kill
// (WaitReplicated), and waiting, bounded, for a failover to finish, which
// reports how long it took:
//
//	c := redistest.ClusterWithReplicas(t)
//	m, _ := c.MasterForKey(ctx, key)
//	_ = m.WaitReplicated(ctx)
//	m.Kill()
//	promoted, took, err := c.WaitFailover(ctx, m)
//
// # Resharding
//
// A Cluster's slots move as redis-cli --cluster reshard and rebalance move
// them, while the test's clients keep using them: AddMaster starts a node
// and has it join as a master with no slot; MoveSlots moves slots to a
// master (IMPORTING and MIGRATING, MIGRATE of a few keys at a time, which
// MoveOptions.Pause can hold half moved, then SETSLOT NODE on every
// master); Rebalance moves slots to the masters that have less than their
// share:
//
//	n, _ := c.AddMaster(ctx)
//	m, _ := c.MoveSlots(ctx, n, slots, redistest.MoveOptions{Batch: 2})
//	_, _ = c.Rebalance(ctx, redistest.MoveOptions{Max: 64})
//
// ErrorStats (INFO errorstats) counts the MOVED, ASK and TRYAGAIN replies
// a node sent, and StandaloneWith starts a server with options of the
// test's own ("--maxmemory", "4mb").
//
// # Measuring
//
// Tests that state what a store costs Redis read it from the server:
// ReadUsage (INFO commandstats and cpu: commands, script runs and the
// server's CPU time, Usage.Sub between two readings), ScriptCalls,
// InfoMemory (used_memory and the other fields of INFO memory) and, for
// the test process itself, ProcessCPU. KeySlot gives a key's Redis
// Cluster hash slot.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/keyguard"
)

// installHint says how to get the binaries the tests need.
const installHint = "REDIS TESTS NOT RUN: redis-server (7.0 or later) is not in PATH, and these tests start real servers. " +
	"Install it with `apt-get install -y redis-server redis-tools`, or run `make test`, which does."

const (
	startAttempts = 5
	readyTimeout  = 10 * time.Second
	pollInterval  = 10 * time.Millisecond
)

// Server is a redis-server process listening on a loopback port.
type Server struct {
	addr string
	args []string
	dir  string
	// ownDir is set when dir was created here and must be removed on Stop.
	ownDir bool

	// nodeID is the Redis Cluster node ID, set for cluster nodes.
	nodeID string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	// killedAt is when the process was last killed; zero if never.
	killedAt time.Time
}

// Standalone starts a standalone redis-server for the test and stops it
// when the test ends.
func Standalone(t testing.TB) *Server {
	t.Helper()
	requireBinary(t)
	s, err := startServer(t.TempDir(), false, nil)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// StandaloneWith is Standalone with more command-line options for
// redis-server, which override the defaults: "--maxmemory", "4mb", say.
func StandaloneWith(t testing.TB, args ...string) *Server {
	t.Helper()
	requireBinary(t)
	s, err := startServer(t.TempDir(), false, args)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Addr returns the server's host:port.
func (s *Server) Addr() string { return s.addr }

// Client returns a client of the server, closed when the test ends. opts
// may be nil; its Addr is set to the server's.
func (s *Server) Client(t testing.TB, opts *redis.Options) *redis.Client {
	t.Helper()
	o := redis.Options{}
	if opts != nil {
		o = *opts
	}
	o.Addr = s.addr
	c := redis.NewClient(&o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix unique to the test (see the package
// function Prefix) and deletes the keys that start with it when the test
// ends.
func (s *Server) Prefix(t testing.TB) string {
	t.Helper()
	p := Prefix(t)
	t.Cleanup(func() { deleteKeys(s.addr, p) })
	return p
}

// Kill kills the server with SIGKILL, as a crash would: no shutdown, no
// save, connections reset. It waits for the process to exit and keeps the
// working directory, so Restart can bring the server back. It is safe to
// call more than once, and on a paused server.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
}

// Running reports whether the server's process runs (paused or not): it
// was started and not killed since.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// Stop kills the server with SIGKILL, like Kill, waits for it to exit, and
// removes the working directory if this package created it. It is safe to
// call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
		s.ownDir = false
	}
}

func (s *Server) stopLocked() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill() // SIGKILL
	<-s.done
	s.cmd = nil
	s.killedAt = time.Now()
}

// sinceKilled returns the time since the server was last killed, or since
// start if it never was or runs again.
func (s *Server) sinceKilled(start time.Time) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil && !s.killedAt.IsZero() {
		return time.Since(s.killedAt)
	}
	return time.Since(start)
}

// Restart kills the server if it runs and starts it again on the same port,
// directory and options, so that clients of the old process reconnect to
// the new one. Data is not kept: persistence is off. A cluster node comes
// back with its node ID and its view of the cluster; a Sentinel with its
// rewritten configuration.
func (s *Server) Restart() error { return s.restart(nil) }

// restart is Restart with more command-line options for this start only.
func (s *Server) restart(extra []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopLocked()
	var err error
	// The port was just released; another process may take it, which this
	// cannot help, but a socket in TIME_WAIT is no obstacle for Redis.
	for attempt := 0; attempt < startAttempts; attempt++ {
		if err = s.spawnLocked(extra); err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return err
}

// Pause stops the server process with SIGSTOP, so that it keeps its
// connections open but never answers: the way a hung server looks to its
// clients. Resume undoes it. Stop works on a paused server. On systems
// without SIGSTOP it returns an error.
func (s *Server) Pause() error { return s.signal(sigStop) }

// Resume continues a server stopped by Pause.
func (s *Server) Resume() error { return s.signal(sigCont) }

func (s *Server) signal(sig os.Signal) error {
	if sig == nil {
		return errors.New("redistest: signal not supported on this system")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server is not running")
	}
	return s.cmd.Process.Signal(sig)
}

// startServer starts redis-server in dir on a free port, trying again with
// another port if the chosen one was taken in the meantime. extra holds
// more command-line options, which override the defaults; cluster asks for
// a cluster bus port too.
func startServer(dir string, cluster bool, extra []string) (*Server, error) {
	return startWith(dir, func(port int) ([]string, error) {
		p := strconv.Itoa(port)
		args := []string{
			"--port", p,
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--dir", dir,
			"--logfile", filepath.Join(dir, "redis-"+p+".log"),
			// Servers share dir. A replica's full sync goes through this
			// file unless it loads from the socket, and a file left behind
			// would be loaded by a restart.
			"--dbfilename", "dump-" + p + ".rdb",
			"--repl-diskless-load", "on-empty-db",
			"--rdb-del-sync-files", "yes",
		}
		if cluster {
			bus, err := freePort()
			if err != nil {
				return nil, err
			}
			args = append(args,
				"--cluster-enabled", "yes",
				"--cluster-config-file", filepath.Join(dir, "nodes-"+p+".conf"),
				"--cluster-node-timeout", "2000",
				"--cluster-port", strconv.Itoa(bus),
				"--cluster-announce-ip", "127.0.0.1",
			)
		}
		return append(args, extra...), nil
	})
}

// startWith starts redis-server in dir with the arguments that argsFor
// returns for a free port, trying again with another port if the chosen
// one was taken in the meantime. The server must log to
// dir/redis-<port>.log.
func startWith(dir string, argsFor func(port int) ([]string, error)) (*Server, error) {
	var lastErr error
	for attempt := 0; attempt < startAttempts; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		args, err := argsFor(port)
		if err != nil {
			return nil, err
		}
		s := &Server{
			addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			dir:  dir,
			args: args,
		}
		s.mu.Lock()
		lastErr = s.spawnLocked(nil)
		s.mu.Unlock()
		if lastErr == nil {
			return s, nil
		}
	}
	return nil, fmt.Errorf("could not start redis-server after %d attempts: %w", startAttempts, lastErr)
}

// spawnLocked starts the process with s.args and extra, and waits until
// it answers PING.
func (s *Server) spawnLocked(extra []string) error {
	cmd := exec.Command(serverBinary(), append(slices.Clip(s.args), extra...)...)
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.cmd, s.done = cmd, done

	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			s.cmd = nil
			return fmt.Errorf("redis-server on %s exited: %s", s.addr, s.logTail())
		default:
		}
		if ping(s.addr) == nil {
			return nil
		}
		if time.Now().After(deadline) {
			s.stopLocked()
			return fmt.Errorf("redis-server on %s did not answer PING within %s: %s", s.addr, readyTimeout, s.logTail())
		}
		time.Sleep(pollInterval)
	}
}

// logTail returns the end of the server's log file, for error messages.
func (s *Server) logTail() string {
	_, port, _ := net.SplitHostPort(s.addr)
	b, err := os.ReadFile(filepath.Join(s.dir, "redis-"+port+".log"))
	if err != nil {
		return "(no log)"
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 5 {
		lines = lines[len(lines)-5:]
	}
	return strings.Join(lines, " | ")
}

// ping sends PING over a fresh connection and checks for PONG.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(500 * time.Millisecond))
	if _, err := conn.Write([]byte("*1\r\n$4\r\nPING\r\n")); err != nil {
		return err
	}
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(buf[:n]), "+PONG") {
		return fmt.Errorf("PING answered %q", buf[:n])
	}
	return nil
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// requireBinary skips the test, or fails it under CI, when redis-server is
// not installed.
// Under CI it also fails the test when the key guard is off (see package
// keyguard): every script that CI runs on a real server is checked for
// undeclared keys.
func requireBinary(t testing.TB) {
	t.Helper()
	if err := binaryError(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal(installHint)
		}
		t.Skip(installHint)
	}
	if os.Getenv("CI") != "" && !keyguard.Enabled {
		t.Fatalf("redistest: CI runs the Redis tests with %s=1 (make test sets it), so that every script is checked for undeclared keys", keyguard.Env)
	}
}

// ServerEnv names the environment variable that points this package at
// another server binary than the redis-server in PATH: a Valkey or a newer
// Redis built by hand, to run the suite against it (docs/development.md).
const ServerEnv = "SLUICE_REDIS_SERVER"

// serverBinary returns the server binary this package starts: the one
// SLUICE_REDIS_SERVER names, or redis-server.
func serverBinary() string {
	if b := os.Getenv(ServerEnv); b != "" {
		return b
	}
	return "redis-server"
}

func binaryError() error {
	_, err := exec.LookPath(serverBinary())
	return err
}

// Prefix returns a key prefix unique to the test: "sluicetest:", the
// test's name with every character outside [A-Za-z0-9_.-] replaced by '_',
// and a random suffix, ending in ':'. It never contains '{' or '}', nor a
// glob metacharacter.
func Prefix(t testing.TB) string {
	name := t.Name()
	if len(name) > 48 {
		name = name[len(name)-48:]
	}
	b := []byte(name)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '_', c == '.', c == '-':
		default:
			b[i] = '_'
		}
	}
	var r [6]byte
	_, _ = rand.Read(r[:])
	return "sluicetest:" + string(b) + ":" + hex.EncodeToString(r[:]) + ":"
}

// deleteKeys deletes, on the server at addr, the keys that start with
// prefix. Errors are ignored: the server may have been stopped by the test.
func deleteKeys(addr, prefix string) {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// One UNLINK per key: on a cluster node the keys span many slots.
	iter := c.Scan(ctx, 0, prefix+"*", 1000).Iterator()
	pipe := c.Pipeline()
	for iter.Next(ctx) {
		pipe.Unlink(ctx, iter.Val())
		if pipe.Len() == 500 {
			_, _ = pipe.Exec(ctx)
		}
	}
	if pipe.Len() > 0 {
		_, _ = pipe.Exec(ctx)
	}
}

// ScriptCalls returns how many scripts (EVALSHA and EVAL) the server that
// c talks to has run, from INFO commandstats.
func ScriptCalls(t testing.TB, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("redistest: INFO commandstats: %v", err)
	}
	n := 0
	for _, line := range strings.Split(info, "\n") {
		for _, name := range []string{"cmdstat_evalsha:", "cmdstat_eval:"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), name); ok {
				calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
				v, err := strconv.Atoi(calls)
				if err != nil {
					t.Fatalf("redistest: parse %q: %v", line, err)
				}
				n += v
			}
		}
	}
	return n
}
