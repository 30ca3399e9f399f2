//go:build tools

// Package tools pins KubeVirt's control-plane commands so `go mod tidy` keeps
// their dependencies; hack/tools.sh builds them with `go build`.
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
)
