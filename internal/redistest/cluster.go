package redistest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterMasters is the number of masters of a test cluster.
const clusterMasters = 3

// ClusterServer is a Redis Cluster of three masters and no replicas, each
// a redis-server process on loopback, with the 16384 slots split evenly.
type ClusterServer struct {
	nodes []*Server
	dir   string
	// ownDir is set when dir was created here and must be removed on Stop.
	ownDir bool
}

// Cluster starts a three-master Redis Cluster for the test, waits until
// every node reports cluster_state:ok, and stops it when the test ends.
func Cluster(t testing.TB) *ClusterServer {
	t.Helper()
	requireBinary(t)
	c, err := startCluster(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Addrs returns the host:port of every master.
func (c *ClusterServer) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the masters' servers.
func (c *ClusterServer) Nodes() []*Server { return c.nodes }

// Client returns a cluster client, closed when the test ends. opts may be
// nil; its Addrs is set to the cluster's.
func (c *ClusterServer) Client(t testing.TB, opts *redis.ClusterOptions) *redis.ClusterClient {
	t.Helper()
	o := redis.ClusterOptions{}
	if opts != nil {
		o = *opts
	}
	o.Addrs = c.Addrs()
	cc := redis.NewClusterClient(&o)
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// Prefix returns a key prefix unique to the test (see the package function
// Prefix) and deletes the keys that start with it, on every master, when
// the test ends.
func (c *ClusterServer) Prefix(t testing.TB) string {
	t.Helper()
	p := Prefix(t)
	t.Cleanup(func() {
		for _, n := range c.nodes {
			deleteKeys(n.Addr(), p)
		}
	})
	return p
}

// Stop stops every node. It is safe to call more than once.
func (c *ClusterServer) Stop() {
	for _, n := range c.nodes {
		n.Stop()
	}
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
		c.ownDir = false
	}
}

// startCluster starts the nodes in dir, assigns the slots, introduces the
// nodes to one another and waits for the cluster to be ready.
func startCluster(dir string) (_ *ClusterServer, err error) {
	c := &ClusterServer{dir: dir}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	for i := 0; i < clusterMasters; i++ {
		n, err := startServer(dir, true, nil)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := make([]*redis.Client, len(c.nodes))
	for i, n := range c.nodes {
		clients[i] = redis.NewClient(&redis.Options{Addr: n.Addr(), MaxRetries: -1})
		defer clients[i].Close()
	}

	const slots = 16384
	for i, cl := range clients {
		lo, hi := i*slots/clusterMasters, (i+1)*slots/clusterMasters-1
		// Distinct config epochs spare the nodes a round of conflict
		// resolution; this must happen before they meet.
		if err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return nil, fmt.Errorf("cluster set-config-epoch on %s: %w", c.nodes[i].Addr(), err)
		}
		if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			return nil, fmt.Errorf("cluster addslotsrange on %s: %w", c.nodes[i].Addr(), err)
		}
	}
	for i := 1; i < len(c.nodes); i++ {
		host, port, bus := "127.0.0.1", portOf(c.nodes[i].Addr()), c.nodes[i].busPort()
		if err := clients[0].Do(ctx, "CLUSTER", "MEET", host, port, bus).Err(); err != nil {
			return nil, fmt.Errorf("cluster meet %s: %w", c.nodes[i].Addr(), err)
		}
	}

	// Wait until every node has the whole picture.
	for {
		ready := true
		var last string
		for i, cl := range clients {
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return nil, fmt.Errorf("cluster info on %s: %w", c.nodes[i].Addr(), err)
			}
			if !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, "cluster_slots_assigned:16384") ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", clusterMasters)) {
				ready, last = false, info
				break
			}
			shards, err := cl.ClusterSlots(ctx).Result()
			if err != nil {
				return nil, fmt.Errorf("cluster slots on %s: %w", c.nodes[i].Addr(), err)
			}
			if len(shards) != clusterMasters {
				ready, last = false, fmt.Sprintf("%d slot ranges", len(shards))
				break
			}
		}
		if ready {
			return c, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("cluster not ready: %s", strings.ReplaceAll(strings.TrimSpace(last), "\r\n", " "))
		case <-time.After(pollInterval):
		}
	}
}

// busPort returns the server's --cluster-port.
func (s *Server) busPort() string {
	for i, a := range s.args {
		if a == "--cluster-port" && i+1 < len(s.args) {
			return s.args[i+1]
		}
	}
	return ""
}

func portOf(addr string) string {
	return addr[strings.LastIndexByte(addr, ':')+1:]
}
