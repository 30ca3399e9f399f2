package testbed

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// NewScheme returns a scheme with every type the test bed's API server
// serves: the binaries' (Kubernetes', guestbackup's, KubeVirt's), CRDs and
// cert-manager's.
func NewScheme() *runtime.Scheme {
	s := manager.NewScheme()
	utilruntime.Must(apiextensionsv1.AddToScheme(s))
	utilruntime.Must(certmanagerv1.AddToScheme(s))
	return s
}

// CRDPaths are the folders (or files) of every CRD the test bed's API
// server starts with: guestbackup's (the chart's crds/), KubeVirt's
// VirtualMachine and VirtualMachineInstance, cert-manager's and Velero's
// BackupStorageLocation. StartAPIServer installs Velero's only when asked
// (APIServerOptions.Velero): by default its cluster has no Velero.
// KubeVirt's other 17 CRDs come with its control plane (StartKubeVirt):
// they cost every API server about 2 s and 110 MiB, and only KubeVirt's
// own processes read them.
func CRDPaths() ([]string, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	return []string{
		guestbackupCRDPath(root),
		filepath.Join(kubevirtCRDPath(root), "virtualmachines.kubevirt.io.yaml"),
		filepath.Join(kubevirtCRDPath(root), "virtualmachineinstances.kubevirt.io.yaml"),
		filepath.Join(root, "test", "crds", "cert-manager"),
		veleroCRDPath(root),
	}, nil
}

// guestbackupCRDPath is the folder of guestbackup's CRDs, which the chart
// renders (hack/generate.sh writes them).
func guestbackupCRDPath(root string) string {
	return filepath.Join(root, "charts", "guestbackup", "files", "crds")
}

// kubevirtCRDPath is the folder of KubeVirt's CRDs, as virt-operator
// installs them.
func kubevirtCRDPath(root string) string { return filepath.Join(root, "test", "crds", "kubevirt") }

func veleroCRDPath(root string) string { return filepath.Join(root, "test", "crds", "velero") }

// APIServer is a running kube-apiserver and etcd with the test bed's CRDs.
type APIServer struct {
	Env    *envtest.Environment
	Config *rest.Config
	Client client.Client
	Scheme *runtime.Scheme
	// AuditLog is the API server's audit log: what it records of every
	// request that creates a VirtualMachine or VirtualMachineInstance
	// (auditPolicy), read by Created.
	AuditLog string
}

// APIServerOptions adjusts StartAPIServer.
type APIServerOptions struct {
	// Webhooks registers admission webhooks with the API server.
	Webhooks envtest.WebhookInstallOptions
	// Velero installs Velero's BackupStorageLocation CRD, as a cluster with
	// Velero has it. Without it the cluster is one without Velero.
	Velero bool
	// WithoutGuestbackupCRDs leaves guestbackup's own CRDs out: a fresh
	// cluster, where `helm install` of the chart creates them.
	WithoutGuestbackupCRDs bool
	// WithoutKubeVirtCRDs leaves KubeVirt's CRDs out: a cluster where
	// virt-operator installs them (InstallKubeVirt); it refuses to adopt
	// CRDs it did not create.
	WithoutKubeVirtCRDs bool
	// Configure adjusts the API server's flags and serving address before it
	// starts (StartNode serves it on its node's network).
	Configure func(*envtest.Environment) error
}

