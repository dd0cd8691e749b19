package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// MoveOptions says how MoveSlots and Rebalance move a slot's keys.
type MoveOptions struct {
	// Batch is how many keys one MIGRATE moves; 0 means 10, as
	// redis-cli --cluster reshard moves them (--cluster-pipeline).
	Batch int
	// Pause is how long to wait after each MIGRATE, the slot staying
	// half moved meanwhile; 0 means none. Under load it makes clients meet
	// the migration's ASK and TRYAGAIN replies more often.
	Pause time.Duration
	// Max bounds how many slots Rebalance moves; 0 means as many as it
	// takes. MoveSlots ignores it.
	Max int
	// OnSlot, if not nil, is called once a slot has been moved, with the
	// slot and the number of its keys that moved.
	OnSlot func(slot, keys int)
}

// Migration is what MoveSlots or Rebalance did.
type Migration struct {
	// Slots is how many slots moved, Keys how many keys, in Batches
	// MIGRATE commands.
	Slots, Keys, Batches int
	// Took is how long it all took; Longest, the longest any one slot was
	// being migrated (from IMPORTING to the last SETSLOT NODE).
	Took, Longest time.Duration
}

func (m *Migration) add(o Migration) {
	m.Slots += o.Slots
	m.Keys += o.Keys
	m.Batches += o.Batches
	m.Took += o.Took
	m.Longest = max(m.Longest, o.Longest)
}

// migrateTimeout is the timeout given to MIGRATE, in ms.
const migrateTimeout = 5000

// MoveSlots moves slots to the master to, one slot at a time, as
// redis-cli --cluster reshard does, while clients keep using them:
//
//  1. CLUSTER SETSLOT s IMPORTING <source> on to, then CLUSTER SETSLOT s
//     MIGRATING <to> on the slot's master: from then on, the source
//     answers a command whose keys it no longer has with ASK (to go to
//     to, with ASKING), and one with some of its keys moved and others
//     not with TRYAGAIN;
//  2. CLUSTER GETKEYSINSLOT and MIGRATE ... KEYS of opts.Batch keys at a
//     time, each batch moved atomically with its TTLs, until the source
//     has none left;
//  3. CLUSTER SETSLOT s NODE <to> on to, then on the source, then on
//     every other master: the slot is to's, and the others answer MOVED.
//
// Slots that to already serves are skipped. The slot map that WaitFailover
// starts from is updated. It gives up when ctx is done, leaving the slot
// it was moving half moved.
func (c *ClusterServer) MoveSlots(ctx context.Context, to *Server, slots []int, opts MoveOptions) (Migration, error) {
	if to.nodeID == "" || c.indexOf(to) < 0 {
		return Migration{}, fmt.Errorf("redistest: %s is not a node of this cluster", to.Addr())
	}
	if opts.Batch <= 0 {
		opts.Batch = 10
	}
	cs := clients{patient: true}
	defer cs.close()
	current, err := slotMap(ctx, cs.get(to.Addr()))
	if err != nil {
		return Migration{}, fmt.Errorf("redistest: %w", err)
	}
	masters := c.masters(ctx, &cs)
	start := time.Now()
	var m Migration
	for _, slot := range slots {
		from, err := c.ownerIn(current, slot)
		if err != nil {
			return m, err
		}
		if from == to {
			continue
		}
		one, err := c.moveSlot(ctx, &cs, slot, from, to, masters, opts)
		m.add(one)
		if err != nil {
			return m, fmt.Errorf("redistest: move slot %d from %s to %s: %w", slot, from.Addr(), to.Addr(), err)
		}
		if opts.OnSlot != nil {
			opts.OnSlot(slot, one.Keys)
		}
	}
	m.Took = time.Since(start)
	return m, c.refreshSlots(ctx, &cs, to)
}

