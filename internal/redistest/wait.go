package redistest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// failoverTimeout bounds WaitFailover: long enough for a second
	// election should the first one fail, at the settings used here.
	failoverTimeout = 20 * time.Second
	// syncTimeout bounds WaitReplicated and the wait for a restarted node
	// to rejoin.
	syncTimeout = 15 * time.Second
	// failoverPoll is how often the failover waits look at the servers.
	failoverPoll = 20 * time.Millisecond
)

// waitUntil calls check every interval until it returns nil, ctx is done
// or timeout has passed. check describes in its error what it is waiting
// for, and the last such error is reported when the wait gives up.
func waitUntil(ctx context.Context, timeout, interval time.Duration, what string, check func(context.Context) error) error {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("redistest: %s: gave up after %s: %w", what, time.Since(start).Round(time.Millisecond), err)
		case <-time.After(interval):
		}
	}
}

// clients holds one client per address for the length of a wait; the
// clients never retry and time out quickly, since servers may be dead or
// paused. The zero value is ready to use; close closes the clients.
type clients struct {
	servers   map[string]*redis.Client
	sentinels map[string]*redis.SentinelClient
	// patient, if set, gives the clients' reads and writes 5 s, and tries
	// a command again after a timeout: for commands that change the
	// servers (moving slots), which a busy machine may make slow, and
	// which may be sent again.
	patient bool
}

// clientOptions returns the options of the clients of a wait.
func clientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:         addr,
		MaxRetries:   -1,
		DialTimeout:  200 * time.Millisecond,
		ReadTimeout:  500 * time.Millisecond,
		WriteTimeout: 500 * time.Millisecond,
		PoolSize:     2,
	}
}

// get returns the client of the server at addr.
func (cs *clients) get(addr string) *redis.Client {
	c, ok := cs.servers[addr]
	if !ok {
		if cs.servers == nil {
			cs.servers = make(map[string]*redis.Client)
		}
		o := clientOptions(addr)
		if cs.patient {
			o.ReadTimeout, o.WriteTimeout, o.MaxRetries = 5*time.Second, 5*time.Second, 2
		}
		c = redis.NewClient(o)
		cs.servers[addr] = c
	}
	return c
}

// sentinel returns the client of the Sentinel at addr.
func (cs *clients) sentinel(addr string) *redis.SentinelClient {
	c, ok := cs.sentinels[addr]
	if !ok {
		if cs.sentinels == nil {
			cs.sentinels = make(map[string]*redis.SentinelClient)
		}
		c = redis.NewSentinelClient(clientOptions(addr))
		cs.sentinels[addr] = c
	}
	return c
}

func (cs *clients) close() {
	for _, c := range cs.servers {
		_ = c.Close()
	}
	for _, c := range cs.sentinels {
		_ = c.Close()
	}
}

// infoFields parses the output of INFO into its name:value pairs.
func infoFields(info string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}

// replication returns the fields of INFO replication of the server at
// addr.
func (cs *clients) replication(ctx context.Context, addr string) (map[string]string, error) {
	info, err := cs.get(addr).Info(ctx, "replication").Result()
	if err != nil {
		return nil, fmt.Errorf("INFO replication on %s: %w", addr, err)
	}
	return infoFields(info), nil
}

// isMaster reports, as an error, whether the server at addr says it is a
// master.
func (cs *clients) isMaster(ctx context.Context, addr string) error {
	r, err := cs.replication(ctx, addr)
	if err != nil {
		return err
	}
	if r["role"] != "master" {
		return fmt.Errorf("%s has role %q, not master", addr, r["role"])
	}
	return nil
}

// isReplicaOf reports, as an error, whether the server at addr is a
// replica with its link to master (an address, or "" for any) up.
func (cs *clients) isReplicaOf(ctx context.Context, addr, master string) error {
	r, err := cs.replication(ctx, addr)
	if err != nil {
		return err
	}
	if r["role"] != "slave" {
		return fmt.Errorf("%s has role %q, not slave", addr, r["role"])
	}
	if r["master_link_status"] != "up" {
		return fmt.Errorf("%s: master_link_status:%s", addr, r["master_link_status"])
	}
	if got := net.JoinHostPort(r["master_host"], r["master_port"]); master != "" && got != master {
		return fmt.Errorf("%s replicates %s, not %s", addr, got, master)
	}
	return nil
}

// isOnlineReplica reports, as an error, whether the server at addr is a
// replica of master (an address, or "" for any) with its link up, and its
// master counts it as online: in sync and taking the stream of writes.
func (cs *clients) isOnlineReplica(ctx context.Context, addr, master string) error {
	if err := cs.isReplicaOf(ctx, addr, master); err != nil {
		return err
	}
	if master == "" {
		r, err := cs.replication(ctx, addr)
		if err != nil {
			return err
		}
		master = net.JoinHostPort(r["master_host"], r["master_port"])
	}
	r, err := cs.replication(ctx, master)
	if err != nil {
		return err
	}
	if !slices.Contains(onlineReplicas(r), addr) {
		return fmt.Errorf("master %s does not count %s as online", master, addr)
	}
	return nil
}

// onlineReplicas returns the addresses of the online replicas listed in
// the fields of a master's INFO replication.
func onlineReplicas(r map[string]string) []string {
	var replicas []string
	for k, v := range r {
		if !strings.HasPrefix(k, "slave") || !strings.Contains(v, "state=online") {
			continue
		}
		// slave0:ip=127.0.0.1,port=6380,state=online,offset=...,lag=0
		var host, port string
		for _, kv := range strings.Split(v, ",") {
			name, val, _ := strings.Cut(kv, "=")
			switch name {
			case "ip":
				host = val
			case "port":
				port = val
			}
		}
		replicas = append(replicas, net.JoinHostPort(host, port))
	}
	return replicas
}

// WaitReplicated waits until every replica of the server has processed
// what the server had written when WaitReplicated was called, so that a
// kill that follows loses none of it. Unlike WAIT it covers writes made on
// any connection. It fails if the server is not a master with at least one
// replica online, after 15 seconds, or when ctx is done.
func (s *Server) WaitReplicated(ctx context.Context) error {
	var cs clients
	defer cs.close()
	r, err := cs.replication(ctx, s.addr)
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	if r["role"] != "master" {
		return fmt.Errorf("redistest: %s has role %q, not master", s.addr, r["role"])
	}
	offset, err := strconv.ParseInt(r["master_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("redistest: %s: master_repl_offset: %w", s.addr, err)
	}
	replicas := onlineReplicas(r)
	if len(replicas) == 0 {
		return fmt.Errorf("redistest: %s has no replica online", s.addr)
	}
	return waitUntil(ctx, syncTimeout, pollInterval, "replicas of "+s.addr+" catch up", func(ctx context.Context) error {
		for _, addr := range replicas {
			r, err := cs.replication(ctx, addr)
			if err != nil {
				return err
			}
			got, err := strconv.ParseInt(r["slave_repl_offset"], 10, 64)
			if err != nil {
				return fmt.Errorf("%s: slave_repl_offset %q", addr, r["slave_repl_offset"])
			}
			if got < offset {
				return fmt.Errorf("%s at offset %d of %d", addr, got, offset)
			}
		}
		return nil
	})
}
