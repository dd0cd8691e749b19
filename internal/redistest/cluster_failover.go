package redistest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MasterForKey returns the node that serves key as master, as the running
// nodes see it (see MasterForSlot). Hash tags count as in Redis: only the
// part between the first '{' and the next '}' is hashed, if not empty.
func (c *ClusterServer) MasterForKey(ctx context.Context, key string) (*Server, error) {
	return c.MasterForSlot(ctx, KeySlot(key))
}

// MasterForSlot returns the node that serves slot as master, as the first
// running node that answers sees it. Between the kill of a master and the
// end of its failover, that is the dead master.
func (c *ClusterServer) MasterForSlot(ctx context.Context, slot int) (*Server, error) {
	if slot < 0 || slot >= clusterSlots {
		return nil, fmt.Errorf("redistest: slot %d out of range", slot)
	}
	var cs clients
	defer cs.close()
	err := errors.New("no node runs")
	for _, n := range c.nodes {
		if !n.Running() {
			continue
		}
		var m []slotRange
		m, err = slotMap(ctx, cs.get(n.Addr()))
		if err != nil {
			continue
		}
		for _, r := range m {
			if r.lo <= slot && slot <= r.hi {
				return c.byID(r.master)
			}
		}
		return nil, fmt.Errorf("redistest: %s: slot %d is not assigned", n.Addr(), slot)
	}
	return nil, fmt.Errorf("redistest: master for slot %d: %w", slot, err)
}

// WaitFailover waits until the cluster has recovered from the loss of the
// master dead, killed (Kill, Stop) or hung (Pause): a replica of dead has
// been promoted and says it is a master, and every running node other
// than dead reports cluster_state:ok and the same slot map, in which the
// slots dead served belong to the promoted node. Every running node other
// than dead must answer.
//
// It returns the promoted node and the time from the kill of dead to the
// moment all that was seen to hold (from the call, if dead was not killed).
// It gives up after 20 seconds or when ctx is done. It needs a cluster made
// by ClusterWithReplicas.
func (c *ClusterServer) WaitFailover(ctx context.Context, dead *Server) (*Server, time.Duration, error) {
	start := time.Now()
	if _, err := c.byID(dead.nodeID); err != nil || dead.nodeID == "" {
		return nil, 0, fmt.Errorf("redistest: %s is not a node of this cluster", dead.Addr())
	}
	c.mu.Lock()
	var lost []slotRange
	for _, r := range c.slots {
		if r.master == dead.nodeID {
			lost = append(lost, r)
		}
	}
	c.mu.Unlock()
	if len(lost) == 0 {
		return nil, 0, fmt.Errorf("redistest: %s served no slots when the cluster last agreed", dead.Addr())
	}

	var cs clients
	defer cs.close()
	var (
		promoted *Server
		agreed   []slotRange
	)
	err := waitUntil(ctx, failoverTimeout, failoverPoll, "failover of "+dead.Addr(), func(ctx context.Context) error {
		var (
			first []slotRange
			from  string
		)
		for _, n := range c.nodes {
			if n == dead || !n.Running() {
				continue
			}
			cl := cs.get(n.Addr())
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster info on %s: %w", n.Addr(), err)
			}
			if state := infoFields(info)["cluster_state"]; state != "ok" {
				return fmt.Errorf("%s: cluster_state:%s", n.Addr(), state)
			}
			m, err := slotMap(ctx, cl)
			if err != nil {
				return err
			}
			if first == nil {
				first, from = m, n.Addr()
			} else if !slices.Equal(m, first) {
				return fmt.Errorf("%s and %s disagree on the slot map", from, n.Addr())
			}
		}
		if first == nil {
			return errors.New("no other node runs")
		}
		owner := ""
		for _, l := range lost {
			for _, r := range first {
				if r.hi < l.lo || l.hi < r.lo {
					continue
				}
				if r.master == dead.nodeID {
					return fmt.Errorf("%s still serves slots %d-%d", dead.Addr(), r.lo, r.hi)
				}
				if owner != "" && owner != r.master {
					return fmt.Errorf("slots of %s split between masters", dead.Addr())
				}
				owner = r.master
			}
		}
		p, err := c.byID(owner)
		if err != nil {
			return err
		}
		if err := cs.isMaster(ctx, p.Addr()); err != nil {
			return err
		}
		promoted, agreed = p, first
		return nil
	})
	took := dead.sinceKilled(start)
	if err != nil {
		return nil, took, err
	}
	c.mu.Lock()
	c.slots = agreed
	c.mu.Unlock()
	return promoted, took, nil
}

