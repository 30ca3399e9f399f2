package kopiaserver

import (
	"slices"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// desireCase is one row of the desire table: observations, and what desire
// must make of them besides decide's conditions (TestDecide).
type desireCase struct {
	name string
	obs  func(*observations)
	// objects are the kinds and names applied, in order.
	objects []string
	// check is what must hold of the desired status.
	check func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus)
	// events are the reasons of the Events recorded on the BSLS, in order.
	events []string
}

// serverObjects are the objects applied whatever the storage and the
// certificate: the server's identity, Service and NetworkPolicy.
var serverObjects = []string{"ServiceAccount main-server", "Role main-server", "RoleBinding main-server", "Service main", "NetworkPolicy main-server"}

// allObjects are serverObjects and the Deployment.
var allObjects = append(slices.Clone(serverObjects), "Deployment main-server")

// servingTwoNamespaces are the observations of a pass that finds users of
// two namespaces, after a pass that wrote status.namespaces before and
// the conditions this one sets.
func servingTwoNamespaces(before int32) func(*observations) {
	return func(o *observations) {
		o.Users = users("a@backup", "b@other")
		o.BSLS.Status.Namespaces = before
		o.BSLS.Status.Conditions = steady(*o)
	}
}

// serverAvailableIs checks that the status's ServerAvailable has reason.
func serverAvailableIs(reason string) func(*testing.T, v1alpha1.BackupStorageLocationServerStatus) {
	return func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
		if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionServerAvailable); c == nil || c.Reason != reason {
			t.Errorf("ServerAvailable %v, want %s", c, reason)
		}
	}
}

var desireCases = []desireCase{
	{
		name:    "storage and certificate in place: the Deployment too, and the certificate's CA in status",
		objects: allObjects,
		check: func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
			if st.TLSCA != "ca" || st.TLSFingerprint != "pin" {
				t.Errorf("tlsCA %q, tlsFingerprint %q, want the certificate's", st.TLSCA, st.TLSFingerprint)
			}
			if st.Endpoint != "https://backup.example.com" || st.ObservedGeneration != 3 {
				t.Errorf("endpoint %q, observedGeneration %d", st.Endpoint, st.ObservedGeneration)
			}
			if st.RepositoryOpened != nil {
				t.Errorf("repositoryOpened %v before any server pod opened it", st.RepositoryOpened)
			}
		},
		// A first CA is no change: no CAChanged.
		events: []string{ReasonCertificateIssued, ReasonStorageResolved, ReasonServerStarting, ReasonWaitingForServer, ReasonStorageNotChecked, ReasonNotMeasured, ReasonNotVerified, ReasonNotReady},
	},
	{
		name: "a storage problem: no Deployment applied; the existing one runs on",
		obs: func(o *observations) {
			o.RepositoryProblem = &problem{ReasonClaimNotFound, "no claim"}
			o.Deployment = deployment(1, 1)
		},
		objects: serverObjects,
		check:   serverAvailableIs(ReasonServerAvailable),
		events:  []string{ReasonCertificateIssued, ReasonClaimNotFound, ReasonServerAvailable, ReasonUsersSynced, ReasonStorageNotChecked, ReasonNotMeasured, ReasonNotVerified, ReasonNotReady},
	},
	{
		name: "a certificate problem: no Deployment, and the CA guests trust stays in status",
		obs: func(o *observations) {
			o.Certificate, o.CertificateProblem = nil, &problem{ReasonTLSSecretNotFound, "no Secret"}
			o.BSLS.Status.TLSCA, o.BSLS.Status.TLSFingerprint = "old ca", "old pin"
		},
		objects: serverObjects,
		check: func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
			if st.TLSCA != "old ca" || st.TLSFingerprint != "old pin" {
				t.Errorf("tlsCA %q, tlsFingerprint %q, want the previous pass's", st.TLSCA, st.TLSFingerprint)
			}
		},
		events: []string{ReasonTLSSecretNotFound, ReasonStorageResolved, ReasonWaitingForPrerequisites, ReasonWaitingForServer, ReasonStorageNotChecked, ReasonNotMeasured, ReasonNotVerified, ReasonNotReady},
	},
	{
		name: "another CA than the previous pass's: CAChanged, before the transitions",
		obs: func(o *observations) {
			o.BSLS.Status.TLSFingerprint = "old pin"
			o.BSLS.Status.Conditions = steady(*o)
		},
		objects: allObjects,
		check: func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
			if st.TLSFingerprint != "pin" {
				t.Errorf("tlsFingerprint %q, want the new CA's", st.TLSFingerprint)
			}
		},
		events: []string{ReasonCAChanged},
	},
	{
		name: "a server pod opened the repository: repositoryOpened is now, once",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("vm@backup")
		},
		objects: allObjects,
		check: func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
			if st.RepositoryOpened == nil || !st.RepositoryOpened.Time.Equal(decideNow) {
				t.Errorf("repositoryOpened %v, want %s", st.RepositoryOpened, decideNow)
			}
			if st.Users != 1 || st.Namespaces != 1 {
				t.Errorf("users %d, namespaces %d, want 1 and 1", st.Users, st.Namespaces)
			}
		},
		events: []string{ReasonCertificateIssued, ReasonRepositoryOpened, ReasonServerAvailable, ReasonUsersSynced, ReasonStorageNotChecked, ReasonNotMeasured, ReasonNotVerified, ReasonReady},
	},
	{
		name: "opened before: repositoryOpened keeps its time",
		obs: func(o *observations) {
			opened(o.BSLS)
			o.Deployment = deployment(1, 1)
			o.BSLS.Status.Conditions = steady(*o)
		},
		objects: allObjects,
		check: func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
			if want := decideNow.Add(-time.Hour); st.RepositoryOpened == nil || !st.RepositoryOpened.Time.Equal(want) {
				t.Errorf("repositoryOpened %v, want %s", st.RepositoryOpened, want)
			}
		},
	},
	{
		name:    "VMs of a second namespace: SharedAcrossNamespaces, once",
		obs:     servingTwoNamespaces(1),
		objects: allObjects,
		check: func(t *testing.T, st v1alpha1.BackupStorageLocationServerStatus) {
			if st.Namespaces != 2 {
				t.Errorf("namespaces %d, want 2", st.Namespaces)
			}
		},
		events: []string{ReasonSharedAcrossNamespaces},
	},
	{
		name:    "shared already: no Event again",
		obs:     servingTwoNamespaces(2),
		objects: allObjects,
	},
	{
		name: "spec.replicas 0: ScaledToZero at once, as the apply leaves the Deployment",
		obs: func(o *observations) {
			o.BSLS.Spec.Replicas = ptr.To[int32](0)
			o.Deployment = deployment(1, 1)
		},
		objects: allObjects,
		check:   serverAvailableIs(ReasonScaledToZero),
		events:  []string{ReasonCertificateIssued, ReasonStorageResolved, ReasonScaledToZero, ReasonWaitingForServer, ReasonStorageNotChecked, ReasonNotMeasured, ReasonNotVerified, ReasonNotReady},
	},
}

