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

// MatchCondition sends the API server's requests to the webhook only for
// VMs that opted in, or that carry what the webhook injected (an opt-out
// must reach it to remove that): no other VM waits on guestbackup, or fails
// when it is down.
var MatchCondition = admissionregistrationv1.MatchCondition{
	Name: "opted-in",
	Expression: "has(object.metadata.annotations) && ('" + v1alpha1.AnnotationServer + "' in object.metadata.annotations || '" +
		v1alpha1.AnnotationStatus + "' in object.metadata.annotations)",
}

// Webhook is the MutatingWebhook for VirtualMachines, as the chart installs
// it: only opted-in VMs, never in guestbackup's own namespace, reinvoked
// when another webhook changes the VM after it, no side effects on dry
// runs, failing closed (only opted-in VMs depend on it) within 5 seconds.
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
		MatchConditions:         []admissionregistrationv1.MatchCondition{MatchCondition},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNoneOnDryRun),
		ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
		TimeoutSeconds:          ptr.To[int32](5),
		AdmissionReviewVersions: []string{"v1"},
	}
}
