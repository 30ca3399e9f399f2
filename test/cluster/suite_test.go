// Package cluster runs guestbackup's end-to-end stories (test/story) on real
// KubeVirt on the test bed's real node: a one-node cluster (kubelet,
// containerd, kube-scheduler, kube-controller-manager) where KubeVirt is
// installed from its operator and guestbackup by `helm install` of its
// chart, and where KubeVirt's own virt-handler and virt-launcher boot the
// guests under QEMU (TCG) in pods (see test/kubevirt/README.md, "The cluster
// backend"). It runs when selected, GUESTBACKUP_E2E=cluster (make
// test-cluster), never by KUBECONFIG alone: it builds its own cluster.
package cluster

import (
	"fmt"
	"os"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// backendEnv selects this suite: GUESTBACKUP_E2E=cluster.
const backendEnv, selected = "GUESTBACKUP_E2E", "cluster"

func TestCluster(t *testing.T) {
	if os.Getenv(backendEnv) != selected {
		t.Skip(fmt.Sprintf("the cluster backend runs with %s=%s (make test-cluster)", backendEnv, selected))
	}
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	ctrl.SetLogger(GinkgoLogr)
	suite, reporter := GinkgoConfiguration()
	suite.Timeout = testbed.SuiteTimeout(t)
	RunSpecs(t, "guestbackup on real KubeVirt on the test bed's node", suite, reporter)
}
