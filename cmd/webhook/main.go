// Command webhook serves guestbackup's mutating admission webhook for
// KubeVirt VirtualMachines that opt in with the guestbackup.io/server
// annotation.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/mutate"
)

func main() {
	var (
		flags   manager.Flags
		port    int
		certDir string
	)
	flags.Bind(flag.CommandLine)
	flag.IntVar(&port, "port", 9443, "Port the webhook's HTTPS server listens on.")
	flag.StringVar(&certDir, "cert-dir", "/tmp/k8s-webhook-server/serving-certs", "Folder holding the serving certificate (tls.crt, tls.key).")
	flag.Parse()

	if err := run(flags, port, certDir); err != nil {
		fmt.Fprintln(os.Stderr, "webhook:", err)
		os.Exit(1)
	}
}

func run(flags manager.Flags, port int, certDir string) error {
	hooks := webhook.NewServer(webhook.Options{Port: port, CertDir: certDir})
	mgr, err := manager.New(flags, ctrl.Options{WebhookServer: hooks, Cache: mutate.CacheOptions()})
	if err != nil {
		return err
	}
	mutate.SetupWithManager(mgr)
	// Ready only once the HTTPS server is up with its certificate.
	if err := mgr.AddReadyzCheck("webhook", hooks.StartedChecker()); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
