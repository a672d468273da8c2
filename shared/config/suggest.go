package config

import "strings"

// closest returns the key of known that key was probably meant to be:
// the same but for case, '-' or '_' (maxAttempts, max-attempts), or
// within a small edit distance (wieght). "" when none is close.
func closest(key string, known []string) string {
	norm := func(s string) string {
		return strings.ToLower(strings.NewReplacer("_", "", "-", "").Replace(s))
	}
	for _, k := range known {
		if norm(k) == norm(key) {
			return k
		}
	}
	limit := 1
	if len(key) >= 5 {
		limit = 2
	}
	if len(key) >= 10 {
		limit = 3
	}
	best, bestD := "", limit+1
	for _, k := range known {
		if d := distance(strings.ToLower(key), k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

// distance is the optimal string alignment distance: insertions,
// deletions, substitutions and swaps of neighbours each count 1.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
