// Package kubevirt is guestbackup's end-to-end suite for KubeVirt
// VirtualMachines. It runs on the local test bed: a real kube-apiserver with
// KubeVirt's CRDs as virt-operator installs them, KubeVirt's own virt-api and
// virt-controller, guestbackup's webhook and controllers in-process
// (internal/local), and real Linux guests under qemu realised from the
// VirtualMachineInstances virt-controller created (see README.md).
package kubevirt

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

func TestKubeVirt(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	// controller-runtime's informers log through its global logger.
	ctrl.SetLogger(GinkgoLogr)
	suite, reporter := GinkgoConfiguration()
	suite.Timeout = testbed.SuiteTimeout(t)
	RunSpecs(t, "guestbackup with KubeVirt VirtualMachines", suite, reporter)
}
