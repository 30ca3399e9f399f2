package backupclient

import (
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// The series exported of every BackupClient, labelled namespace,
// backupclient and bsls, as the audit exports a VM's
// (guestbackup_vm_last_snapshot_timestamp_seconds and the rest): an alert
// on an ever older snapshot reads them alike. Clients are few beside VMs,
// so a GaugeVec's cost per series is no concern here.
var (
	lastSnapshotTime = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_client_last_snapshot_timestamp_seconds",
		Help: "When a BackupClient's newest snapshot ended (Unix time).",
	}, seriesLabels)
	snapshots = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "guestbackup_client_snapshots",
		Help: "Snapshots a BackupClient has in its server's repository.",
	}, seriesLabels)
	seriesLabels = []string{"namespace", "backupclient", "bsls"}
)

func init() {
	metrics.Registry.MustRegister(lastSnapshotTime, snapshots)
}

// exportSeries exports what status says of client c's snapshots; a client
// without any yet has no series. Its server never changes (spec.server is
// immutable), so neither do its series' labels.
func exportSeries(c *v1alpha1.BackupClient, status v1alpha1.BackupClientStatus) {
	if status.LastSnapshot == nil {
		return
	}
	values := []string{c.Namespace, c.Name, c.Spec.Server.String()}
	lastSnapshotTime.WithLabelValues(values...).Set(float64(status.LastSnapshot.EndTime.Unix()))
	snapshots.WithLabelValues(values...).Set(float64(status.Snapshots))
}

// forgetSeries drops the series of client key, which is gone.
func forgetSeries(key types.NamespacedName) {
	match := prometheus.Labels{"namespace": key.Namespace, "backupclient": key.Name}
	lastSnapshotTime.DeletePartialMatch(match)
	snapshots.DeletePartialMatch(match)
}
