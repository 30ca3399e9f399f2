package kopiaserver

import (
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// Metrics of each BSLS, on the controller's metrics endpoint. Labels are
// the BSLS's namespace and name; a deleted BSLS's series go with it.
var (
	usersMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_bsls_users",
		Help: "Guest users written for a BackupStorageLocationServer's server.",
	}, []string{"namespace", "bsls"})
	pendingMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_bsls_users_pending",
		Help: "Credential Secrets of a BackupStorageLocationServer whose password is not hashed yet.",
	}, []string{"namespace", "bsls"})
	refusedMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_bsls_users_refused",
		Help: "Credential Secrets naming a BackupStorageLocationServer that it does not provision (namespace not admitted, invalid or duplicate identity).",
	}, []string{"namespace", "bsls"})
	errorsMetric = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "guestbackup_bsls_sync_errors_total",
		Help: "Reconciles of a BackupStorageLocationServer that failed on an API error (retried with backoff); problems with the spec are conditions, not errors.",
	}, []string{"namespace", "bsls"})
	readyMetric = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_bsls_ready",
		Help: "1 when a BackupStorageLocationServer is Ready, else 0.",
	}, []string{"namespace", "bsls"})
)

func init() {
	metrics.Registry.MustRegister(usersMetric, pendingMetric, refusedMetric, readyMetric, errorsMetric)
}

func recordMetrics(b *v1alpha1.BackupStorageLocationServer, users UserSet, ready bool) {
	usersMetric.WithLabelValues(b.Namespace, b.Name).Set(float64(users.Count))
	pendingMetric.WithLabelValues(b.Namespace, b.Name).Set(float64(len(users.Pending)))
	refusedMetric.WithLabelValues(b.Namespace, b.Name).Set(float64(len(users.Refused)))
	value := 0.0
	if ready {
		value = 1
	}
	readyMetric.WithLabelValues(b.Namespace, b.Name).Set(value)
	// Exported at 0 before the first error, so that an alert on its
	// increase has a series to compare with.
	errorsMetric.WithLabelValues(b.Namespace, b.Name)
}

func forgetMetrics(namespace, name string) {
	for _, m := range []*prometheus.GaugeVec{usersMetric, pendingMetric, refusedMetric, readyMetric} {
		m.DeleteLabelValues(namespace, name)
	}
	errorsMetric.DeleteLabelValues(namespace, name)
}
