// Package helm has no code: its tests check the Helm charts under this
// directory (and run scripts/deploy-check.sh when the tools are installed).
package helm
