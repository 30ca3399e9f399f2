package requests_test

import (
	"context"
	"fmt"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

var seq int

// snapshot is a GuestSnapshot of VM vm in namespace.
func snapshot(namespace, vm string) *v1alpha1.GuestSnapshot {
	seq++
	return &v1alpha1.GuestSnapshot{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("snap-%d", seq), Namespace: namespace}, Spec: v1alpha1.GuestSnapshotSpec{VM: vm}}
}

// restore is a GuestRestore of /etc/nginx into VM vm in namespace.
func restore(namespace, vm string) *v1alpha1.GuestRestore {
	seq++
	return &v1alpha1.GuestRestore{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("restore-%d", seq), Namespace: namespace},
		Spec: v1alpha1.GuestRestoreSpec{VM: vm, Paths: []string{"/etc/nginx"}}}
}

// forged is a requester no tenant is.
func forged() *v1alpha1.Requester {
	return &v1alpha1.Requester{Username: "system:admin", UID: "0", Groups: []string{"system:masters"}, Extra: map[string][]string{"forged": {"yes"}}}
}

// deniedBy matches the webhook's denial of a request, saying what to fix.
func deniedBy(message string) types.GomegaMatcher {
	return MatchError(And(
		ContainSubstring(`admission webhook "requests.guestbackup.io" denied the request`),
		ContainSubstring(message)))
}

// forbidden matches RBAC's refusal.
func forbidden() types.GomegaMatcher {
	return Satisfy(apierrors.IsForbidden)
}

// stampedAlice is the requester the webhook stamps for alice.
func stampedAlice(r *v1alpha1.Requester) {
	GinkgoHelper()
	Expect(r).NotTo(BeNil(), "the webhook stamps every request")
	Expect(r.Username).To(Equal(alice))
	Expect(r.UID).To(BeEmpty())
	Expect(r.Groups).To(ConsistOf(alicesGroup, "system:authenticated"))
	Expect(r.Extra).To(BeEmpty())
}

var _ = Describe("A request's requester", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("is who created it, whatever the client forged into it", func() {
		s := snapshot(teamA, "web")
		s.Spec.Requester = forged()
		Expect(asAlice.Create(ctx, s)).To(Succeed())
		got := &v1alpha1.GuestSnapshot{}
		Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(s), got)).To(Succeed())
		stampedAlice(got.Spec.Requester)
		Expect(got.Spec.VM).To(Equal("web"), "nothing else of the request changes")

		r := restore(teamA, "web")
		r.Spec.Requester = forged()
		Expect(asAlice.Create(ctx, r)).To(Succeed())
		gotRestore := &v1alpha1.GuestRestore{}
		Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(r), gotRestore)).To(Succeed())
		stampedAlice(gotRestore.Spec.Requester)
	})

	It("is stamped on a request that named none", func() {
		s := snapshot(teamA, "web")
		Expect(asAlice.Create(ctx, s)).To(Succeed())
		stampedAlice(s.Spec.Requester)
	})

	It("never changes afterwards, nor does the spec: not by its tenant, not even by whoever may update requests", func() {
		s := snapshot(teamA, "web")
		Expect(asAlice.Create(ctx, s)).To(Succeed())

		By("refusing the tenant any update: the built-in roles create and delete requests, never change them")
		edited := s.DeepCopy()
		edited.Spec.Requester = forged()
		Expect(asAlice.Update(ctx, edited)).To(forbidden())
		Expect(asAlice.Patch(ctx, edited, client.MergeFrom(s))).To(forbidden())
		Expect(asAlice.Status().Update(ctx, edited)).To(forbidden())

		By("refusing a change of the spec to a user who holds update")
		for what, edit := range map[string]func(*v1alpha1.GuestSnapshot){
			"the requester": func(s *v1alpha1.GuestSnapshot) { s.Spec.Requester = forged() },
			"its groups": func(s *v1alpha1.GuestSnapshot) {
				s.Spec.Requester.Groups = append(s.Spec.Requester.Groups, "system:masters")
			},
			"the VM":    func(s *v1alpha1.GuestSnapshot) { s.Spec.VM = "db" },
			"the paths": func(s *v1alpha1.GuestSnapshot) { s.Spec.Paths = []string{"/root"} },
		} {
			changed := s.DeepCopy()
			edit(changed)
			err := api.Client.Update(ctx, changed)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "changing %s: want Invalid, got %v", what, err)
			Expect(err.Error()).To(ContainSubstring("a GuestSnapshot's spec cannot change: a request is one-shot; create a new GuestSnapshot instead"))
		}
		got := &v1alpha1.GuestSnapshot{}
		Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(s), got)).To(Succeed())
		stampedAlice(got.Spec.Requester)

		r := restore(teamA, "web")
		Expect(asAlice.Create(ctx, r)).To(Succeed())
		changed := r.DeepCopy()
		changed.Spec.Requester.Username = "bob"
		err := api.Client.Update(ctx, changed)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("a GuestRestore's spec cannot change"))
	})
})

