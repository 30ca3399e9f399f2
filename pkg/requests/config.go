package requests

import (
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// WebhookName is the name of the requests' mutating webhook.
const WebhookName = "requests.guestbackup.io"

// Resources are the requests' resources, as the webhook's rule and the
// chart's aggregated ClusterRoles name them.
var Resources = []string{"guestsnapshots", "guestrestores"}

// Webhook is the MutatingWebhook for GuestSnapshots and GuestRestores, as
// the chart installs it when requests are enabled: CREATE only (a CEL rule
// keeps the spec as created, so no update needs the webhook, and deleting
// a request or writing its status never waits on it), in every namespace,
// reinvoked when another webhook changes the request after it (the
// requester is stamped again and the request judged again), no side
// effects, failing closed within 5 seconds: no request is stored without
// its requester.
func Webhook(clientConfig admissionregistrationv1.WebhookClientConfig) admissionregistrationv1.MutatingWebhook {
	return admissionregistrationv1.MutatingWebhook{
		Name:         WebhookName,
		ClientConfig: clientConfig,
		Rules: []admissionregistrationv1.RuleWithOperations{{
			Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
			Rule: admissionregistrationv1.Rule{
				APIGroups: []string{v1alpha1.GroupVersion.Group}, APIVersions: []string{v1alpha1.GroupVersion.Version},
				Resources: Resources, Scope: ptr.To(admissionregistrationv1.NamespacedScope),
			},
		}},
		FailurePolicy:           ptr.To(admissionregistrationv1.Fail),
		MatchPolicy:             ptr.To(admissionregistrationv1.Equivalent),
		SideEffects:             ptr.To(admissionregistrationv1.SideEffectClassNone),
		ReinvocationPolicy:      ptr.To(admissionregistrationv1.IfNeededReinvocationPolicy),
		TimeoutSeconds:          ptr.To[int32](5),
		AdmissionReviewVersions: []string{"v1"},
	}
}
