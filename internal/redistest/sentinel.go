package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// sentinelCount is the number of Sentinels of a Sentinel setup.
	sentinelCount = 3
	// sentinelMasterName is the name the Sentinels know the master by.
	sentinelMasterName = "sluicetest"
)

// sentinelConf is the configuration file of a Sentinel, filled in with
// its port, its directory, the master's name, host and port. A master is
// down after 1.5 s without a valid reply; 2 of the 3 Sentinels must agree,
// and a majority elect the one that fails over.
//
// down-after-milliseconds must stay well above 1 s: a Sentinel connects to
// a new master up to 1 s after a failover (it retries a link at most once a
// second), and a master it has not heard from for down-after-milliseconds
// is down. At 1000 or less, a healthy master just promoted is now and then
// taken for down, and the spurious failover that follows either flips the
// master again or, failing for want of a good replica, bars its voters from
// starting a real one for twice failover-timeout.
const sentinelConf = `port %[1]d
bind 127.0.0.1
dir %[2]q
logfile %[3]q
sentinel monitor %[4]s 127.0.0.1 %[5]s 2
sentinel down-after-milliseconds %[4]s 1500
sentinel failover-timeout %[4]s 2000
sentinel parallel-syncs %[4]s 1
`

// SentinelServer is a master and its replica, each a redis-server process
// on loopback, watched by three Sentinels, which also run on loopback.
type SentinelServer struct {
	nodes     []*Server
	sentinels []*Server
}