// moveSlot moves slot from from to to (see MoveSlots).
func (c *ClusterServer) moveSlot(ctx context.Context, cs *clients, slot int, from, to *Server, masters []*Server, opts MoveOptions) (Migration, error) {
	start := time.Now()
	src, dst := cs.get(from.Addr()), cs.get(to.Addr())
	if err := dst.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", from.nodeID).Err(); err != nil {
		return Migration{}, fmt.Errorf("setslot importing on %s: %w", to.Addr(), err)
	}
	if err := src.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", to.nodeID).Err(); err != nil {
		return Migration{}, fmt.Errorf("setslot migrating on %s: %w", from.Addr(), err)
	}
	m := Migration{Slots: 1}
	host, port, _ := net.SplitHostPort(to.Addr())
	for {
		keys, err := src.ClusterGetKeysInSlot(ctx, slot, opts.Batch).Result()
		if err != nil {
			return m, fmt.Errorf("getkeysinslot on %s: %w", from.Addr(), err)
		}
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, migrateTimeout, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		// The wait clients' read timeouts allow for is shorter than
		// migrateTimeout, which bounds what MIGRATE waits for the target.
		mctx, cancel := context.WithTimeout(ctx, migrateTimeout*time.Millisecond)
		err = src.Do(mctx, args...).Err()
		cancel()
		if err != nil && !errors.Is(err, redis.Nil) {
			// NOKEY: the keys expired or moved meanwhile; anything else is
			// an error.
			if !strings.HasPrefix(err.Error(), "NOKEY") {
				return m, fmt.Errorf("migrate %d keys: %w", len(keys), err)
			}
		}
		m.Keys += len(keys)
		m.Batches++
		if opts.Pause > 0 {
			select {
			case <-ctx.Done():
				return m, ctx.Err()
			case <-time.After(opts.Pause):
			}
		}
	}
	// The target first, so that it bumps its config epoch and wins
	// should the source's gossip disagree; then the source, which stops
	// answering ASK; then the others, which would learn it from gossip.
	order := []*Server{to, from}
	for _, n := range masters {
		if n != to && n != from {
			order = append(order, n)
		}
	}
	for _, n := range order {
		if err := cs.get(n.Addr()).Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", to.nodeID).Err(); err != nil {
			return m, fmt.Errorf("setslot node on %s: %w", n.Addr(), err)
		}
	}
	m.Longest = time.Since(start)
	m.Took = m.Longest
	return m, nil
}

// Rebalance moves slots from the masters that serve more than their
// share (16384 over the number of masters) to those that serve fewer,
// such as a master just added with AddMaster, as redis-cli --cluster
// rebalance does, with MoveSlots (see it for how a slot moves). It moves
// at most opts.Max slots if set, taking them in turn from each master
// that has too many, the highest slots of each first.
func (c *ClusterServer) Rebalance(ctx context.Context, opts MoveOptions) (Migration, error) {
	cs := clients{patient: true}
	defer cs.close()
	masters := c.masters(ctx, &cs)
	if len(masters) == 0 {
		return Migration{}, errors.New("redistest: no master answers")
	}
	current, err := slotMap(ctx, cs.get(masters[0].Addr()))
	if err != nil {
		return Migration{}, fmt.Errorf("redistest: %w", err)
	}
	// The slots of each master, highest last.
	owned := map[*Server][]int{}
	for _, r := range current {
		n, err := c.byID(r.master)
		if err != nil {
			return Migration{}, err
		}
		for s := r.lo; s <= r.hi; s++ {
			owned[n] = append(owned[n], s)
		}
	}
	share := clusterSlots / len(masters)
	type move struct {
		to    *Server
		slots []int
	}
	var moves []move
	var donors []*Server
	for _, n := range masters {
		if len(owned[n]) > share+1 {
			donors = append(donors, n)
		}
	}
	budget := opts.Max
	for _, n := range masters {
		need := share - len(owned[n])
		for need > 0 && len(donors) > 0 && (opts.Max == 0 || budget > 0) {
			// One slot from each donor in turn, so that the load on the
			// donors moves evenly.
			progress := false
			for _, d := range donors {
				if need == 0 || (opts.Max > 0 && budget == 0) || len(owned[d]) <= share {
					continue
				}
				last := len(owned[d]) - 1
				s := owned[d][last]
				owned[d] = owned[d][:last]
				if len(moves) == 0 || moves[len(moves)-1].to != n {
					moves = append(moves, move{to: n})
				}
				moves[len(moves)-1].slots = append(moves[len(moves)-1].slots, s)
				need--
				budget--
				progress = true
			}
			if !progress {
				break
			}
		}
	}
	var m Migration
	start := time.Now()
	for _, mv := range moves {
		one, err := c.MoveSlots(ctx, mv.to, mv.slots, opts)
		m.add(one)
		if err != nil {
			return m, err
		}
	}
	m.Took = time.Since(start)
	return m, nil
}

