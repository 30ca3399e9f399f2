package credentials

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// provisioningSeconds is how long credentials take from issue (the
// webhook's admission) to being in the users Secret of their BSLS, where
// the server pod picks them up at once.
var provisioningSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
	Name:    "guestbackup_user_provisioning_seconds",
	Help:    "Time from the webhook issuing a VM's credentials to their user being written for its BackupStorageLocationServer.",
	Buckets: []float64{0.25, 0.5, 1, 2, 3, 5, 10, 30, 60, 300},
}, []string{"namespace", "bsls"})

// passwordHashes counts the passwords the controller hashed: the Hasher's
// (VMs') and the BackupClient reconciler's. Each credentials generation is
// hashed once: a restart or a resync of the
// controller adds none, so a rise without new VMs or rotations is a defect
// (and costs a core and 64 MiB per scrypt hash).
var passwordHashes = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "guestbackup_password_hashes_total",
	Help: "Passwords the controller hashed, by algorithm (scrypt or pbkdf2): one per VM or BackupClient credentials generation; a restart or resync adds none.",
}, []string{"algorithm"})

func init() {
	metrics.Registry.MustRegister(provisioningSeconds, passwordHashes)
}

// ObserveHash counts one password hashed with version, by whichever
// reconciler hashed it.
func ObserveHash(version identity.HashVersion) {
	passwordHashes.WithLabelValues(version.String()).Inc()
}

// observeProvisioning records a provisioning, when the Secret says when
// its credentials were issued.
func observeProvisioning(secret *corev1.Secret, now time.Time) {
	issued, err := time.Parse(time.RFC3339Nano, secret.Annotations[vmsecret.AnnotationIssuedAt])
	if err != nil {
		return
	}
	bsls := vmsecret.Server(secret)
	provisioningSeconds.WithLabelValues(bsls.Namespace, bsls.Name).Observe(now.Sub(issued).Seconds())
}