// Sentinel starts a master, a replica of it and three Sentinels
// monitoring them for the test; waits until the replica is in sync and
// every Sentinel knows the replica and the other Sentinels; and stops them
// all when the test ends.
//
// The Sentinels fail over quickly: the master is down after 1.5 s without
// answering, and the failover usually ends 3 to 4 s after the kill. Now and
// then two Sentinels split the vote and the next election waits twice
// failover-timeout (2 s): that failover ends 7 to 8 s after the kill.
func Sentinel(t testing.TB) *SentinelServer {
	t.Helper()
	requireBinary(t)
	s, err := startSentinel(t.TempDir())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// MasterName returns the name the Sentinels know the master by.
func (s *SentinelServer) MasterName() string { return sentinelMasterName }

// SentinelAddrs returns the host:port of every Sentinel.
func (s *SentinelServer) SentinelAddrs() []string {
	addrs := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Sentinels returns the Sentinels' servers.
func (s *SentinelServer) Sentinels() []*Server { return s.sentinels }

// Nodes returns the data servers: the master the setup was made with,
// then its replica. A failover swaps the roles; Master tells the current
// master.
func (s *SentinelServer) Nodes() []*Server { return s.nodes }

// Client returns a client that finds the master through the Sentinels
// (redis.NewFailoverClient), closed when the test ends. opts may be nil;
// its MasterName and SentinelAddrs are set to the setup's.
func (s *SentinelServer) Client(t testing.TB, opts *redis.FailoverOptions) *redis.Client {
	t.Helper()
	o := redis.FailoverOptions{}
	if opts != nil {
		o = *opts
	}
	o.MasterName = sentinelMasterName
	o.SentinelAddrs = s.SentinelAddrs()
	c := redis.NewFailoverClient(&o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Prefix returns a key prefix unique to the test (see the package function
// Prefix) and deletes the keys that start with it when the test ends.
func (s *SentinelServer) Prefix(t testing.TB) string {
	t.Helper()
	p := Prefix(t)
	t.Cleanup(func() {
		for _, n := range s.nodes {
			if n.Running() {
				deleteKeys(n.Addr(), p) // fails harmlessly on replicas
			}
		}
	})
	return p
}

// Master returns the data server that the first Sentinel to answer names
// as the master. Between the kill of the master and the end of its
// failover, that is the dead master.
func (s *SentinelServer) Master(ctx context.Context) (*Server, error) {
	err := errors.New("no Sentinel runs")
	for _, sn := range s.sentinels {
		if !sn.Running() {
			continue
		}
		var addr string
		addr, err = masterAddr(ctx, sn.Addr())
		if err == nil {
			return s.node(addr)
		}
	}
	return nil, fmt.Errorf("redistest: master of %s: %w", sentinelMasterName, err)
}

// WaitFailover waits until the Sentinels have replaced the master dead,
// killed (Kill, Stop) or hung (Pause), and are settled: every running
// Sentinel names the same other data server as the master, has no failover
// in progress, is connected to that server and has had a reply to its
// PING and INFO; and that server says it is a master. Every running
// Sentinel must answer.
//
// It returns the promoted server and the time from the kill of dead to the
// moment all that was seen to hold (from the call, if dead was not
// killed). It gives up after 20 seconds or when ctx is done.
func (s *SentinelServer) WaitFailover(ctx context.Context, dead *Server) (*Server, time.Duration, error) {
	start := time.Now()
	if _, err := s.node(dead.Addr()); err != nil {
		return nil, 0, err
	}
	var cs clients
	defer cs.close()
	var promoted *Server
	err := waitUntil(ctx, failoverTimeout, failoverPoll, "failover of "+dead.Addr(), func(ctx context.Context) error {
		addr := ""
		for _, sn := range s.sentinels {
			if !sn.Running() {
				continue
			}
			m, err := sentinelMaster(ctx, &cs, sn.Addr())
			if err != nil {
				return err
			}
			got := net.JoinHostPort(m["ip"], m["port"])
			switch {
			case got == dead.Addr():
				return fmt.Errorf("sentinel %s still names %s (flags %s)", sn.Addr(), got, m["flags"])
			case addr != "" && got != addr:
				return fmt.Errorf("sentinels name %s and %s", addr, got)
			}
			if err := healthy(m, "master"); err != nil {
				return fmt.Errorf("sentinel %s, master %s: %w", sn.Addr(), got, err)
			}
			addr = got
		}
		if addr == "" {
			return errors.New("no Sentinel runs")
		}
		p, err := s.node(addr)
		if err != nil {
			return err
		}
		if err := cs.isMaster(ctx, addr); err != nil {
			return err
		}
		promoted = p
		return nil
	})
	took := dead.sinceKilled(start)
	if err != nil {
		return nil, took, err
	}
	return promoted, took, nil
}

// RestartNode restarts n, a data server that was killed, on its port, as a
// replica of the current master, and waits until it has rejoined: its link
// to the master is up, and every running Sentinel is connected to it and
// has had a reply to its PING, so that it can be promoted in the next
// failover. (A Sentinel would turn a restarted old master into a replica
// itself, but only 8 to 20 s after it came back.) It gives up after 15
// seconds or when ctx is done.
func (s *SentinelServer) RestartNode(ctx context.Context, n *Server) error {
	if _, err := s.node(n.Addr()); err != nil {
		return err
	}
	m, err := s.Master(ctx)
	if err != nil {
		return err
	}
	if m == n {
		return fmt.Errorf("redistest: %s is still the master", n.Addr())
	}
	if err := n.restart([]string{"--replicaof", "127.0.0.1", portOf(m.Addr())}); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	var cs clients
	defer cs.close()
	return waitUntil(ctx, syncTimeout, failoverPoll, "rejoin of "+n.Addr(), func(ctx context.Context) error {
		if err := cs.isOnlineReplica(ctx, n.Addr(), m.Addr()); err != nil {
			return err
		}
		for _, sn := range s.sentinels {
			if !sn.Running() {
				continue
			}
			replicas, err := cs.sentinel(sn.Addr()).Replicas(ctx, sentinelMasterName).Result()
			if err != nil {
				return fmt.Errorf("SENTINEL REPLICAS on %s: %w", sn.Addr(), err)
			}
			i := slices.IndexFunc(replicas, func(r map[string]string) bool {
				return net.JoinHostPort(r["ip"], r["port"]) == n.Addr()
			})
			if i < 0 {
				return fmt.Errorf("sentinel %s does not list %s", sn.Addr(), n.Addr())
			}
			if err := healthy(replicas[i], "slave"); err != nil {
				return fmt.Errorf("sentinel %s, replica %s: %w", sn.Addr(), n.Addr(), err)
			}
		}
		return nil
	})
}

// healthy reports, as an error, whether a Sentinel's record of an instance
// (from SENTINEL MASTER or SENTINEL REPLICAS) says it is connected, up,
// answers PING and has answered INFO with the given role, and has no
// failover in progress.
func healthy(rec map[string]string, role string) error {
	if rec["flags"] != role {
		return fmt.Errorf("flags %s", rec["flags"])
	}
	if rec["role-reported"] != role {
		return fmt.Errorf("role-reported %s", rec["role-reported"])
	}
	// A Sentinel PINGs once a second and takes an instance for down when
	// down-after-milliseconds pass without a valid reply.
	ms, err := strconv.Atoi(rec["last-ok-ping-reply"])
	if limit, _ := strconv.Atoi(rec["down-after-milliseconds"]); err != nil || ms >= limit*2/3 {
		return fmt.Errorf("last-ok-ping-reply %s ms ago", rec["last-ok-ping-reply"])
	}
	return nil
}

// Stop stops the Sentinels, then the data servers. It is safe to call
// more than once.
func (s *SentinelServer) Stop() {
	for _, n := range s.sentinels {
		n.Stop()
	}
	for _, n := range s.nodes {
		n.Stop()
	}
}

// node returns the data server at addr.
func (s *SentinelServer) node(addr string) (*Server, error) {
	for _, n := range s.nodes {
		if n.Addr() == addr {
			return n, nil
		}
	}
	return nil, fmt.Errorf("redistest: %s is not a data server of this setup", addr)
}

// startSentinel starts the master, its replica and the Sentinels in dir,
// and waits until they all know one another.
func startSentinel(dir string) (_ *SentinelServer, err error) {
	s := &SentinelServer{}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	replArgs := []string{"--repl-diskless-sync-delay", "0"}
	m, err := startServer(dir, false, replArgs)
	if err != nil {
		return nil, err
	}
	s.nodes = append(s.nodes, m)
	r, err := startServer(dir, false, append(replArgs, "--replicaof", "127.0.0.1", portOf(m.Addr())))
	if err != nil {
		return nil, err
	}
	s.nodes = append(s.nodes, r)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var cs clients
	defer cs.close()
	// Sentinels learn of replicas from the master's INFO, which they ask
	// for every 10 s once they have seen it: the replica must be online
	// before they start.
	err = waitUntil(ctx, time.Minute, pollInterval, "replica in sync", func(ctx context.Context) error {
		return cs.isOnlineReplica(ctx, r.Addr(), m.Addr())
	})
	if err != nil {
		return nil, err
	}

	for i := 0; i < sentinelCount; i++ {
		sn, err := startWith(dir, func(port int) ([]string, error) {
			p := strconv.Itoa(port)
			conf := filepath.Join(dir, "sentinel-"+p+".conf")
			text := fmt.Sprintf(sentinelConf, port, dir, filepath.Join(dir, "redis-"+p+".log"),
				sentinelMasterName, portOf(m.Addr()))
			// The Sentinel rewrites this file: it must be writable.
			if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
				return nil, err
			}
			return []string{conf, "--sentinel"}, nil
		})
		if err != nil {
			return nil, err
		}
		s.sentinels = append(s.sentinels, sn)
	}

	// Sentinels find one another through hello messages on the master,
	// every 2 s.
	err = waitUntil(ctx, time.Minute, pollInterval, "Sentinels ready", func(ctx context.Context) error {
		for _, sn := range s.sentinels {
			info, err := sentinelMaster(ctx, &cs, sn.Addr())
			if err != nil {
				return err
			}
			if info["flags"] != "master" ||
				info["num-slaves"] != "1" ||
				info["num-other-sentinels"] != strconv.Itoa(sentinelCount-1) ||
				net.JoinHostPort(info["ip"], info["port"]) != m.Addr() {
				return fmt.Errorf("sentinel %s: %v", sn.Addr(), info)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return s, nil
}

// sentinelMaster returns SENTINEL MASTER for the setup's master, asked of
// the Sentinel at addr.
func sentinelMaster(ctx context.Context, cs *clients, addr string) (map[string]string, error) {
	m, err := cs.sentinel(addr).Master(ctx, sentinelMasterName).Result()
	if err != nil {
		return nil, fmt.Errorf("SENTINEL MASTER on %s: %w", addr, err)
	}
	return m, nil
}

// masterAddr returns SENTINEL GET-MASTER-ADDR-BY-NAME for the setup's
// master, asked of the Sentinel at addr.
func masterAddr(ctx context.Context, addr string) (string, error) {
	sc := redis.NewSentinelClient(clientOptions(addr))
	defer sc.Close()
	hp, err := sc.GetMasterAddrByName(ctx, sentinelMasterName).Result()
	if err != nil {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME on %s: %w", addr, err)
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME on %s: %q", addr, hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}
