//go:build tools

// Package tools pins the Kubernetes commands the test bed runs so `go mod
// tidy` keeps their dependencies; hack/tools.sh builds them with `go build`:
// the API server envtest starts, and the real node's kubelet with the
// scheduler and controller manager that make it a working cluster.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
