package testservice

import "testing"

// TestFreePortDistinct: ports handed out in one binary never repeat, even
// though the kernel may reuse a just-closed ephemeral port.
func TestFreePortDistinct(t *testing.T) {
	seen := map[int]bool{}
	for range 2000 {
		p := FreePort(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
	c := FreeClusterPort(t)
	if seen[c] || seen[c+10000] {
		t.Fatalf("cluster port %d (bus %d) was handed out before", c, c+10000)
	}
}
