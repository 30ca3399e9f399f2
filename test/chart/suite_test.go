// Package chart proves the Helm chart charts/guestbackup: it lints, renders
// for the value sets admins use, and every object it renders is accepted by a
// real kube-apiserver (the test bed's, with the cert-manager and KubeVirt
// CRDs) and matches what the binaries need: the webhook configuration of
// pkg/mutate, the RBAC generated from the kubebuilder markers, restricted pods
// without fixed UIDs.
package chart

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/client-go/discovery"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

var (
	apiServer *testbed.APIServer
	tools     testbed.Tools
	repoRoot  string
	chartDir  string
	helmHome  string
	// kubeconfig is a kubeconfig file for helm's --dry-run=server.
	kubeconfig string
)

func TestChart(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	RunSpecs(t, "guestbackup's Helm chart")
}

var _ = BeforeSuite(func() {
	tools = testbed.MustTools(GinkgoT())
	var err error
	repoRoot, err = testbed.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	chartDir = filepath.Join(repoRoot, "charts", "guestbackup")
	// Helm keeps its configuration and caches out of the developer's home.
	helmHome = GinkgoT().TempDir()
	apiServer = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
	kubeconfig = writeKubeconfig(apiServer)
})

// writeKubeconfig writes a kubeconfig file for the test's API server, as its
// admin (testbed.APIServer.Kubeconfig), once it checked the server's
// version, for helm's --dry-run=server (lookup, and the checks an install
// makes, among them the chart's kubeVersion against the server's /version).
func writeKubeconfig(api *testbed.APIServer) string {
	GinkgoHelper()
	// hack/tools.sh stamps kube-apiserver with its release, as Kubernetes'
	// own build does, and keys its folder by it.
	dc, err := discovery.NewDiscoveryClientForConfig(api.Config)
	Expect(err).NotTo(HaveOccurred())
	v, err := dc.ServerVersion()
	Expect(err).NotTo(HaveOccurred())
	Expect(v.GitVersion).To(Equal(filepath.Base(tools.Assets)), "the API server's /version names its release (run `make tools` to rebuild it stamped)")

	return api.Kubeconfig(GinkgoT())
}

// helm runs the test bed's helm and returns its standard output; a failure
// carries its standard error.
func helm(args ...string) (string, error) {
	cmd := exec.Command(tools.Helm, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(helmHome, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(helmHome, "config"),
		"HELM_DATA_HOME="+filepath.Join(helmHome, "data"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), &helmError{args: args, err: err, stderr: stderr.String()}
	}
	return stdout.String(), nil
}

type helmError struct {
	args   []string
	err    error
	stderr string
}

func (e *helmError) Error() string {
	return "helm " + strings.Join(e.args, " ") + ": " + e.err.Error() + ": " + e.stderr
}