// steady are the conditions a pass over o writes, as the previous pass's:
// a pass that changes none of them records no transition.
func steady(o observations) []metav1.Condition {
	o.BSLS = o.BSLS.DeepCopy()
	o.BSLS.Status.Conditions = nil
	want, err := desire(o)
	if err != nil {
		panic(err)
	}
	return want.Status.Conditions
}

func TestDesire(t *testing.T) {
	for _, tc := range desireCases {
		t.Run(tc.name, func(t *testing.T) {
			obs := observations{BSLS: decideBSLS(), Now: decideNow, Certificate: issued(decideNow.Add(40 * 24 * time.Hour)), ControllerNamespace: "guestbackup-system", Workload: WorkloadInputs{Image: "guestbackup:test"}}
			obs.BSLS.Spec.ClientURL = "https://backup.example.com"
			if tc.obs != nil {
				tc.obs(&obs)
			}
			before := obs.BSLS.DeepCopy()
			want, err := desire(obs)
			if err != nil {
				t.Fatal(err)
			}
			if !equalBSLS(before, obs.BSLS) || before.Status.TLSFingerprint != obs.BSLS.Status.TLSFingerprint {
				t.Errorf("desire changed the BSLS it was given")
			}

			var objects []string
			for _, obj := range want.Objects {
				objects = append(objects, obj.GetObjectKind().GroupVersionKind().Kind+" "+obj.GetName())
				if obj.GetNamespace() != "backup" {
					t.Errorf("%s in namespace %q, want the BSLS's", obj.GetName(), obj.GetNamespace())
				}
			}
			if !slices.Equal(objects, tc.objects) {
				t.Errorf("objects %v, want %v", objects, tc.objects)
			}
			if d := deploymentOf(want.Objects); d != nil && d.Spec.Template.Annotations[AnnotationTLSChecksum] != "checksum" {
				t.Errorf("the Deployment's pod template %v does not carry the certificate's checksum", d.Spec.Template.Annotations)
			}

			for _, c := range want.Conditions {
				got := meta.FindStatusCondition(want.Status.Conditions, c.Type)
				if got == nil || got.Status != c.Status || got.Reason != c.Reason || got.Message != c.Message {
					t.Errorf("status condition %v, want decide's %v", got, c)
				} else if got.LastTransitionTime.IsZero() {
					t.Errorf("%s: no lastTransitionTime", c.Type)
				}
			}
			if tc.check != nil {
				tc.check(t, want.Status)
			}

			var events []string
			for _, e := range want.Events {
				events = append(events, e.Reason)
				if e.Message == "" || (e.Type != corev1.EventTypeNormal && e.Type != corev1.EventTypeWarning) {
					t.Errorf("Event %+v", e)
				}
			}
			if !slices.Equal(events, tc.events) {
				t.Errorf("Events %v, want %v", events, tc.events)
			}
		})
	}
}

// deploymentOf is the Deployment among objs, if any.
func deploymentOf(objs []client.Object) *appsv1.Deployment {
	for _, obj := range objs {
		if d, ok := obj.(*appsv1.Deployment); ok {
			return d
		}
	}
	return nil
}
