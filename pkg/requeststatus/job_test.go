package requeststatus

import (
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/restorejob"
)

// A restore Job passes the restricted Pod Security standard, as Kubernetes's
// own admission evaluates it, with a fixed group or none (OpenShift); it
// carries the VM's password only by reference to the VM's Secret, is owned
// by its request, and writes into the claim named.
func TestRestoreJob(t *testing.T) {
	evaluator, err := policy.NewEvaluator(policy.DefaultChecks())
	if err != nil {
		t.Fatal(err)
	}
	g := restoreOf(v1alpha1.PhasePending, func(s *v1alpha1.GuestRestoreSpec) {
		s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
	})
	srv := server.DeepCopy()
	srv.Status.Endpoint, srv.Status.TLSCA = "https://main.backup.svc:51515", "-----BEGIN CERTIFICATE-----\n..."
	srv.Status.Client = &v1alpha1.ClientStatus{URL: "https://main.backup.svc:51516"}
	for _, assigned := range []bool{false, true} {
		job := RestoreJob(g, srv, "guestbackup:dev", assigned)
		spec := job.Spec.Template.Spec
		for _, r := range evaluator.EvaluatePod(api.LevelVersion{Level: api.LevelRestricted, Version: api.LatestVersion()}, &job.Spec.Template.ObjectMeta, &spec) {
			if !r.Allowed {
				t.Errorf("platform assigns IDs %v: restricted refuses it: %s: %s", assigned, r.ForbiddenReason, r.ForbiddenDetail)
			}
		}
		if spec.SecurityContext.FSGroup != nil {
			t.Errorf("platform assigns IDs %v: fsGroup %v on an existing claim, whose every file's group the kubelet would change", assigned, *spec.SecurityContext.FSGroup)
		}
		fresh := g.DeepCopy()
		fresh.Spec.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("1Gi"))}
		if got := RestoreJob(fresh, srv, "guestbackup:dev", assigned).Spec.Template.Spec.SecurityContext.FSGroup; (got != nil) == assigned {
			t.Errorf("platform assigns IDs %v: fsGroup %v on a claim the controller creates", assigned, got)
		}
		if p := job.Spec.PodFailurePolicy; p == nil || len(p.Rules) != 1 || p.Rules[0].Action != batchv1.PodFailurePolicyActionFailJob {
			t.Errorf("pod failure policy %+v: a configuration error is not tried again", p)
		}
		if spec.SecurityContext.RunAsUser != nil || spec.SecurityContext.RunAsGroup != nil {
			t.Error("a fixed user or group, which OpenShift's restricted SCCs refuse: the image's user applies")
		}
		if ptr.Deref(spec.AutomountServiceAccountToken, true) {
			t.Error("the Job's pod gets a service account token it never uses")
		}
		if len(job.OwnerReferences) != 1 || job.OwnerReferences[0].UID != g.UID || !ptr.Deref(job.OwnerReferences[0].Controller, false) {
			t.Errorf("owners %+v, want the request alone", job.OwnerReferences)
		}
		env := map[string]corev1.EnvVar{}
		for _, e := range spec.Containers[0].Env {
			env[e.Name] = e
			if strings.Contains(e.Value, "password") {
				t.Errorf("env %s holds a password", e.Name)
			}
		}
		if ref := env[restorejob.EnvPassword].ValueFrom; ref == nil || ref.SecretKeyRef == nil || ref.SecretKeyRef.Name != "web-guestbackup" || ref.SecretKeyRef.Key != v1alpha1.SecretKeyPassword || env[restorejob.EnvPassword].Value != "" {
			t.Errorf("password %+v, want a reference to the VM's Secret", env[restorejob.EnvPassword])
		}
		for name, want := range map[string]string{restorejob.EnvUser: "web@team-a", restorejob.EnvRequest: uid, restorejob.EnvServerURL: srv.Status.Endpoint,
			restorejob.EnvClientURL: srv.Status.Client.URL, restorejob.EnvCA: srv.Status.TLSCA} {
			if env[name].Value != want {
				t.Errorf("%s=%q, want %q", name, env[name].Value, want)
			}
		}
		if c := spec.Volumes[0].PersistentVolumeClaim; c == nil || c.ClaimName != "data" || c.ReadOnly {
			t.Errorf("volumes %+v, want claim data, writable", spec.Volumes)
		}
	}
}

// A new claim is named after the request, labelled its own, and owned by
// no one: what was restored stays when the request goes. One of that name
// that is not the request's own is refused, saying what to do.
func TestRestoreClaim(t *testing.T) {
	g := restoreOf("", func(s *v1alpha1.GuestRestoreSpec) {
		s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("2Gi")), StorageClassName: ptr.To("fast")}
	})
	pvc := RestoreClaim(g)
	if pvc.Name != "nginx-config" || pvc.Labels[LabelRestore] != uid || len(pvc.OwnerReferences) != 0 || *pvc.Spec.StorageClassName != "fast" ||
		!pvc.Spec.Resources.Requests.Storage().Equal(resource.MustParse("2Gi")) {
		t.Errorf("claim %+v", pvc)
	}
	if p := claimProblem(g, pvc, true); p != "" {
		t.Errorf("its own claim: %s", p)
	}
	other := &corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "nginx-config", Namespace: "team-a"}}
	if p := claimProblem(g, other, true); !strings.Contains(p, "exists already, and this request asks for a new one") {
		t.Errorf("another claim of its name: %q", p)
	}
	named := restoreOf("", func(s *v1alpha1.GuestRestoreSpec) {
		s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
	})
	if p := claimProblem(named, nil, false); !strings.Contains(p, "PersistentVolumeClaim data does not exist in namespace team-a") {
		t.Errorf("a named claim that does not exist: %q", p)
	}
	if p := claimProblem(named, other, false); p != "" {
		t.Errorf("an existing claim named: %q", p)
	}
	block := other.DeepCopy()
	block.Spec.VolumeMode = ptr.To(corev1.PersistentVolumeBlock)
	if p := claimProblem(named, block, false); !strings.Contains(p, "is a block volume, which holds no files") {
		t.Errorf("a block claim: %q", p)
	}
}

// What keeps a restore Job's pod from running, as kubectl describe says it.
func TestPodWaiting(t *testing.T) {
	pending := func(st corev1.PodStatus) *corev1.Pod {
		st.Phase = corev1.PodPending
		return &corev1.Pod{Status: st}
	}
	for name, tt := range map[string]struct {
		pod  *corev1.Pod
		want string
	}{
		"unschedulable": {pending(corev1.PodStatus{Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: "Unschedulable",
			Message: "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims"}}}), "Unschedulable: 0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims"},
		"a Secret missing": {pending(corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason: "CreateContainerConfigError", Message: `secret "web-guestbackup" not found`}}}}}), `CreateContainerConfigError: secret "web-guestbackup" not found`},
		"being created": {pending(corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{
			Reason: "ContainerCreating"}}}}}), ""},
		"running": {&corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning}}, ""},
	} {
		if got := podWaiting(tt.pod); got != tt.want {
			t.Errorf("%s: %q, want %q", name, got, tt.want)
		}
	}
}
