//go:build tools

// Package kube pins kube-apiserver for scripts/tools.sh.
package kube

import _ "k8s.io/kubernetes/cmd/kube-apiserver"