// RestartNode restarts n, a node of the cluster that was killed, on its
// port and with its node ID, and waits until it has rejoined: it is a
// replica whose link to its master is up, and every running node reports
// cluster_state:ok and no longer flags it as failing. A master killed and
// replaced by WaitFailover comes back as a replica of the promoted node;
// one restarted before its failover would come back as an empty master,
// which this reports as an error. It gives up after 15 seconds or when ctx
// is done.
func (c *ClusterServer) RestartNode(ctx context.Context, n *Server) error {
	if _, err := c.byID(n.nodeID); err != nil || n.nodeID == "" {
		return fmt.Errorf("redistest: %s is not a node of this cluster", n.Addr())
	}
	if err := n.Restart(); err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	var cs clients
	defer cs.close()
	return waitUntil(ctx, syncTimeout, failoverPoll, "rejoin of "+n.Addr(), func(ctx context.Context) error {
		if err := cs.isOnlineReplica(ctx, n.Addr(), ""); err != nil {
			return err
		}
		for _, o := range c.nodes {
			if !o.Running() {
				continue
			}
			cl := cs.get(o.Addr())
			info, err := cl.ClusterInfo(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster info on %s: %w", o.Addr(), err)
			}
			if state := infoFields(info)["cluster_state"]; state != "ok" {
				return fmt.Errorf("%s: cluster_state:%s", o.Addr(), state)
			}
			nodes, err := cl.ClusterNodes(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster nodes on %s: %w", o.Addr(), err)
			}
			flags, ok := nodeFlags(nodes, n.nodeID)
			if !ok {
				return fmt.Errorf("%s does not know %s", o.Addr(), n.Addr())
			}
			if strings.Contains(flags, "fail") {
				return fmt.Errorf("%s flags %s %s", o.Addr(), n.Addr(), flags)
			}
		}
		return nil
	})
}

// byID returns the node with the given cluster node ID.
func (c *ClusterServer) byID(id string) (*Server, error) {
	for _, n := range c.nodes {
		if n.nodeID == id {
			return n, nil
		}
	}
	return nil, fmt.Errorf("redistest: no node has ID %q", id)
}

// slotMap returns the slot ranges and their masters as the node cl talks
// to sees them, sorted, with adjacent ranges of one master merged.
func slotMap(ctx context.Context, cl *redis.Client) ([]slotRange, error) {
	slots, err := cl.ClusterSlots(ctx).Result()
	if err != nil {
		return nil, fmt.Errorf("cluster slots on %s: %w", cl.Options().Addr, err)
	}
	var m []slotRange
	for _, s := range slots {
		if len(s.Nodes) == 0 {
			continue
		}
		m = append(m, slotRange{lo: s.Start, hi: s.End, master: s.Nodes[0].ID})
	}
	slices.SortFunc(m, func(a, b slotRange) int { return a.lo - b.lo })
	merged := m[:0]
	for _, r := range m {
		if k := len(merged) - 1; k >= 0 && merged[k].master == r.master && merged[k].hi+1 == r.lo {
			merged[k].hi = r.hi
			continue
		}
		merged = append(merged, r)
	}
	return merged, nil
}

// nodeFlags returns the flags of the node with the given ID in the output
// of CLUSTER NODES.
func nodeFlags(nodes, id string) (string, bool) {
	for _, line := range strings.Split(nodes, "\n") {
		// <id> <ip:port@cport> <flags> <master> ...
		f := strings.Fields(line)
		if len(f) > 2 && f[0] == id {
			return f[2], true
		}
	}
	return "", false
}

// KeySlot returns the Redis Cluster hash slot of key: CRC16 of the key, or
// of its hash tag, modulo 16384, as CLUSTER KEYSLOT computes it.
func KeySlot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	return int(crc16(key)) % clusterSlots
}

// crc16 is CRC-16/XMODEM (polynomial 0x1021, initial value 0), the
// checksum of Redis Cluster's key hashing.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
