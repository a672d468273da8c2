package peers

import "github.com/prometheus/client_golang/prometheus"

// Collector exports the node's Stats as infergate_tier1_peers_* metrics.
func (n *Node) Collector() prometheus.Collector { return collector{n} }

type collector struct{ n *Node }

var (
	descDropped   = prometheus.NewDesc("infergate_tier1_peers_dropped_total", "State updates dropped because a queue was full (queue: changes, or peer for one peer's outgoing frames).", []string{"queue"}, nil)
	descFrames    = prometheus.NewDesc("infergate_tier1_peers_frames_sent_total", "Messages sent to peer replicas.", nil, nil)
	descBytes     = prometheus.NewDesc("infergate_tier1_peers_sent_bytes_total", "Bytes of messages sent to peer replicas (before framing and TLS).", nil, nil)
	descRecv      = prometheus.NewDesc("infergate_tier1_peers_frames_received_total", "Messages applied from peer replicas.", nil, nil)
	descRejected  = prometheus.NewDesc("infergate_tier1_peers_rejected_total", "Inbound peer connections or streams refused: a failed TLS handshake (no certificate from the mesh CA), a malformed or out-of-bounds message, a different prefix hash key.", nil, nil)
	descIgnored   = prometheus.NewDesc("infergate_tier1_peers_ignored_total", "Entries of peers' messages not applied: pods this replica does not route to, or beyond a stream's pod limit.", nil, nil)
	descExpired   = prometheus.NewDesc("infergate_tier1_peers_expired_total", "Peer replicas whose in-flight counts were dropped after the TTL.", nil, nil)
	descConnected = prometheus.NewDesc("infergate_tier1_peers_connected", "Outbound streams to peer replicas up now.", nil, nil)
	descOrigins   = prometheus.NewDesc("infergate_tier1_peers_live", "Peer replicas whose state counts now.", nil, nil)
)

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDropped, descFrames, descBytes, descRecv, descRejected, descIgnored, descExpired, descConnected, descOrigins} {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.n.Stats()
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.Dropped), "changes")
	ch <- prometheus.MustNewConstMetric(descDropped, prometheus.CounterValue, float64(s.PeerDropped), "peer")
	ch <- prometheus.MustNewConstMetric(descFrames, prometheus.CounterValue, float64(s.FramesSent))
	ch <- prometheus.MustNewConstMetric(descBytes, prometheus.CounterValue, float64(s.BytesSent))
	ch <- prometheus.MustNewConstMetric(descRecv, prometheus.CounterValue, float64(s.FramesRecv))
	ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(s.Rejected))
	ch <- prometheus.MustNewConstMetric(descIgnored, prometheus.CounterValue, float64(s.Ignored))
	ch <- prometheus.MustNewConstMetric(descExpired, prometheus.CounterValue, float64(s.Expired))
	ch <- prometheus.MustNewConstMetric(descConnected, prometheus.GaugeValue, float64(s.Connected))
	ch <- prometheus.MustNewConstMetric(descOrigins, prometheus.GaugeValue, float64(s.Origins))
}
