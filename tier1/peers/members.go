package peers

import (
	"cmp"
	"slices"
	"time"
)

// Members is the mesh as this replica sees it now, for the status page:
// the peers it streams to and the replicas streaming to it.
type Members struct {
	Enabled bool   `json:"enabled"` // always true: a node exists only when peers are configured
	ID      string `json:"id"`      // this replica's
	// Peers are the discovered peer addresses this replica streams to.
	Peers []PeerMember `json:"peers"`
	// Replicas are the inbound streams whose state this replica holds:
	// the other replicas, as they named themselves.
	Replicas []ReplicaMember `json:"replicas"`
	Stats    MemberStats     `json:"stats"`
}

// PeerMember is one discovered peer address.
type PeerMember struct {
	Address   string `json:"address"`
	Connected bool   `json:"connected"` // the outbound stream is up
}

// ReplicaMember is one inbound stream.
type ReplicaMember struct {
	ID          string  `json:"id"`     // the replica ID its hello named
	Remote      string  `json:"remote"` // address and certificate subject
	LastHeardMS float64 `json:"last_heard_ms"`
	Live        bool    `json:"live"`     // the stream is open
	Counting    bool    `json:"counting"` // its state is the one counted for that replica
	Pods        int     `json:"pods"`     // pods it holds state for
}

// MemberStats are the node's counters (Stats) as JSON.
type MemberStats struct {
	Connected   int    `json:"connected"`
	Origins     int    `json:"origins"`
	Dropped     uint64 `json:"dropped"`
	PeerDropped uint64 `json:"peer_dropped"`
	FramesSent  uint64 `json:"frames_sent"`
	FramesRecv  uint64 `json:"frames_recv"`
	Rejected    uint64 `json:"rejected"`
	Ignored     uint64 `json:"ignored"`
	Expired     uint64 `json:"expired"`
}

// Members returns a snapshot of the mesh; it only reads.
func (n *Node) Members() Members {
	now := time.Now()
	m := Members{Enabled: true, ID: n.opts.ID, Peers: []PeerMember{}, Replicas: []ReplicaMember{}}
	type inbound struct {
		o *origin
		r ReplicaMember
	}
	var in []inbound
	n.mu.Lock()
	for addr, p := range n.peers {
		m.Peers = append(m.Peers, PeerMember{Address: addr, Connected: p.up.Load()})
	}
	for o := range n.streams {
		in = append(in, inbound{o: o, r: ReplicaMember{ID: o.id, Remote: o.remote,
			LastHeardMS: float64(now.Sub(o.seen).Microseconds()) / 1000, Live: o.live, Counting: n.active[o.id] == o}})
	}
	n.mu.Unlock()
	// o.mu after n.mu is released: apply takes o.mu, then n.mu.
	for _, x := range in {
		x.o.mu.Lock()
		x.r.Pods = len(x.o.pods)
		x.o.mu.Unlock()
		m.Replicas = append(m.Replicas, x.r)
	}
	slices.SortFunc(m.Peers, func(a, b PeerMember) int { return cmp.Compare(a.Address, b.Address) })
	slices.SortFunc(m.Replicas, func(a, b ReplicaMember) int { return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Remote, b.Remote)) })
	s := n.Stats()
	m.Stats = MemberStats{Connected: s.Connected, Origins: s.Origins, Dropped: s.Dropped, PeerDropped: s.PeerDropped,
		FramesSent: s.FramesSent, FramesRecv: s.FramesRecv, Rejected: s.Rejected, Ignored: s.Ignored, Expired: s.Expired}
	return m
}
