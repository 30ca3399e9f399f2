// Command webhook serves guestbackup's mutating admission webhook for
// KubeVirt VirtualMachines that opt in with the guestbackup.io/server
// annotation.
package main

import (
	"flag"
	"fmt"
	"os"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	guestbackupv1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

func main() {
	var (
		port        int
		certDir     string
		metricsAddr string
		probeAddr   string
	)
	flag.IntVar(&port, "port", 9443, "Port the webhook's HTTPS server listens on.")
	flag.StringVar(&certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Folder holding the serving certificate (tls.crt, tls.key).")
	flag.StringVar(&metricsAddr, "metrics-bind-address", ":8080", "Address the Prometheus metrics endpoint binds to; 0 disables it.")
	flag.StringVar(&probeAddr, "health-probe-bind-address", ":8081", "Address the liveness and readiness probes bind to.")
	opts := zap.Options{}
	opts.BindFlags(flag.CommandLine)
	flag.Parse()
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))

	if err := run(port, certDir, metricsAddr, probeAddr); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(1)
	}
}

func newScheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(guestbackupv1alpha1.AddToScheme(s))
	utilruntime.Must(kubevirtv1.AddToScheme(s))
	return s
}

func run(port int, certDir, metricsAddr, probeAddr string) error {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	hooks := webhook.NewServer(webhook.Options{Port: port, CertDir: certDir})
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 newScheme(),
		Metrics:                metricsserver.Options{BindAddress: metricsAddr},
		HealthProbeBindAddress: probeAddr,
		WebhookServer:          hooks,
	})
	if err != nil {
		return fmt.Errorf("create manager: %w", err)
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("add liveness check: %w", err)
	}
	// Ready only once the HTTPS server is up with its certificate.
	if err := mgr.AddReadyzCheck("webhook", hooks.StartedChecker()); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
