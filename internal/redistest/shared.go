package redistest

import (
	"os"
	"sync"
	"testing"
)

// shared holds the servers of a test binary that Shared and SharedCluster
// start on first use and Main stops.
var shared struct {
	standaloneOnce sync.Once
	standalone     *Server
	standaloneErr  error

	clusterOnce sync.Once
	cluster     *ClusterServer
	clusterErr  error
}

// Shared returns the standalone server shared by the tests of this test
// binary, starting it on first use. The package's TestMain must run the
// tests through Main, which stops it. Tests that share it must keep to
// their own keys (see (*Server).Prefix) and must not stop or pause it.
func Shared(t testing.TB) *Server {
	t.Helper()
	requireBinary(t)
	shared.standaloneOnce.Do(func() {
		dir, err := os.MkdirTemp("", "redistest-")
		if err != nil {
			shared.standaloneErr = err
			return
		}
		s, err := startServer(dir, false, nil)
		if err != nil {
			_ = os.RemoveAll(dir)
			shared.standaloneErr = err
			return
		}
		s.ownDir = true
		shared.standalone = s
	})
	if shared.standaloneErr != nil {
		t.Fatalf("redistest: shared server: %v", shared.standaloneErr)
	}
	return shared.standalone
}

// SharedCluster returns the three-master cluster shared by the tests of
// this test binary, starting it on first use. The package's TestMain must
// run the tests through Main, which stops it.
func SharedCluster(t testing.TB) *ClusterServer {
	t.Helper()
	requireBinary(t)
	shared.clusterOnce.Do(func() {
		dir, err := os.MkdirTemp("", "redistest-cluster-")
		if err != nil {
			shared.clusterErr = err
			return
		}
		c, err := startCluster(dir, false)
		if err != nil {
			_ = os.RemoveAll(dir)
			shared.clusterErr = err
			return
		}
		c.ownDir = true
		shared.cluster = c
	})
	if shared.clusterErr != nil {
		t.Fatalf("redistest: shared cluster: %v", shared.clusterErr)
	}
	return shared.cluster
}

// Main runs the tests and benchmarks of m, stops the shared servers and
// exits with m's exit code. Call it from TestMain in packages that use
// Shared or SharedCluster. (Should the binary die first, the servers are
// killed with it on Linux.)
func Main(m *testing.M) {
	code := m.Run()
	stopShared()
	os.Exit(code)
}

func stopShared() {
	if shared.standalone != nil {
		shared.standalone.Stop()
	}
	if shared.cluster != nil {
		shared.cluster.Stop()
	}
}
