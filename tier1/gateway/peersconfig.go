package gateway

// HasPod reports whether the gateway routes to pod now (configured or
// discovered): tier1/peers ignores what peers say about other pods, so a
// peer cannot make this replica keep state for names it never routes to.
func (g *Gateway) HasPod(name string) bool {
	st := g.state.Load()
	return st != nil && st.pods[name] != nil
}
