package requeststatus

import (
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/restorejob"
)

// The controller's rules for restores into claims: it creates the Job
// that restores, and the claim when the request asks for a new one.
// +kubebuilder:rbac:groups=batch,resources=jobs,verbs=get;list;watch;create
// +kubebuilder:rbac:groups="",resources=persistentvolumeclaims,verbs=get;list;watch;create
// The Job's owner reference blocks its request's deletion until the Job
// goes (blockOwnerDeletion), which the API server allows only to whom may
// update the request's finalizers (OwnerReferencesPermissionEnforcement,
// on by default on OpenShift).
// +kubebuilder:rbac:groups=guestbackup.io,resources=guestrestores/finalizers,verbs=update

// LabelRestore marks the Job, and a claim it created, of the GuestRestore
// whose UID is its value.
const LabelRestore = "guestbackup.io/restore"

// RestoreJobDeadline bounds a restore Job's run, from its start: what it
// has not restored by then it never will, and a Job whose pod cannot
// start (a claim that does not bind) must end.
const RestoreJobDeadline = 6 * 60 * 60

// RestoreJobName is the name of GuestRestore g's Job: one per request.
func RestoreJobName(g *v1alpha1.GuestRestore) string {
	return "guestbackup-restore-" + string(g.UID)
}

// ClaimOf is the claim GuestRestore g restores into, and whether the
// controller creates it (spec.target.persistentVolumeClaim.size): one
// named after the request.
func ClaimOf(g *v1alpha1.GuestRestore) (name string, create bool) {
	c := g.Spec.Target.PersistentVolumeClaim
	if c == nil {
		return "", false
	}
	if c.ClaimName != "" {
		return c.ClaimName, false
	}
	return g.Name, true
}

// RestoreClaim is the claim the controller creates for g: size and class
// as asked, ReadWriteOnce, labelled with g's UID. It is not owned by g:
// what was restored is the owner's, and stays when the request goes.
func RestoreClaim(g *v1alpha1.GuestRestore) *corev1.PersistentVolumeClaim {
	c := g.Spec.Target.PersistentVolumeClaim
	name, _ := ClaimOf(g)
	return &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: g.Namespace, Labels: map[string]string{
			v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, LabelRestore: string(g.UID), v1alpha1.LabelVM: g.Spec.VM,
		}},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes:      []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			StorageClassName: c.StorageClassName,
			Resources:        corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: *c.Size}},
		},
	}
}

// RestoreJob is the Job that carries out g into its claim under the
// identity of g's VM, with that VM's password from its Secret, reaching
// server as the VM's guest does (package restorejob); image holds
// guestbackup-restore and kopia. It is owned by g, runs once per attempt
// under the restricted Pod Security standard (non-root, no capability, no
// privilege escalation, a read-only root filesystem, no service account
// token), and writes nowhere but the claim and a scratch folder. It runs
// as the image's user. Into a claim it creates, its fsGroup is the
// image's group, which the kubelet gives the fresh claim's root so that
// the user may write there; an existing claim's files are left as they
// are (an fsGroup would change the group of every one), so its root must
// be writable by that user or group already (one an earlier restore
// created is). Where the platform assigns users and groups
// (platformAssignsIDs, OpenShift's restricted SCCs,
// kopiaserver.AssignsPodIDs), it names neither, as the server pods do.
func RestoreJob(g *v1alpha1.GuestRestore, server *v1alpha1.BackupStorageLocationServer, image string, platformAssignsIDs bool) *batchv1.Job {
	claim, _ := ClaimOf(g)
	labels := map[string]string{v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, LabelRestore: string(g.UID), v1alpha1.LabelVM: g.Spec.VM}
	env := []corev1.EnvVar{
		{Name: restorejob.EnvServerURL, Value: server.Status.Endpoint},
		{Name: restorejob.EnvCA, Value: server.Status.TLSCA},
		{Name: restorejob.EnvUser, Value: identity.OfVM(g.Spec.VM, g.Namespace)},
		{Name: restorejob.EnvRequest, Value: string(g.UID)},
		{Name: restorejob.EnvPassword, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: v1alpha1.CredentialSecretName(g.Spec.VM)}, Key: v1alpha1.SecretKeyPassword,
		}}},
	}
	security := &corev1.PodSecurityContext{
		RunAsNonRoot:        ptr.To(true),
		SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
	}
	if _, create := ClaimOf(g); create && !platformAssignsIDs {
		security.FSGroup = ptr.To[int64](kopiaserver.ImageGroup)
	}
	if server.Status.Client != nil {
		env = append(env, corev1.EnvVar{Name: restorejob.EnvClientURL, Value: server.Status.Client.URL})
	}
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: RestoreJobName(g), Namespace: g.Namespace, Labels: labels,
			OwnerReferences: []metav1.OwnerReference{*metav1.NewControllerRef(g, v1alpha1.GroupVersion.WithKind("GuestRestore"))}},
		Spec: batchv1.JobSpec{
			// A second attempt tells the ending the first kept but could
			// not tell, or restores again, throwing away what the first
			// left (package runner). A configuration error (exit 2) is
			// not tried again.
			BackoffLimit: ptr.To[int32](2),
			PodFailurePolicy: &batchv1.PodFailurePolicy{Rules: []batchv1.PodFailurePolicyRule{{
				Action:      batchv1.PodFailurePolicyActionFailJob,
				OnExitCodes: &batchv1.PodFailurePolicyOnExitCodesRequirement{Operator: batchv1.PodFailurePolicyOnExitCodesOpIn, Values: []int32{2}},
			}}},
			ActiveDeadlineSeconds: ptr.To[int64](RestoreJobDeadline),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					EnableServiceLinks:           ptr.To(false),
					SecurityContext:              security,
					Containers: []corev1.Container{{
						Name:    "restore",
						Image:   image,
						Command: []string{"/usr/local/bin/guestbackup-restore"},
						Env:     env,
						VolumeMounts: []corev1.VolumeMount{
							{Name: "claim", MountPath: restorejob.ClaimMount},
							{Name: "scratch", MountPath: restorejob.ScratchMount},
						},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("256Mi")},
							Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")},
						},
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
						SecurityContext: &corev1.SecurityContext{
							AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
							Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
					}},
					Volumes: []corev1.Volume{
						{Name: "claim", VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: claim}}},
						// Kopia's cache of what it restores: bounded, so that a
						// large restore cannot fill the node.
						{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("2Gi"))}}},
					},
				},
			},
		},
	}
}

