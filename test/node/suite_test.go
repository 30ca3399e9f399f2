// Package node proves guestbackup on a real node: `make image`'s image,
// imported into the test bed's containerd, installed with `helm install` of
// charts/guestbackup (only the image values changed), runs as real pods that
// a real kubelet, kube-scheduler and kube-controller-manager run under a
// real kube-apiserver (internal/testbed.StartNode): volume ownership,
// Secret file modes, the user the image runs as, probes and restarts are
// the kubelet's, not an imitation's.
//
// cert-manager runs in the test's process (its own controllers and its
// cainjector), as the chart expects it installed. KubeVirt's control plane
// does not run in this suite: its virt-controller would turn started VMs
// into virt-launcher pods this node cannot run yet (test/kubevirt/README.md),
// so VMs here are created and never started; a kopia client on this machine
// plays their guest and reaches the server pod at its pod IP on the node's
// bridge.
package node

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

const (
	// release and releaseNamespace are the chart's install.
	release          = "guestbackup"
	releaseNamespace = "guestbackup-system"
	// imageRepository and imageTag name `make image`'s image in the node.
	imageRepository = "guestbackup"
	imageTag        = "node-e2e"
	// podTimeout bounds a pod becoming Ready: the kubelet starts a
	// container in about a second, but CI's two cores are busy.
	podTimeout = 3 * time.Minute
)

var (
	node  *testbed.Node
	tools testbed.Tools
	ctx   = context.Background()
)

func TestNode(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "guestbackup installed by helm on a real node")
}

var _ = BeforeSuite(func() {
	tools = testbed.MustTools(GinkgoT())
	By("building the image as `make image` does (hack/image.sh), starting a fresh cluster with one real node and cert-manager, " +
		"and helm install of charts/guestbackup, only the image values changed")
	node = testbed.InstallChart(GinkgoT(), testbed.ChartInstall{Repository: imageRepository, Tag: imageTag, Release: release, Namespace: releaseNamespace})
})
