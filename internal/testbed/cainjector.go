package testbed

import (
	"context"

	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	ctrl "sigs.k8s.io/controller-runtime"
)

// StartCAInjector runs cert-manager's cainjector (its own reconcilers, from
// the module's pkg/controller/cainjector) against api: webhook
// configurations annotated cert-manager.io/inject-ca-from get the CA of the
// named Certificate's Secret as their caBundle, as in a cluster with
// cert-manager installed. The test's cleanup stops it.
func StartCAInjector(tb TB, api *APIServer) {
	tb.Helper()
	stop, err := RunManager(api, ManagerOptions{}, func(mgr ctrl.Manager) error {
		return cainjector.RegisterAllInjectors(context.Background(), mgr, cainjector.SetupOptions{
			EnableCertificatesDataSource: true,
			EnabledReconcilersFor: map[string]bool{
				"mutatingwebhookconfiguration":   true,
				"validatingwebhookconfiguration": true,
			},
		})
	})
	if err != nil {
		tb.Fatalf("start cert-manager's cainjector: %v", err)
	}
	tb.Cleanup(func() {
		if err := stop(); err != nil {
			tb.Logf("stop cainjector: %v", err)
		}
	})
}
