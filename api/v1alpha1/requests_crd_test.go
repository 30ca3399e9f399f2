package v1alpha1_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// These specs prove what the CRDs enforce by themselves, with no webhook
// in front of the API server (the requests' admission is proven in
// pkg/requests).

func newRestore(spec v1alpha1.GuestRestoreSpec) *v1alpha1.GuestRestore {
	nameSeq++
	return &v1alpha1.GuestRestore{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("restore-%d", nameSeq), Namespace: "default"}, Spec: spec}
}

func newSnapshot(spec v1alpha1.GuestSnapshotSpec) *v1alpha1.GuestSnapshot {
	nameSeq++
	return &v1alpha1.GuestSnapshot{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("snapshot-%d", nameSeq), Namespace: "default"}, Spec: spec}
}

var _ = Describe("GuestSnapshot and GuestRestore", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	DescribeTable("are served namespaced, with a status subresource and the owner's printer columns",
		func(name string, columns []string) {
			crd := &apiextensionsv1.CustomResourceDefinition{}
			Expect(apiServer.Client.Get(ctx, client.ObjectKey{Name: name}, crd)).To(Succeed())
			Expect(crd.Spec.Scope).To(Equal(apiextensionsv1.NamespaceScoped))
			Expect(crd.Spec.Names.Categories).To(ConsistOf("guestbackup"))
			Expect(crd.Spec.Versions).To(HaveLen(1))
			version := crd.Spec.Versions[0]
			Expect(version.Subresources.Status).NotTo(BeNil())
			var got []string
			for _, c := range version.AdditionalPrinterColumns {
				if c.Priority == 0 {
					got = append(got, c.Name)
				}
			}
			Expect(got).To(Equal(columns))
		},
		Entry("GuestSnapshot", "guestsnapshots.guestbackup.io", []string{"VM", "Phase", "Snapshot", "Age"}),
		Entry("GuestRestore", "guestrestores.guestbackup.io", []string{"VM", "Phase", "Snapshot", "Age"}),
	)

	It("keeps a GuestSnapshot's spec, the requester included, as it was created, and lets its metadata and status change", func() {
		s := newSnapshot(v1alpha1.GuestSnapshotSpec{VM: "web", Paths: []string{"/etc"}, Tags: map[string]string{"why": "upgrade"},
			Requester: &v1alpha1.Requester{Username: "alice", Groups: []string{"team-a"}}})
		Expect(apiServer.Client.Create(ctx, s)).To(Succeed())

		for what, edit := range map[string]func(*v1alpha1.GuestSnapshot){
			"the VM":        func(s *v1alpha1.GuestSnapshot) { s.Spec.VM = "db" },
			"the paths":     func(s *v1alpha1.GuestSnapshot) { s.Spec.Paths = nil },
			"the requester": func(s *v1alpha1.GuestSnapshot) { s.Spec.Requester.Username = "bob" },
			"its groups": func(s *v1alpha1.GuestSnapshot) {
				s.Spec.Requester.Groups = append(s.Spec.Requester.Groups, "system:masters")
			},
			"no requester": func(s *v1alpha1.GuestSnapshot) { s.Spec.Requester = nil },
		} {
			changed := s.DeepCopy()
			edit(changed)
			err := apiServer.Client.Update(ctx, changed)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "changing %s: want Invalid, got %v", what, err)
			Expect(err.Error()).To(ContainSubstring("a GuestSnapshot's spec cannot change: a request is one-shot; create a new GuestSnapshot instead"))
		}

		labelled := s.DeepCopy()
		labelled.Labels = map[string]string{"team": "a"}
		labelled.Finalizers = []string{"guestbackup.io/request"}
		Expect(apiServer.Client.Update(ctx, labelled)).To(Succeed())
		labelled.Status = v1alpha1.GuestSnapshotStatus{Phase: v1alpha1.PhaseSucceeded, Snapshots: []v1alpha1.PathSnapshot{{Path: "/etc", ID: "k0123"}}}
		Expect(apiServer.Client.Status().Update(ctx, labelled)).To(Succeed())
		Expect(labelled.Generation).To(Equal(s.Generation), "metadata and status do not change the request")
		labelled.Finalizers = nil
		Expect(apiServer.Client.Update(ctx, labelled)).To(Succeed())
	})

	It("keeps a GuestRestore's spec as it was created", func() {
		r := newRestore(v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/nginx"}, Requester: &v1alpha1.Requester{Username: "alice"}})
		Expect(apiServer.Client.Create(ctx, r)).To(Succeed())
		changed := r.DeepCopy()
		changed.Spec.Target.InPlace = true
		err := apiServer.Client.Update(ctx, changed)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("a GuestRestore's spec cannot change: a request is one-shot; create a new GuestRestore instead"))
	})

	DescribeTable("rejects a GuestRestore outside the allowed forms with a message that says what to fix",
		func(spec v1alpha1.GuestRestoreSpec, message string) {
			err := apiServer.Client.Create(ctx, newRestore(spec))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},
		Entry("no path", v1alpha1.GuestRestoreSpec{VM: "web"}, "spec.paths"),
		Entry("an ID and a time", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc"},
			Snapshot: v1alpha1.SnapshotSelector{ID: "k0123", Before: &metav1.Time{Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}},
			"choose the snapshot by snapshot.id or by snapshot.before, not both; set neither for the latest"),
		Entry("in place and a folder", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc"},
			Target: v1alpha1.RestoreTarget{InPlace: true, Directory: "/srv/restored"}},
			"set at most one of target.directory, target.inPlace and target.persistentVolumeClaim"),
		Entry("in place and a claim", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc"},
			Target: v1alpha1.RestoreTarget{InPlace: true, PersistentVolumeClaim: &v1alpha1.RestoreClaim{ClaimName: "data"}}},
			"set at most one of target.directory, target.inPlace and target.persistentVolumeClaim"),
		Entry("a claim neither named nor sized", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc"},
			Target: v1alpha1.RestoreTarget{PersistentVolumeClaim: &v1alpha1.RestoreClaim{}}},
			"set persistentVolumeClaim.claimName to restore into an existing claim, or persistentVolumeClaim.size to create one"),
		Entry("a claim both named and sized", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc"},
			Target: v1alpha1.RestoreTarget{PersistentVolumeClaim: &v1alpha1.RestoreClaim{ClaimName: "data", Size: ptr.To(resource.MustParse("1Gi"))}}},
			"set persistentVolumeClaim.claimName to restore into an existing claim, or persistentVolumeClaim.size to create one"),
		Entry("a storage class for an existing claim", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc"},
			Target: v1alpha1.RestoreTarget{PersistentVolumeClaim: &v1alpha1.RestoreClaim{ClaimName: "data", StorageClassName: ptr.To("fast")}}},
			"persistentVolumeClaim.storageClassName applies only to a claim created with size"),
		Entry("a history that is not a dry run", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/hosts"}, History: true},
			"history lists the versions of one path across snapshots: set dryRun too"),
		Entry("a history of two paths", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/hosts", "/etc/fstab"}, DryRun: true, History: true},
			"history lists the versions of one path across snapshots: set dryRun too, name exactly one path"),
		Entry("a history of one snapshot", v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/hosts"}, DryRun: true, History: true,
			Snapshot: v1alpha1.SnapshotSelector{ID: "k0123"}},
			"and no snapshot.id (snapshot.before bounds the snapshots listed)"),
	)

	It("admits a history of one path, bounded by a time or not", func() {
		Expect(apiServer.Client.Create(ctx, newRestore(v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/hosts"}, DryRun: true, History: true}))).To(Succeed())
		Expect(apiServer.Client.Create(ctx, newRestore(v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/hosts"}, DryRun: true, History: true,
			Snapshot: v1alpha1.SnapshotSelector{Before: &metav1.Time{Time: time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)}}}))).To(Succeed())
	})

	It("rejects a GuestSnapshot tag that Kopia could not carry", func() {
		err := apiServer.Client.Create(ctx, newSnapshot(v1alpha1.GuestSnapshotSpec{VM: "web", Tags: map[string]string{"why:now": "x"}}))
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("a tag's key is 1-63 letters, digits"))
	})
})
