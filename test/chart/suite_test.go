// Package chart proves the Helm chart charts/guestbackup: it lints, renders
// for the value sets admins use, and every object it renders is accepted by a
// real kube-apiserver (the test bed's, with the cert-manager and KubeVirt
// CRDs) and matches what the binaries need: the webhook configuration of
// pkg/mutate, the RBAC generated from the kubebuilder markers, restricted pods
// without fixed UIDs.
package chart

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

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
	kubeconfig = writeKubeconfig()
})

// writeKubeconfig writes a kubeconfig file for the test's API server, for
// helm's --dry-run=server (lookup, and the checks an install makes).
//
// helm reaches the API server through a proxy that answers /version with the
// release the test bed builds kube-apiserver from: the binary is built
// without version stamping and reports v0.0.0, which the chart's kubeVersion
// constraint refuses. Every other request reaches the real API server.
func writeKubeconfig() string {
	GinkgoHelper()
	// hack/tools.sh keys the API server's folder by its Kubernetes version.
	gitVersion := filepath.Base(tools.Assets)
	var major, minor, patch int
	_, err := fmt.Sscanf(gitVersion, "v%d.%d.%d", &major, &minor, &patch)
	Expect(err).NotTo(HaveOccurred(), "the API server's folder %s names its version", tools.Assets)

	transport, err := rest.TransportFor(apiServer.Config)
	Expect(err).NotTo(HaveOccurred())
	target, err := url.Parse(apiServer.Config.Host)
	Expect(err).NotTo(HaveOccurred())
	forward := httputil.NewSingleHostReverseProxy(target)
	forward.Transport = transport // authenticates as the test bed's admin
	proxy := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/version" {
			forward.ServeHTTP(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(version.Info{
			Major: strconv.Itoa(major), Minor: strconv.Itoa(minor), GitVersion: gitVersion,
			Platform: runtime.GOOS + "/" + runtime.GOARCH,
		})
	}))
	DeferCleanup(proxy.Close)

	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{
		Server:                   proxy.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: proxy.Certificate().Raw}),
	}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(helmHome, "kubeconfig")
	Expect(clientcmd.WriteToFile(*cfg, path)).To(Succeed())
	return path
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
