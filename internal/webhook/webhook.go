// Package webhook is cmd/webhook's wiring: the cache the webhook runs with
// and the handler it serves. internal/local and the chart's test run the
// webhook through it, so that what they prove is the configuration the
// binary ships.
package webhook

import (
	"fmt"

	"k8s.io/apimachinery/pkg/runtime/schema"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/guestbackup/guestbackup/internal/manager"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/requests"
)

// Cache is the webhook's cache (mutate.CacheOptions: only guestbackup's
// Secrets), whose informers list in pages (manager.PagedInformers): with
// 10,000 opted-in VMs, the credential Secrets' metadata listed whole is
// most of the webhook's peak memory.
func Cache() cache.Options {
	opts := mutate.CacheOptions()
	opts.NewInformer = manager.PagedInformers(manager.NewScheme(), func(schema.GroupKind) toolscache.TransformFunc {
		return opts.DefaultTransform
	})
	return opts
}

// Setup registers the VirtualMachine mutation and the requests' admission
// on mgr's webhook server, and a readiness check that passes once that
// server is up with its certificate. The requests' path is always served:
// the chart points the API server at it only when requests are enabled.
func Setup(mgr ctrl.Manager) error {
	mutate.SetupWithManager(mgr)
	requests.SetupWithManager(mgr)
	if err := mgr.AddReadyzCheck("webhook", mgr.GetWebhookServer().StartedChecker()); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return nil
}
