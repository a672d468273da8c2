package testservice

import (
	"testing"
	"time"
)

// TestRedisHAClusterFailover kills the master of a key's slot and checks
// its replica takes over with the key it had replicated.
func TestRedisHAClusterFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("six redis-server processes and a failover: slow")
	}
	c := StartRedisHACluster(t)
	nodes, err := c.Topology()
	if err != nil {
		t.Fatal(err)
	}
	masters, replicas := 0, 0
	for _, n := range nodes {
		if n.Master {
			masters++
		} else if n.MasterID != "" {
			replicas++
		}
	}
	if masters != 3 || replicas != 3 {
		t.Fatalf("%d masters and %d replicas, want 3 and 3: %+v", masters, replicas, nodes)
	}
	slot, err := c.KeySlot("{fault}:k")
	if err != nil {
		t.Fatal(err)
	}
	old, proc, err := c.MasterOf(slot)
	if err != nil {
		t.Fatal(err)
	}
	// WAIT counts the replicas that acknowledged this connection's last
	// write, so the SET and the WAIT share a connection: on a fresh one it
	// returns at once (nothing written yet) and the failover can lose the key.
	replies, err := rawCommands(old.Addr, []string{"SET", "{fault}:k", "v"}, []string{"WAIT", "1", "2000"})
	if err != nil {
		t.Fatalf("SET and WAIT on the master: %v", err)
	}
	if replies[1] != ":1" {
		t.Fatalf("WAIT 1 = %q, want :1 (the replica has the key)", replies[1])
	}
	proc.Stop() // SIGKILL
	start := time.Now()
	nu, err := c.WaitMasterChange(slot, old.Addr, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("slot %d moved from %s to %s in %v", slot, old.Addr, nu.Addr, time.Since(start).Round(time.Millisecond))
	got, err := rawCommand(nu.Addr, "GET", "{fault}:k")
	if err != nil {
		t.Fatalf("GET on the promoted replica: %v", err)
	}
	if got != "v" {
		for _, n := range c.running() {
			d, _ := rawCommand(n.Addr(), "DBSIZE")
			r, _ := rawCommand(n.Addr(), "INFO", "replication")
			t.Logf("%s dbsize %s\n%s", n.Addr(), d, r)
		}
		t.Fatalf("the promoted replica lost the acknowledged write: GET = %q, want \"v\"", got)
	}
}