var _ = Describe("A tenant's request", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("never reaches another namespace's VM", func() {
		By("refusing a request in the other namespace: RBAC")
		Expect(asAlice.Create(ctx, snapshot(teamB, "secret"))).To(forbidden())
		Expect(asAlice.Create(ctx, restore(teamB, "secret"))).To(forbidden())

		By("refusing a request that names the other namespace's VM")
		Expect(asAlice.Create(ctx, snapshot(teamA, "team-b/secret"))).To(
			deniedBy(`spec.vm: "team-b/secret" names a VM of another namespace, which a request can never reach`))
		Expect(asAlice.Create(ctx, snapshot(teamA, "secret@team-b"))).To(
			deniedBy(`spec.vm: "secret@team-b" names a VM of another namespace`))
		Expect(asAlice.Create(ctx, snapshot(teamA, "secret"))).To(
			deniedBy("spec.vm: no VirtualMachine secret in namespace team-a: name a VM of this request's namespace"))
		Expect(asAlice.Create(ctx, restore(teamA, "secret"))).To(
			deniedBy("spec.vm: no VirtualMachine secret in namespace team-a"))

		By("refusing a restore from the other namespace's VM")
		r := restore(teamA, "new")
		r.Spec.SourceVM = "team-b/secret"
		Expect(asAlice.Create(ctx, r)).To(deniedBy(`spec.sourceVM: "team-b/secret" names a VM of another namespace`))
	})

	It("restores from another VM of the namespace only under that VM's restore-from grant", func() {
		r := restore(teamA, "db")
		r.Spec.SourceVM = "web"
		Expect(asAlice.Create(ctx, r)).To(deniedBy(
			"spec.sourceVM: VirtualMachine db may not read the snapshots of web: annotate it with guestbackup.io/restore-from=web to grant it"))

		r = restore(teamA, "new")
		r.Spec.SourceVM = "web"
		Expect(asAlice.Create(ctx, r)).To(deniedBy(
			"spec.sourceVM: VirtualMachine new may not read the snapshots of web"), "new's grant names old, not web")

		r = restore(teamA, "new")
		r.Spec.SourceVM = "old"
		Expect(asAlice.Create(ctx, r)).To(Succeed(), "new's grant names old, deleted")
	})

	It("is refused for a VM that is not opted in", func() {
		s := snapshot(teamA, "plain")
		s.Spec.Paths = []string{"/etc"}
		Expect(asAlice.Create(ctx, s)).To(deniedBy(
			"spec.vm: VirtualMachine plain is not opted in to guestbackup: annotate it with guestbackup.io/server=<namespace>/<server> first"))
		Expect(asAlice.Create(ctx, restore(teamA, "plain"))).To(deniedBy("VirtualMachine plain is not opted in"))
	})

	DescribeTable("is refused, saying what to fix, when it cannot be carried out",
		func(edit func(*v1alpha1.GuestRestore), message string) {
			r := restore(teamA, "web")
			edit(r)
			Expect(asAlice.Create(ctx, r)).To(deniedBy(message))
		},
		Entry("a path that climbs", func(r *v1alpha1.GuestRestore) { r.Spec.Paths = []string{"/etc/../root/.ssh"} },
			`spec.paths[0]: "/etc/../root/.ssh" contains "..": name the path itself, without ..`),
		Entry("a relative path", func(r *v1alpha1.GuestRestore) { r.Spec.Paths = []string{"etc/nginx"} },
			`spec.paths[0]: "etc/nginx" is not absolute`),
		Entry("a folder that climbs", func(r *v1alpha1.GuestRestore) { r.Spec.Target.Directory = "/srv/../etc" },
			`spec.target.directory: "/srv/../etc" contains ".."`),
		Entry("the guest's root as a folder", func(r *v1alpha1.GuestRestore) { r.Spec.Target.Directory = "/" },
			`spec.target.directory: "/" restores over the guest's own files: set target.inPlace to mean that`),
		Entry("a time to come", func(r *v1alpha1.GuestRestore) {
			r.Spec.Snapshot.Before = &metav1.Time{Time: time.Now().Add(48 * time.Hour)}
		}, "is in the future: give a time in the past (RFC 3339)"),
		Entry("a claim of another namespace", func(r *v1alpha1.GuestRestore) {
			r.Spec.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "team-b/data"}
		}, `spec.target.persistentVolumeClaim.claimName: "team-b/data" is not a claim name`),
	)

	It("is refused, saying what to fix, when its time is no time", func() {
		r := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.GroupVersion.String(), "kind": "GuestRestore",
			"metadata": map[string]any{"name": "at-a-bad-time", "namespace": teamA},
			"spec":     map[string]any{"vm": "web", "paths": []any{"/etc/nginx"}, "snapshot": map[string]any{"before": "yesterday"}},
		}}
		Expect(asAlice.Create(ctx, r)).To(deniedBy(
			`spec.snapshot.before: "yesterday" is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z`))
	})

	It("is admitted in every allowed form", func() {
		for _, edit := range []func(*v1alpha1.GuestRestore){
			func(*v1alpha1.GuestRestore) {},
			func(r *v1alpha1.GuestRestore) { r.Spec.Target.InPlace = true; r.Spec.Snapshot.ID = "k0123abcd" },
			func(r *v1alpha1.GuestRestore) {
				r.Spec.Target.Directory = "/srv/restored"
				r.Spec.Snapshot.Before = &yesterday
			},
			func(r *v1alpha1.GuestRestore) {
				r.Spec.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
				r.Spec.DryRun = true
			},
		} {
			r := restore(teamA, "web")
			edit(r)
			Expect(asAlice.Create(ctx, r)).To(Succeed())
		}
		s := snapshot(teamA, "db")
		s.Spec.Paths, s.Spec.Tags, s.Spec.Description = []string{"/var/lib/postgresql"}, map[string]string{"reason": "upgrade"}, "before the upgrade"
		Expect(asAlice.Create(ctx, s)).To(Succeed())
		Expect(asAlice.Create(ctx, snapshot(teamA, "db"))).To(deniedBy(
			"spec.paths: empty, and VirtualMachine db has no annotation guestbackup.io/paths to take them from"))
	})
})