// StartAPIServer starts kube-apiserver and etcd on loopback, installs the
// CRDs and waits until they are served. The test's cleanup stops both.
func StartAPIServer(tb TB, opts APIServerOptions) *APIServer {
	tb.Helper()
	tools := MustTools(tb)
	mustBeGranted(tools.Assets) // envtest runs them
	paths, err := CRDPaths()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	root, _ := RepoRoot() // CRDPaths found it
	if !opts.Velero {
		paths = slices.DeleteFunc(paths, func(p string) bool { return p == veleroCRDPath(root) })
	}
	if opts.WithoutGuestbackupCRDs {
		paths = slices.DeleteFunc(paths, func(p string) bool { return p == guestbackupCRDPath(root) })
	}
	if opts.WithoutKubeVirtCRDs {
		paths = slices.DeleteFunc(paths, func(p string) bool { return filepath.Dir(p) == kubevirtCRDPath(root) })
	}
	scheme := NewScheme()
	env := &envtest.Environment{
		BinaryAssetsDirectory: tools.Assets,
		CRDDirectoryPaths:     paths,
		ErrorIfCRDPathMissing: true,
		CRDInstallOptions:     envtest.CRDInstallOptions{Scheme: scheme, MaxTime: time.Minute},
		WebhookInstallOptions: opts.Webhooks,
		Scheme:                scheme,
		// The API server's first start on a cold machine can be slow.
		ControlPlaneStartTimeout: 2 * time.Minute,
		ControlPlaneStopTimeout:  time.Minute,
	}
	if err := configureRequestHeader(env, tb.TempDir()); err != nil {
		tb.Fatalf("%v", err)
	}
	auditLog, err := configureAudit(env, tb.TempDir())
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if opts.Configure != nil {
		if err := opts.Configure(env); err != nil {
			tb.Fatalf("configure API server: %v", err)
		}
	}
	// Registered before the start: envtest stops nothing when it fails
	// after the control plane is up (installing a CRD or a webhook), and
	// Stop stops only what started.
	tb.Cleanup(func() {
		if err := env.Stop(); err != nil {
			tb.Logf("stop API server: %v", err)
		}
	})
	cfg, err := env.Start()
	if err != nil {
		tb.Fatalf("start API server (kube-apiserver and etcd from %s): %v", tools.Assets, err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		tb.Fatalf("API server client: %v", err)
	}
	return &APIServer{Env: env, Config: cfg, Client: c, Scheme: scheme, AuditLog: auditLog}
}

// CreateServerMaintenanceRole creates on a the ClusterRole the chart
// installs for the server pods of a BSLS with several replicas, as
// hack/generate.sh writes it from the markers (config/rbac/server-maintenance),
// under the name the controller binds by default
// (kopiaserver.DefaultMaintenanceClusterRole): for test beds that run the
// controller without the chart. One that exists is kept.
func (a *APIServer) CreateServerMaintenanceRole() error {
	root, err := RepoRoot()
	if err != nil {
		return err
	}
	path := filepath.Join(root, "config", "rbac", "server-maintenance", "role.yaml")
	objs, err := readManifests(path)
	if err != nil {
		return err
	}
	for _, o := range objs {
		if o.GetKind() != "ClusterRole" {
			return fmt.Errorf("%s: %s %s is no ClusterRole", path, o.GetKind(), o.GetName())
		}
		if err := a.Client.Create(context.Background(), o); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("create ClusterRole %s: %w", o.GetName(), err)
		}
	}
	return nil
}

// configureRequestHeader gives the API server what a cluster's has for
// aggregated API servers: a front proxy's client CA and the headers it
// names users in, and the front proxy's client certificate, which the API
// server presents when it proxies a request to an aggregated API (KubeVirt's
// subresources.kubevirt.io: a VM's console, start and stop). kube-apiserver
// publishes the CA and headers in ConfigMap
// kube-system/extension-apiserver-authentication, which KubeVirt's virt-api
// reads at start (it panics without a requestheader CA).
func configureRequestHeader(env *envtest.Environment, dir string) error {
	ca, err := pki.NewCA("test bed front proxy", 24*time.Hour)
	if err != nil {
		return fmt.Errorf("front proxy CA: %w", err)
	}
	caFile := filepath.Join(dir, "requestheader-ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o600); err != nil {
		return err
	}
	const proxyName = "front-proxy-client"
	certPEM, keyPEM, err := clientCert(ca, proxyName, 24*time.Hour)
	if err != nil {
		return fmt.Errorf("front proxy client certificate: %w", err)
	}
	certFile, keyFile := filepath.Join(dir, "front-proxy-client.crt"), filepath.Join(dir, "front-proxy-client.key")
	if err := os.WriteFile(certFile, certPEM, 0o600); err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return err
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("requestheader-client-ca-file", caFile)
	args.Set("requestheader-username-headers", "X-Remote-User")
	args.Set("requestheader-group-headers", "X-Remote-Group")
	args.Set("requestheader-extra-headers-prefix", "X-Remote-Extra-")
	args.Set("requestheader-allowed-names", proxyName)
	args.Set("proxy-client-cert-file", certFile)
	args.Set("proxy-client-key-file", keyFile)
	return nil
}

// clientCert issues a client certificate for commonName from ca, as PEM.
func clientCert(ca *pki.CA, commonName string, validFor time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    now.Add(-time.Minute),
		NotAfter:     now.Add(validFor),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, &key.PublicKey, ca.Key)
	if err != nil {
		return nil, nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	keyPEM, err = pki.EncodeKey(key)
	return pki.EncodeCert(cert), keyPEM, err
}

// Kubeconfig writes a kubeconfig file for the API server's admin (for
// kubectl, helm or the kubectl plugin) into a folder of tb's, and returns
// its path.
func (a *APIServer) Kubeconfig(tb TB) string {
	tb.Helper()
	c := a.Config
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["test"] = &clientcmdapi.Cluster{Server: c.Host, CertificateAuthorityData: c.CAData}
	cfg.AuthInfos["test"] = &clientcmdapi.AuthInfo{ClientCertificateData: c.CertData, ClientKeyData: c.KeyData, Token: c.BearerToken}
	cfg.Contexts["test"] = &clientcmdapi.Context{Cluster: "test", AuthInfo: "test"}
	cfg.CurrentContext = "test"
	path := filepath.Join(tb.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		tb.Fatalf("write kubeconfig: %v", err)
	}
	return path
}
