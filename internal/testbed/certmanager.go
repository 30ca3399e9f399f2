package testbed

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	cmcontroller "github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	// Each controller and issuer type registers itself when its package is
	// imported, as cert-manager's own controller binary does by importing
	// them all. Only those a CA hierarchy needs are imported here.
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

// CertManagerControllers are the cert-manager controllers StartCertManager
// runs unless told otherwise: everything that issues and renews a
// Certificate from a selfSigned or CA (Cluster)Issuer, and nothing that needs
// the outside world (ACME, Vault, Venafi) or a webhook.
var CertManagerControllers = []string{
	"issuers",
	"clusterissuers",
	"certificaterequests-approver",
	"certificaterequests-issuer-ca",
	"certificaterequests-issuer-selfsigned",
	"certificates-trigger",
	"certificates-issuing",
	"certificates-key-manager",
	"certificates-request-manager",
	"certificates-readiness",
	"certificates-revision-manager",
}

// Defaults of cert-manager's controller binary (its configuration API's
// defaults), so the controllers behave here as they do in a cluster.
const (
	certManagerAPIQPS   = 20
	certManagerAPIBurst = 50
	certManagerWorkers  = 5
)

// certManagerCopiedAnnotationPrefixes is the binary's default
// --copied-annotation-prefixes: which Certificate annotations its
// CertificateRequests inherit.
var certManagerCopiedAnnotationPrefixes = []string{"*", "-kubectl.kubernetes.io/", "-fluxcd.io/", "-argocd.argoproj.io/"}

const (
	// certManagerSyncTimeout bounds the wait for the controllers' informers
	// to list everything once.
	certManagerSyncTimeout = time.Minute
	// certManagerStopTimeout bounds the wait for every controller to exit.
	certManagerStopTimeout = 30 * time.Second
)

// CertManagerOptions adjusts StartCertManager.
type CertManagerOptions struct {
	// ClusterResourceNamespace is where ClusterIssuers' Secrets live (a CA
	// ClusterIssuer's CA key pair, for instance), like the binary's
	// --cluster-resource-namespace. It is created when missing. Default
	// "cert-manager", the namespace cert-manager's chart installs into.
	ClusterResourceNamespace string
	// Controllers are the controllers to run, by cert-manager's names.
	// Default: CertManagerControllers.
	Controllers []string
	// Workers is the number of workers of each controller. Default 5, the
	// binary's --concurrent-workers.
	Workers int
	// Verbosity is the most detailed of cert-manager's log levels that
	// reaches the test's log: 1 warnings, 2 info, 4 debug, 5 trace; zero
	// means 2. Errors always reach it.
	Verbosity int
}

// CertManager is cert-manager's controller running in the test's process.
type CertManager struct {
	// ClusterResourceNamespace holds ClusterIssuers' Secrets.
	ClusterResourceNamespace string
	// Controllers are the controllers that run.
	Controllers []string

	cancel   context.CancelFunc
	done     chan struct{}
	log      *testLogSink
	stopOnce sync.Once
	stopErr  error
	// shutdown stops the shared informers once the controllers are gone.
	shutdown []func()
}

// StartCertManager runs cert-manager's own controllers (the packages of the
// pinned github.com/cert-manager/cert-manager module, not a mock) against
// api, the way cert-manager's controller binary wires them: one context
// factory, one constructor per enabled controller, then the shared
// informers. As with that binary run with --leader-elect=false, it runs at
// once, without leader election. It serves neither metrics nor health
// probes, so it listens on no port at all. cert-manager logs to the test's
// log, and the test's cleanup stops it within a bounded wait.
//
// cert-manager authenticates as its own user, in group system:masters: what
// is proven here is issuance, not the RBAC rules its chart ships.
func StartCertManager(tb TB, api *APIServer, opts CertManagerOptions) *CertManager {
	tb.Helper()
	if opts.ClusterResourceNamespace == "" {
		opts.ClusterResourceNamespace = "cert-manager"
	}
	if len(opts.Controllers) == 0 {
		opts.Controllers = CertManagerControllers
	}
	if opts.Workers <= 0 {
		opts.Workers = certManagerWorkers
	}
	if opts.Verbosity == 0 {
		opts.Verbosity = logf.InfoLevel
	}
	cm, err := startCertManager(tb, api, opts)
	if err != nil {
		tb.Fatalf("start cert-manager: %v", err)
	}
	return cm
}

