package gateway

import "github.com/infergate/infergate/tier1/picker"

// Tracker is the router's own record of its dispatches, which tier1/peers
// shares with the cluster's other replicas.
func (g *Gateway) Tracker() *picker.Tracker { return g.tracker }
