package config

import "cmp"

// Default sets *v to d when *v is at most its type's zero value: a zero
// or negative number or duration, or an empty string. It is the
// "unset or nonsensical means the default" rule of option structs, where
// a negative interval or size would otherwise stall or panic; a field
// whose zero or negative value means something of its own must not use
// it.
func Default[T cmp.Ordered](v *T, d T) {
	var zero T
	if *v <= zero {
		*v = d
	}
}
