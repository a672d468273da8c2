package testservice

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RedisHACluster is a Redis Cluster of three masters, each with one
// replica, built the way operators build one (`redis-cli --cluster create
// --cluster-replicas 1`), so a master can be killed and its replica
// promoted. Nodes are in creation order; which of them are masters is
// decided by redis-cli and changes with failovers, so ask MasterOf.
type RedisHACluster struct {
	t     testing.TB
	Nodes []*Redis
}

// NodeTimeout is the cluster-node-timeout of StartRedisHACluster: a master
// unreachable this long is marked failed and its replica takes over,
// usually within two or three times this.
const NodeTimeout = time.Second

// StartRedisHACluster starts six cluster-enabled redis-server processes on
// free loopback ports (persistence off, cluster-node-timeout NodeTimeout,
// replicas allowed to take over however stale their data), joins them with
// `redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes`, and
// waits until every node reports cluster_state:ok and every replica's link
// to its master is up. It needs redis-server and redis-cli (skipped when
// missing, failed under CI; see Binary).
func StartRedisHACluster(t testing.TB) *RedisHACluster {
	t.Helper()
	srv := Binary(t, "INFERGATE_REDIS_SERVER", "redis-server")
	cli := Binary(t, "INFERGATE_REDIS_CLI", "redis-cli")
	c := &RedisHACluster{t: t}
	for range 6 {
		dir := t.TempDir()
		r := &Redis{t: t, bin: srv, dir: dir, port: FreeClusterPort(t), args: []string{
			"--cluster-enabled", "yes",
			"--cluster-config-file", filepath.Join(dir, "nodes.conf"),
			"--cluster-node-timeout", strconv.Itoa(int(NodeTimeout / time.Millisecond)),
			"--cluster-replica-validity-factor", "0",
		}}
		r.Start()
		t.Cleanup(r.Stop)
		c.Nodes = append(c.Nodes, r)
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("testservice: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := c.waitHealthy(30 * time.Second); err != nil {
		t.Fatalf("testservice: redis cluster: %v\nredis-cli said:\n%s", err, out)
	}
	return c
}

// Addrs lists every node's host:port (masters and replicas), what
// redis.UniversalOptions.Addrs takes: any reachable node is enough to find
// the rest.
func (c *RedisHACluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr()
	}
	return out
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID, Addr string // Addr is host:port, without the bus port
	Master   bool
	Failed   bool   // flagged fail or fail?
	MasterID string // a replica's master, "" for a master
	Slots    [][2]int
}

// Owns reports whether the node serves slot.
func (n ClusterNode) Owns(slot int) bool {
	for _, r := range n.Slots {
		if slot >= r[0] && slot <= r[1] {
			return true
		}
	}
	return false
}

// Topology is CLUSTER NODES as seen by the first node that answers.
func (c *RedisHACluster) Topology() ([]ClusterNode, error) {
	var last error
	for _, n := range c.running() {
		out, err := rawCommand(n.Addr(), "CLUSTER", "NODES")
		if err != nil {
			last = err
			continue
		}
		return parseClusterNodes(out)
	}
	return nil, fmt.Errorf("no node answered CLUSTER NODES: %w", last)
}

func parseClusterNodes(s string) ([]ClusterNode, error) {
	var out []ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q", line)
		}
		n := ClusterNode{ID: f[0], Addr: f[1]}
		if i := strings.IndexByte(n.Addr, '@'); i >= 0 {
			n.Addr = n.Addr[:i]
		}
		for _, flag := range strings.Split(f[2], ",") {
			switch flag {
			case "master":
				n.Master = true
			case "fail", "fail?":
				n.Failed = true
			}
		}
		if f[3] != "-" {
			n.MasterID = f[3]
		}
		for _, sl := range f[8:] {
			if strings.HasPrefix(sl, "[") {
				continue // a slot being migrated
			}
			lo, hi, ok := strings.Cut(sl, "-")
			if !ok {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil {
				return nil, fmt.Errorf("CLUSTER NODES slot %q", sl)
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		out = append(out, n)
	}
	return out, nil
}

// KeySlot is the hash slot of key (CLUSTER KEYSLOT).
func (c *RedisHACluster) KeySlot(key string) (int, error) {
	var last error
	for _, n := range c.running() {
		out, err := rawCommand(n.Addr(), "CLUSTER", "KEYSLOT", key)
		if err != nil {
			last = err
			continue
		}
		// An integer reply comes back as ":<n>".
		return strconv.Atoi(strings.TrimPrefix(out, ":"))
	}
	return 0, fmt.Errorf("no node answered CLUSTER KEYSLOT: %w", last)
}

// MasterOf is the healthy master serving slot, and its process.
func (c *RedisHACluster) MasterOf(slot int) (ClusterNode, *Redis, error) {
	nodes, err := c.Topology()
	if err != nil {
		return ClusterNode{}, nil, err
	}
	for _, n := range nodes {
		if n.Master && !n.Failed && n.Owns(slot) {
			for _, r := range c.Nodes {
				if r.Addr() == n.Addr {
					return n, r, nil
				}
			}
			return n, nil, fmt.Errorf("master %s of slot %d is not one of ours", n.Addr, slot)
		}
	}
	return ClusterNode{}, nil, fmt.Errorf("no healthy master serves slot %d", slot)
}

// WaitMasterChange waits until a healthy master other than old serves slot
// and every running node reports cluster_state:ok: the replica took over.
func (c *RedisHACluster) WaitMasterChange(slot int, old string, timeout time.Duration) (ClusterNode, error) {
	deadline := time.Now().Add(timeout)
	for {
		n, _, err := c.MasterOf(slot)
		if err == nil && n.Addr != old {
			if err = c.allOK(); err == nil {
				return n, nil
			}
		} else if err == nil {
			err = fmt.Errorf("slot %d still on %s", slot, old)
		}
		if time.Now().After(deadline) {
			return ClusterNode{}, fmt.Errorf("after %v: %w", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// running lists the nodes whose process runs.
func (c *RedisHACluster) running() []*Redis {
	var out []*Redis
	for _, n := range c.Nodes {
		n.mu.Lock()
		up := n.cmd != nil
		n.mu.Unlock()
		if up {
			out = append(out, n)
		}
	}
	return out
}

func (c *RedisHACluster) allOK() error {
	for _, n := range c.running() {
		info, err := rawCommand(n.Addr(), "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") {
			return fmt.Errorf("%s: cluster state not ok", n.Addr())
		}
	}
	return nil
}

// waitHealthy waits for cluster_state:ok on all six nodes, three masters
// covering every slot, and each replica's replication link up.
func (c *RedisHACluster) waitHealthy(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := c.healthy()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *RedisHACluster) healthy() error {
	for _, n := range c.Nodes {
		info, err := rawCommand(n.Addr(), "CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
		if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:6") ||
			!strings.Contains(info, "cluster_slots_assigned:16384") {
			return fmt.Errorf("%s: not ready:\n%s", n.Addr(), info)
		}
	}
	nodes, err := c.Topology()
	if err != nil {
		return err
	}
	masters := 0
	for _, n := range nodes {
		if n.Master {
			masters++
			continue
		}
		repl, err := rawCommand(n.Addr, "INFO", "replication")
		if err != nil {
			return err
		}
		if !strings.Contains(repl, "master_link_status:up") {
			return fmt.Errorf("replica %s: link to its master not up yet", n.Addr)
		}
	}
	if masters != 3 {
		return fmt.Errorf("%d masters, want 3", masters)
	}
	return nil
}
