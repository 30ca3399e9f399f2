package credentials

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// provisioningSeconds is how long credentials take from issue (the
// webhook's admission) to being in the users Secret of their BSLS, where
// the server pod picks them up at once.
var provisioningSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "guestbackup_user_provisioning_seconds",
	Help:    "Time from the webhook issuing a VM's credentials to their user being written for its BackupStorageLocationServer.",
	Buckets: []float64{0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 300},
}, []string{"namespace", "bsls"})

func init() {
	metrics.Registry.MustRegister(provisioningSeconds)
}

// observeProvisioning records a provisioning, when the Secret says when
// its credentials were issued.
func observeProvisioning(secret *corev1.Secret, now time.Time) {
	issued, err := time.Parse(time.RFC3339Nano, secret.Annotations[v1alpha1.AnnotationIssuedAt])
	if err != nil {
		return
	}
	bsls := serverOf(secret)
	provisioningSeconds.WithLabelValues(bsls.Namespace, bsls.Name).Observe(now.Sub(issued).Seconds())
}