var _ = Describe("The built-in roles", func() {
	var ctx context.Context
	BeforeEach(func() { ctx = context.Background() })

	It("let view read a namespace's requests, and never create or delete one", func() {
		s := snapshot(teamA, "web")
		Expect(asAlice.Create(ctx, s)).To(Succeed())

		Expect(asCarol.Get(ctx, client.ObjectKeyFromObject(s), &v1alpha1.GuestSnapshot{})).To(Succeed())
		Expect(asCarol.List(ctx, &v1alpha1.GuestSnapshotList{}, client.InNamespace(teamA))).To(Succeed())
		Expect(asCarol.List(ctx, &v1alpha1.GuestRestoreList{}, client.InNamespace(teamA))).To(Succeed())
		Expect(asCarol.Create(ctx, snapshot(teamA, "web"))).To(forbidden())
		Expect(asCarol.Create(ctx, restore(teamA, "web"))).To(forbidden())
		Expect(asCarol.Delete(ctx, s)).To(forbidden())
		Expect(asCarol.List(ctx, &v1alpha1.GuestSnapshotList{}, client.InNamespace(teamB))).To(forbidden())
	})

	It("let edit create, read and delete requests in its namespace only", func() {
		s := snapshot(teamB, "secret")
		Expect(asBob.Create(ctx, s)).To(Succeed())
		Expect(asBob.Get(ctx, client.ObjectKeyFromObject(s), &v1alpha1.GuestSnapshot{})).To(Succeed())
		Expect(asAlice.Get(ctx, client.ObjectKeyFromObject(s), &v1alpha1.GuestSnapshot{})).To(forbidden())
		Expect(asAlice.Delete(ctx, s)).To(forbidden())
		Expect(asBob.Delete(ctx, s)).To(Succeed())
	})
})
