package kopiaserver

import (
	"context"
	"fmt"
	"maps"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// certManagerSecretLabels are the labels cert-manager puts on a BSLS's
// serving Secret (Certificate.spec.secretTemplate): the BSLS's labels but
// app.kubernetes.io/managed-by. The chart's ValidatingAdmissionPolicy lets
// only guestbackup's ServiceAccounts write Secrets carrying that label;
// letting cert-manager through would let anyone who may create a
// Certificate have cert-manager write a Secret that guestbackup trusts as
// its own. Without the label the Secret is outside the controller's cache:
// it is read uncached (tlsSecret) and its changes arrive through the
// Certificate, which the controller owns and watches.
func certManagerSecretLabels(b *v1alpha1.BackupStorageLocationServer) map[string]string {
	l := maps.Clone(Labels(b))
	delete(l, v1alpha1.LabelManagedBy)
	return l
}

// releaseToCertManager removes app.kubernetes.io/managed-by from a serving
// Secret cert-manager writes, as earlier releases had it labelled: while
// it carries the label, the admission policy refuses cert-manager's
// renewals. The controller may write labelled Secrets; nothing else changes.
func (r *Reconciler) releaseToCertManager(ctx context.Context, s *corev1.Secret) error {
	if s == nil || s.Labels[v1alpha1.LabelManagedBy] != v1alpha1.ManagedByValue {
		return nil
	}
	patch := client.MergeFrom(s.DeepCopy())
	delete(s.Labels, v1alpha1.LabelManagedBy)
	if err := r.Client.Patch(ctx, s, patch); err != nil {
		return fmt.Errorf("remove label %s from Secret %s/%s, which cert-manager writes: %w", v1alpha1.LabelManagedBy, s.Namespace, s.Name, err)
	}
	return nil
}