func startCertManager(tb TB, api *APIServer, opts CertManagerOptions) (*CertManager, error) {
	known := cmcontroller.Known()
	for _, name := range opts.Controllers {
		if _, ok := known[name]; !ok {
			names := make([]string, 0, len(known))
			for n := range known {
				names = append(names, n)
			}
			sort.Strings(names)
			return nil, fmt.Errorf("controller %q is not registered (the test bed imports only %s)", name, strings.Join(names, ", "))
		}
	}

	setup, cancelSetup := context.WithTimeout(context.Background(), certManagerSyncTimeout)
	defer cancelSetup()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: opts.ClusterResourceNamespace}}
	if err := api.Client.Create(setup, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create cluster resource namespace %s: %w", ns.Name, err)
	}

	// cert-manager's context factory builds its clients from a kubeconfig
	// file (the binary's --kubeconfig), not from a rest.Config. The file
	// gives it an identity of its own, as its ServiceAccount is in a
	// cluster, rather than the test's.
	user, err := api.Env.AddUser(envtest.User{Name: "cert-manager", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("add cert-manager's API server user: %w", err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		return nil, fmt.Errorf("cert-manager's kubeconfig: %w", err)
	}
	kubeconfigPath := filepath.Join(tb.TempDir(), "cert-manager.kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		return nil, fmt.Errorf("write cert-manager's kubeconfig: %w", err)
	}

	sink := &testLogSink{tb: tb}
	logger := funcr.New(sink.write, funcr.Options{Verbosity: opts.Verbosity})
	// The controllers take their logger from this context (and from the
	// contexts derived from it), never from a global.
	ctx, cancel := context.WithCancel(logf.NewContext(context.Background(), logger, "cert-manager"))

	factory, err := cmcontroller.NewContextFactory(ctx, cmcontroller.ContextOptions{
		Kubeconfig:         kubeconfigPath,
		KubernetesAPIQPS:   certManagerAPIQPS,
		KubernetesAPIBurst: certManagerAPIBurst,
		// Namespace stays empty: a namespaced cert-manager ignores
		// ClusterIssuers.
		IssuerOptions:      cmcontroller.IssuerOptions{ClusterResourceNamespace: opts.ClusterResourceNamespace},
		CertificateOptions: cmcontroller.CertificateOptions{CopiedAnnotationPrefixes: certManagerCopiedAnnotationPrefixes},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("build cert-manager's controller context: %w", err)
	}
	// Constructors register the informers each controller needs with the
	// shared factories; the factories start only after all have.
	controllers := make(map[string]cmcontroller.Interface, len(opts.Controllers))
	for _, name := range opts.Controllers {
		c, err := known[name](factory)
		if err != nil {
			cancel()
			return nil, fmt.Errorf("construct controller %s: %w", name, err)
		}
		controllers[name] = c
	}
	// The shared factories are the same in every Context the factory
	// builds; this one only reaches them.
	shared, err := factory.Build("informers")
	if err != nil {
		cancel()
		return nil, fmt.Errorf("build cert-manager's informer context: %w", err)
	}

	cm := &CertManager{
		ClusterResourceNamespace: opts.ClusterResourceNamespace,
		Controllers:              slices.Clone(opts.Controllers),
		cancel:                   cancel,
		done:                     make(chan struct{}),
		log:                      sink,
		shutdown: []func(){
			shared.SharedInformerFactory.Shutdown,
			shared.KubeSharedInformerFactory.Shutdown,
			shared.HTTP01ResourceMetadataInformersFactory.Shutdown,
		},
	}
	var wg sync.WaitGroup
	for name, c := range controllers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(opts.Workers, ctx); err != nil {
				logger.Error(err, "controller stopped", "controller", name)
			}
		}()
	}
	go func() {
		wg.Wait()
		close(cm.done)
	}()
	tb.Cleanup(func() {
		if err := cm.Stop(); err != nil {
			tb.Fatalf("%v", err)
		}
	})

	shared.SharedInformerFactory.Start(ctx.Done())
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	// Empty (only ACME's HTTP-01 solver uses it), started as the binary does.
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	// Return only once the informers have listed everything: a cert-manager
	// that cannot watch (a CRD missing, say) fails here, with the names of
	// its informers, rather than as a certificate that never comes; and a
	// test's timings then measure issuance, not start-up.
	syncCtx, cancelSync := context.WithTimeout(ctx, certManagerSyncTimeout)
	defer cancelSync()
	var unsynced []string
	for informer, ok := range shared.SharedInformerFactory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			unsynced = append(unsynced, informer.String())
		}
	}
	for informer, ok := range shared.KubeSharedInformerFactory.WaitForCacheSync(syncCtx.Done()) {
		if !ok {
			unsynced = append(unsynced, informer)
		}
	}
	if len(unsynced) > 0 {
		return nil, fmt.Errorf("cert-manager's informers %s did not sync within %v", strings.Join(unsynced, ", "), certManagerSyncTimeout)
	}
	return cm, nil
}

// Stop cancels every controller and waits, at most 30 seconds, for them to
// exit and then for the shared informers to stop. From then on cert-manager no longer
// writes to the test's log. It is safe to call twice; the test's cleanup
// calls it.
func (cm *CertManager) Stop() error {
	cm.stopOnce.Do(func() {
		cm.cancel()
		stopped := make(chan struct{})
		go func() {
			<-cm.done
			// Informers go last: a controller may read its listers until
			// its workers have returned.
			for _, shutdown := range cm.shutdown {
				shutdown()
			}
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(certManagerStopTimeout):
			cm.stopErr = fmt.Errorf("cert-manager's controllers and informers did not stop within %v", certManagerStopTimeout)
		}
		cm.log.close()
	})
	return cm.stopErr
}

// testLogSink writes log lines to the test's log until closed: a *testing.T
// panics when logged to after its test has ended, and cert-manager's
// goroutines (event broadcasters among them) may still log briefly then.
type testLogSink struct {
	tb     TB
	mu     sync.Mutex
	closed bool
}

func (s *testLogSink) write(prefix, args string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.tb.Logf("%s %s", prefix, args)
}

func (s *testLogSink) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
}