// AddMaster starts a new node with the options of the cluster's nodes,
// has it meet the cluster, and waits until every node knows it as a
// master and it reports cluster_state:ok. It serves no slot: MoveSlots or
// Rebalance give it some. It is added to Nodes, after the nodes the
// cluster was made with, and stopped with them. It gives up after a minute
// or when ctx is done.
//
// It must not run at the same time as Addrs, Nodes, Prefix's cleanup or
// another AddMaster.
func (c *ClusterServer) AddMaster(ctx context.Context) (*Server, error) {
	var extra []string
	if c.replicas {
		extra = replicaClusterArgs
	}
	n, err := startServer(c.dir, true, extra)
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	cs := clients{patient: true}
	defer cs.close()
	cl := cs.get(n.Addr())
	if n.nodeID, err = cl.Do(ctx, "CLUSTER", "MYID").Text(); err != nil {
		n.Stop()
		return nil, fmt.Errorf("redistest: cluster myid on %s: %w", n.Addr(), err)
	}
	c.mu.Lock()
	c.nodes = append(c.nodes, n)
	c.mu.Unlock()
	// The new node meets every node itself, rather than waiting for
	// gossip to introduce them: each handshake tells it the slots of the
	// node it meets.
	for _, o := range c.nodes {
		if o == n || !o.Running() {
			continue
		}
		if err := cl.Do(ctx, "CLUSTER", "MEET", "127.0.0.1", portOf(o.Addr()), o.busPort()).Err(); err != nil {
			return nil, fmt.Errorf("redistest: cluster meet %s from %s: %w", o.Addr(), n.Addr(), err)
		}
	}
	// A master reports cluster_state:ok no sooner than 2 s after it
	// started (Redis's CLUSTER_WRITABLE_DELAY).
	err = waitUntil(ctx, time.Minute, pollInterval, "join of "+n.Addr(), func(ctx context.Context) error {
		running := 0
		for _, o := range c.nodes {
			if !o.Running() {
				continue
			}
			running++
			nodes, err := cs.get(o.Addr()).ClusterNodes(ctx).Result()
			if err != nil {
				return fmt.Errorf("cluster nodes on %s: %w", o.Addr(), err)
			}
			flags, ok := nodeFlags(nodes, n.nodeID)
			if !ok {
				return fmt.Errorf("%s does not know %s yet", o.Addr(), n.Addr())
			}
			if !strings.Contains(flags, "master") || strings.Contains(flags, "handshake") || strings.Contains(flags, "fail") {
				return fmt.Errorf("%s flags %s %s", o.Addr(), n.Addr(), flags)
			}
		}
		info, err := cl.ClusterInfo(ctx).Result()
		if err != nil {
			return fmt.Errorf("cluster info on %s: %w", n.Addr(), err)
		}
		f := infoFields(info)
		if f["cluster_state"] != "ok" || f["cluster_known_nodes"] != strconv.Itoa(len(c.nodes)) || f["cluster_slots_assigned"] != strconv.Itoa(clusterSlots) {
			return fmt.Errorf("%s: cluster_state:%s, %s nodes known, %s slots assigned",
				n.Addr(), f["cluster_state"], f["cluster_known_nodes"], f["cluster_slots_assigned"])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

// Masters returns the nodes that say they are masters, serving slots or
// not, in the order of Nodes.
func (c *ClusterServer) Masters(ctx context.Context) []*Server {
	cs := clients{patient: true}
	defer cs.close()
	return c.masters(ctx, &cs)
}

func (c *ClusterServer) masters(ctx context.Context, cs *clients) []*Server {
	var ms []*Server
	for _, n := range c.nodes {
		if n.Running() && cs.isMaster(ctx, n.Addr()) == nil {
			ms = append(ms, n)
		}
	}
	return ms
}

// ownerIn returns the master of slot in the slot map m.
func (c *ClusterServer) ownerIn(m []slotRange, slot int) (*Server, error) {
	for _, r := range m {
		if r.lo <= slot && slot <= r.hi {
			return c.byID(r.master)
		}
	}
	return nil, fmt.Errorf("redistest: slot %d is not assigned", slot)
}

// refreshSlots records the slot map as the node n sees it.
func (c *ClusterServer) refreshSlots(ctx context.Context, cs *clients, n *Server) error {
	m, err := slotMap(ctx, cs.get(n.Addr()))
	if err != nil {
		return fmt.Errorf("redistest: %w", err)
	}
	c.mu.Lock()
	c.slots = m
	c.mu.Unlock()
	return nil
}

func (c *ClusterServer) indexOf(n *Server) int {
	for i, o := range c.nodes {
		if o == n {
			return i
		}
	}
	return -1
}

// SlotsOf returns the slots that the master n serves, as n sees it.
func (c *ClusterServer) SlotsOf(ctx context.Context, n *Server) ([]int, error) {
	cs := clients{patient: true}
	defer cs.close()
	m, err := slotMap(ctx, cs.get(n.Addr()))
	if err != nil {
		return nil, fmt.Errorf("redistest: %w", err)
	}
	var slots []int
	for _, r := range m {
		if r.master == n.nodeID {
			for s := r.lo; s <= r.hi; s++ {
				slots = append(slots, s)
			}
		}
	}
	return slots, nil
}
