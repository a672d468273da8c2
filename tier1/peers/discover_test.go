package peers

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/internal/testservice"
	"github.com/infergate/infergate/tier1/register"
)

func TestStaticAndMulti(t *testing.T) {
	m := Multi{Static{"a:1", "b:1"}, Static{"b:1", "c:1"}}
	got, err := m.Peers(context.Background())
	if err != nil || !slices.Equal(got, []string{"a:1", "b:1", "c:1"}) {
		t.Fatalf("peers = %v, %v", got, err)
	}
}

func TestDNS(t *testing.T) {
	got, err := DNS{Name: "localhost", Port: 7946}.Peers(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(got, "127.0.0.1:7946") && !slices.Contains(got, "[::1]:7946") {
		t.Fatalf("localhost resolved to %v", got)
	}
	if _, err := (DNS{Name: "no-such-name.invalid", Port: 1}).Peers(context.Background()); err == nil {
		t.Fatal("resolving an invalid name succeeded")
	}
}

// TestConsul registers replicas of two clusters with a real Consul agent,
// as tier1/register does, and lists one cluster's.
func TestConsul(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Consul")
	}
	consul := testservice.StartConsul(t)
	client, err := api.NewClient(&api.Config{Address: consul.Addr()})
	if err != nil {
		t.Fatal(err)
	}
	ready := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer ready.Close()
	u, _ := url.Parse(ready.URL)
	port, _ := strconv.Atoi(u.Port())
	for _, r := range []struct{ id, addr, cluster string }{
		{"east-1", "10.0.0.1", "east"}, {"east-2", "10.0.0.2", "east"}, {"west-1", "10.0.1.1", "west"},
	} {
		if _, err := register.Register(context.Background(), client, register.Registration{
			ID: "infergate-tier1-" + r.id, Address: r.addr, Port: port, Region: "r", Cluster: r.cluster, Models: []string{"m"},
			CheckHTTP: ready.URL + "/ready", CheckInterval: time.Second, InitialStatus: "passing",
		}); err != nil {
			t.Fatal(err)
		}
	}
	d := Consul{Client: client, Cluster: "east", Port: 7946}
	var got []string
	for deadline := time.Now().Add(10 * time.Second); ; {
		if got, err = d.Peers(context.Background()); err != nil {
			t.Fatal(err)
		}
		if len(got) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"10.0.0.1:7946", "10.0.0.2:7946"}) {
		t.Fatalf("east peers = %v", got)
	}
}
