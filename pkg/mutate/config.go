package mutate

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// WebhookName is the name of guestbackup's mutating webhook.
const WebhookName = "virtualmachines.guestbackup.io"

// MatchConditions send the API server's requests to the webhook only when
// guestbackup has something to do: the creation of a VM that opted in (or
// carries what the webhook injected), an update that changes a
// guestbackup.io annotation (an opt-in, an opt-out, a rotation, a removed
// status annotation), and an update of such a VM's template volumes or
// disks (what the webhook injects). Start, stop (runStrategy, running),
// status, label and finalizer updates, and every update of a VM being
// deleted, never wait on guestbackup or fail while it is down.
var MatchConditions = []admissionregistrationv1.MatchCondition{
	{Name: "not-deleting", Expression: "!has(object.metadata.deletionTimestamp)"},
	{Name: "guestbackup-changes", Expression: guestbackupChanges},
}

// guestbackupChanges is CEL on the request: oldObject is null on CREATE.
const guestbackupChanges = `request.operation == 'CREATE' ?
  ('` + v1alpha1.AnnotationServer + `' in object.metadata.?annotations.orValue({}) ||
   '` + v1alpha1.AnnotationStatus + `' in object.metadata.?annotations.orValue({})) :
  object.metadata.?annotations.orValue({}).exists(k, k.startsWith('` + v1alpha1.AnnotationPrefix + `') &&
    (!(k in oldObject.metadata.?annotations.orValue({})) || oldObject.metadata.annotations[k] != object.metadata.annotations[k])) ||
  oldObject.metadata.?annotations.orValue({}).exists(k, k.startsWith('` + v1alpha1.AnnotationPrefix + `') &&
    !(k in object.metadata.?annotations.orValue({}))) ||
  (('` + v1alpha1.AnnotationServer + `' in object.metadata.?annotations.orValue({}) ||
    '` + v1alpha1.AnnotationStatus + `' in object.metadata.?annotations.orValue({})) &&
   (object.spec.?template.?spec.?volumes.orValue([]) != oldObject.spec.?template.?spec.?volumes.orValue([]) ||
    object.spec.?template.?spec.?domain.?devices.?disks.orValue([]) != oldObject.spec.?template.?spec.?domain.?devices.?disks.orValue([])))`

// Webhook is the MutatingWebhook for VirtualMachines, as the chart installs
// it: only opted-in VMs, never in guestbackup's own namespace, reinvoked
// when another webhook changes the VM after it, no side effects on dry
// runs, failing closed within 5 seconds: only what MatchConditions send
// depends on it.
func Webhook(ownNamespace string, clientConfig admissionregistrationv1.WebhookClientConfig) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name:         WebhookName,
		ClientConfig: clientConfig,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{"kubevirt.io"}, APIVersions: []string{"v1"},
				Resources: []string{"virtualmachines"}, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}},
		NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
			Key: corev1.LabelMetadataName, Operator: metav1.LabelSelectorOpNotIn, Values: []string{ownNamespace},
		}}},
		MatchConditions:         MatchConditions,
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun),
		ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
		TimeoutSeconds:          ptr.To[int32](5),
		AdmissionReviewVersions: []string{"v1"},
	}
}
