package redistest

import (
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// clusterMasters is the number of masters of a test cluster.
const clusterMasters = 3

// clusterSlots is the number of hash slots of a Redis Cluster.
const clusterSlots = 16384

// replicaClusterArgs are the options of the nodes of ClusterWithReplicas:
// quick failure detection, and failover that nothing can hold back.
var replicaClusterArgs = []string{
	// A node is failing after this long without answering; a replica
	// starts its election 500 to 1000 ms after its master is agreed to
	// have failed.
	"--cluster-node-timeout", "1000",
	// Never refuse to fail over because the replica's link was down too
	// long: in tests it never is, except in the kill being tested.
	"--cluster-replica-validity-factor", "0",
	// Keep one replica per master, whatever happens to the others.
	"--cluster-allow-replica-migration", "no",
	// Start a full sync at once rather than waiting for more replicas.
	"--repl-diskless-sync-delay", "0",
	// CLUSTER SLOTS lists a replica only once its replication offset is
	// not 0. On a master that nobody writes to, only its pings to the
	// replicas move the offset: every 10 s by default.
	"--repl-ping-replica-period", "1",
	// Healthy masters keep serving their slots while another master's
	// are down, as a cluster that serves a rate limiter should be set up.
	"--cluster-require-full-coverage", "no",
}

// ClusterServer is a Redis Cluster of three masters, each a redis-server
// process on loopback, with the 16384 slots split evenly, and, when made
// by ClusterWithReplicas, one replica per master.
type ClusterServer struct {
	nodes []*Server
	dir   string
	// ownDir is set when dir was created here and must be removed on Stop.
	ownDir bool
	// replicas is set for ClusterWithReplicas, whose nodes have
	// replicaClusterArgs.
	replicas bool

	mu sync.Mutex
	// slots is the slot map last seen to be agreed on: when the cluster
	// was made, or after WaitFailover.
	slots []slotRange
}

// slotRange is a range of slots and the ID of the master serving it.
type slotRange struct {
	lo, hi int
	master string
}

// Cluster starts a three-master Redis Cluster for the test, waits until
// every node reports cluster_state:ok, and stops it when the test ends.
func Cluster(t testing.TB) *ClusterServer {
	t.Helper()
	requireBinary(t)
	c, err := startCluster(t.TempDir(), false)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// ClusterWithReplicas starts a Redis Cluster of three masters and three
// replicas, one per master, for the test; waits until every node reports
// cluster_state:ok and every replica is in sync; and stops it when the
// test ends.
//
// Its nodes fail over quickly: a node is failing after a node timeout of
// 1 s, and a replica takes over whatever the age of its data, usually 2 to
// 3 s after the kill. cluster-require-full-coverage is off, so that while
// a master is lost the others keep serving their own slots (with Redis's
// default, every node answers CLUSTERDOWN until the promotion).
//
// A go-redis ClusterClient made before the failover keeps sending the dead
// master's slots to the dead address: it reloads its slot map on MOVED,
// not on dial errors, and otherwise only every ClusterStateReloadInterval
// (60 s by default). ReloadState, or a client made afterwards, finds the
// promoted replica.
func ClusterWithReplicas(t testing.TB) *ClusterServer {
	t.Helper()
	requireBinary(t)
	c, err := startCluster(t.TempDir(), true)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(c.Stop)
	return c
}

// Addrs returns the host:port of every node, in the order of Nodes.
func (c *ClusterServer) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the nodes' servers: the three masters the cluster was
// made with, then, for ClusterWithReplicas, their replicas in the same
// order, so that Nodes()[i+3] replicates Nodes()[i], then the masters
// added by AddMaster. A failover swaps the roles; MasterForKey and
// MasterForSlot tell the current ones.
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
// Prefix) and deletes the keys that start with it, on every node, when
// the test ends.
func (c *ClusterServer) Prefix(t testing.TB) string {
	t.Helper()
	p := Prefix(t)
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n.Running() {
				deleteKeys(n.Addr(), p)
			}
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
// nodes to one another, attaches the replicas if asked, and waits for the
// cluster to be ready.
func startCluster(dir string, replicas bool) (_ *ClusterServer, err error) {
	c := &ClusterServer{dir: dir, replicas: replicas}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	total, extra := clusterMasters, []string(nil)
	if replicas {
		total, extra = 2*clusterMasters, replicaClusterArgs
	}
	for i := 0; i < total; i++ {
		n, err := startServer(dir, true, extra)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cs clients
	defer cs.close()
	for _, n := range c.nodes {
		id, err := cs.get(n.Addr()).Do(ctx, "CLUSTER", "MYID").Text()
		if err != nil {
			return nil, fmt.Errorf("cluster myid on %s: %w", n.Addr(), err)
		}
		n.nodeID = id
	}

	for i, n := range c.nodes {
		cl := cs.get(n.Addr())
		// Distinct config epochs spare the nodes a round of conflict
		// resolution; this must happen before they meet.
		if err := cl.Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err(); err != nil {
			return nil, fmt.Errorf("cluster set-config-epoch on %s: %w", n.Addr(), err)
		}
		if i < clusterMasters {
			lo, hi := i*clusterSlots/clusterMasters, (i+1)*clusterSlots/clusterMasters-1
			if err := cl.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
				return nil, fmt.Errorf("cluster addslotsrange on %s: %w", n.Addr(), err)
			}
		}
	}
	first := cs.get(c.nodes[0].Addr())
	for _, n := range c.nodes[1:] {
		host, port, bus := "127.0.0.1", portOf(n.Addr()), n.busPort()
		if err := first.Do(ctx, "CLUSTER", "MEET", host, port, bus).Err(); err != nil {
			return nil, fmt.Errorf("cluster meet %s: %w", n.Addr(), err)
		}
	}
	if replicas {
		// A replica can follow its master once gossip has told it about
		// the master.
		for i, r := range c.nodes[clusterMasters:] {
			m := c.nodes[i]
			err := waitUntil(ctx, time.Minute, pollInterval, "replicate", func(ctx context.Context) error {
				return cs.get(r.Addr()).Do(ctx, "CLUSTER", "REPLICATE", m.nodeID).Err()
			})
			if err != nil {
				return nil, fmt.Errorf("cluster replicate %s on %s: %w", m.Addr(), r.Addr(), err)
			}
		}
	}

	// Wait until every node has the whole picture and every replica is in
	// sync.
	err = waitUntil(ctx, time.Minute, pollInterval, "cluster ready", func(ctx context.Context) error {
		for _, n := range c.nodes {
			cl := cs.get(n.Addr())
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster info on %s: %w", n.Addr(), err)
			}
			if !strings.Contains(info, "cluster_state:ok") ||
				!strings.Contains(info, fmt.Sprintf("cluster_slots_assigned:%d", clusterSlots)) ||
				!strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", total)) {
				return fmt.Errorf("%s: %s", n.Addr(), strings.ReplaceAll(strings.TrimSpace(info), "\r\n", " "))
			}
			shards, err := cl.ClusterSlots(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster slots on %s: %w", n.Addr(), err)
			}
			if len(shards) != clusterMasters {
				return fmt.Errorf("%s: %d slot ranges", n.Addr(), len(shards))
			}
			for _, sh := range shards {
				if want := total / clusterMasters; len(sh.Nodes) != want {
					return fmt.Errorf("%s: slots %d-%d served by %d nodes, want %d", n.Addr(), sh.Start, sh.End, len(sh.Nodes), want)
				}
			}
		}
		for i, r := range c.nodes[clusterMasters:] {
			if err := cs.isOnlineReplica(ctx, r.Addr(), c.nodes[i].Addr()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	c.slots, err = slotMap(ctx, cs.get(c.nodes[0].Addr()))
	if err != nil {
		return nil, err
	}
	return c, nil
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
