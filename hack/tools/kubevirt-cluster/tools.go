//go:build tools

// Package tools pins the KubeVirt release the cluster backend installs on the
// test bed's real node, so `go mod tidy` keeps its dependencies;
// hack/kubevirt-images.sh builds the commands with `go build` and packs them
// into the images virt-operator deploys.
package tools

import (
	_ "kubevirt.io/kubevirt/cmd/virt-api"
	_ "kubevirt.io/kubevirt/cmd/virt-chroot"
	_ "kubevirt.io/kubevirt/cmd/virt-controller"
	_ "kubevirt.io/kubevirt/cmd/virt-freezer"
	_ "kubevirt.io/kubevirt/cmd/virt-handler"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher"
	_ "kubevirt.io/kubevirt/cmd/virt-launcher-monitor"
	_ "kubevirt.io/kubevirt/cmd/virt-operator"
	_ "kubevirt.io/kubevirt/cmd/virt-probe"
	_ "kubevirt.io/kubevirt/cmd/virt-tail"
)
