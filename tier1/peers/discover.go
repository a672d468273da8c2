package peers

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"

	"github.com/hashicorp/consul/api"

	"github.com/infergate/infergate/shared/cluster"
)

// A Discoverer lists the peer addresses (host:port of their peer
// listeners) to send to. It may include this replica's own address: the
// hello exchange recognises it and the replica stops dialling itself.
type Discoverer interface {
	Peers(ctx context.Context) ([]string, error)
}

// Static is a fixed list of peer addresses.
type Static []string

// Peers returns the list.
func (s Static) Peers(context.Context) ([]string, error) { return slices.Clone(s), nil }

// DNS resolves a name to every address behind it, as a Kubernetes headless
// Service does (one A record per ready pod), and pairs each with Port.
type DNS struct {
	Name     string
	Port     int
	Resolver *net.Resolver // default net.DefaultResolver
}

// Peers resolves the name.
func (d DNS) Peers(ctx context.Context) ([]string, error) {
	r := d.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	hosts, err := r.LookupHost(ctx, d.Name)
	if err != nil {
		return nil, fmt.Errorf("peers: resolve %s: %w", d.Name, err)
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, net.JoinHostPort(h, strconv.Itoa(d.Port)))
	}
	return out, nil
}

// Consul lists the healthy instances of the Tier 1 service (as
// tier1/register registers them) of one cluster and pairs each address
// with Port, the peer port every replica listens on.
type Consul struct {
	Client  *api.Client
	Cluster string
	Port    int
	Service string // default cluster.ServiceName
}

// Peers queries Consul's health endpoint.
func (c Consul) Peers(ctx context.Context) ([]string, error) {
	svc := c.Service
	if svc == "" {
		svc = cluster.ServiceName
	}
	q := (&api.QueryOptions{Filter: fmt.Sprintf("Service.Meta.%s == %q", cluster.MetaCluster, c.Cluster)}).WithContext(ctx)
	entries, _, err := c.Client.Health().Service(svc, "", true, q)
	if err != nil {
		return nil, fmt.Errorf("peers: consul %s: %w", svc, err)
	}
	out := make([]string, 0, len(entries))
	for _, e := range entries {
		host := e.Service.Address
		if host == "" {
			host = e.Node.Address
		}
		out = append(out, net.JoinHostPort(host, strconv.Itoa(c.Port)))
	}
	return out, nil
}

// Multi is the union of several discoverers' answers. One failing makes
// the whole answer fail, so a flapping source never shrinks the peer set.
type Multi []Discoverer

// Peers asks each discoverer and returns every address once.
func (m Multi) Peers(ctx context.Context) ([]string, error) {
	var out []string
	for _, d := range m {
		as, err := d.Peers(ctx)
		if err != nil {
			return nil, err
		}
		for _, a := range as {
			if !slices.Contains(out, a) {
				out = append(out, a)
			}
		}
	}
	return out, nil
}
