// Command webhook serves guestbackup's mutating admission webhook for
// KubeVirt VirtualMachines that opt in with the guestbackup.io/server
// annotation.
package main

import (
	"flag"
	"fmt"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/internal/webhook"
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
	hooks := ctrlwebhook.NewServer(ctrlwebhook.Options{Port: port, CertDir: certDir})
	mgr, err := manager.New(flags, ctrl.Options{WebhookServer: hooks, Cache: webhook.Cache()})
	if err != nil {
		return err
	}
	if err := webhook.Setup(mgr); err != nil {
		return err
	}
	return mgr.Start(ctrl.SetupSignalHandler())
}