// JobState is what a decision reads of a restore's Job and claim.
type JobState struct {
	// Name is the Job's; Exists, whether it does.
	Name   string
	Exists bool
	// Failed is why the Job failed (its Failed condition), "" while it
	// has not. Waiting is why its pod does not run yet (podWaiting), ""
	// when it runs or there is none.
	Failed  string
	Waiting string
	// Claim is the claim's name; ClaimProblem, why the restore cannot
	// write into it ("" when it can, or when the controller creates it).
	Claim        string
	ClaimProblem string
	// CreateClaim is whether the controller creates the claim: it is
	// asked for, and does not exist yet.
	CreateClaim bool
}

// jobFailure is why Job j failed, "" when it has not.
func jobFailure(j *batchv1.Job) string {
	for _, c := range j.Status.Conditions {
		if c.Type == batchv1.JobFailed && c.Status == corev1.ConditionTrue {
			return strings.TrimSuffix(fmt.Sprintf("%s: %s", c.Reason, c.Message), ": ")
		}
	}
	return ""
}

// podWaiting says why pod does not run yet, as `kubectl describe` would:
// it cannot be scheduled (its claim does not bind, say), or a container
// waits (a Secret missing, an image that cannot be pulled); "" when
// nothing keeps it.
func podWaiting(pod *corev1.Pod) string {
	if pod.Status.Phase != corev1.PodPending {
		return ""
	}
	for _, c := range pod.Status.ContainerStatuses {
		if w := c.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" && w.Reason != "PodInitializing" {
			return strings.TrimSuffix(w.Reason+": "+w.Message, ": ")
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason != "" {
			return strings.TrimSuffix(c.Reason+": "+c.Message, ": ")
		}
	}
	return ""
}

// claimProblem says why GuestRestore g cannot restore into claim pvc (nil:
// none of that name exists), "" when it can; create is whether g asks
// for a new claim.
func claimProblem(g *v1alpha1.GuestRestore, pvc *corev1.PersistentVolumeClaim, create bool) string {
	name, _ := ClaimOf(g)
	switch {
	case pvc == nil && !create:
		return fmt.Sprintf("PersistentVolumeClaim %s does not exist in namespace %s: create it, or set spec.target.persistentVolumeClaim.size for a new one", name, g.Namespace)
	case pvc == nil:
		return ""
	case !create && pvc.Spec.VolumeMode != nil && *pvc.Spec.VolumeMode == corev1.PersistentVolumeBlock:
		return fmt.Sprintf("PersistentVolumeClaim %s is a block volume, which holds no files to restore into: restore into a claim of volumeMode Filesystem, or a new one (size)", name)
	case create && pvc.Labels[LabelRestore] != string(g.UID):
		return fmt.Sprintf("PersistentVolumeClaim %s exists already, and this request asks for a new one of that name: restore into it with spec.target.persistentVolumeClaim.claimName, or name the request otherwise", name)
	case pvc.DeletionTimestamp != nil:
		return fmt.Sprintf("PersistentVolumeClaim %s is being deleted", name)
	}
	return ""
}
