//go:build race

package picker

// The race detector makes sync.Pool drop items, so allocation counts are
// meaningless under it.
func init() { raceEnabled = true }
