package kubevirt

import (
	"context"
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/jsonmergepatch"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/test/story"
)

// lastApplied is the annotation kubectl apply keeps the applied manifest in.
const lastApplied = "kubectl.kubernetes.io/last-applied-configuration"

// manifest is vm as its owner keeps it in Git: no status, no server fields.
func manifest(vm *kubevirtv1.VirtualMachine) map[string]any {
	GinkgoHelper()
	vm = vm.DeepCopy()
	vm.TypeMeta.APIVersion, vm.TypeMeta.Kind = kubevirtv1.GroupVersion.String(), "VirtualMachine"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(vm)
	Expect(err).NotTo(HaveOccurred())
	delete(m, "status")
	unstructured.RemoveNestedField(m, "metadata", "creationTimestamp")
	unstructured.RemoveNestedField(m, "spec", "template", "metadata", "creationTimestamp")
	return m
}

// gitopsSpecs: GitOps tools apply the owner's manifest again and again
// (docs/design.md, decision 17): each apply must converge to one VM that
// carries its bootstrap once, with the owner's own cloud-init, and issue
// nothing new. They run on a tenant (team-g, backup-g/main) of the bed
// shared.
func gitopsSpecs(shared func() *webhookBed) bool {
	return Describe("Re-applying the owner's manifest, as GitOps tools do", Ordered, func() {
		var (
			ctx context.Context
			bed *webhookBed
		)

		// kubectlApply is kubectl's client-side apply: a three-way JSON merge
		// patch (custom resources have no strategic merge) of the last
		// applied manifest, the manifest and the live object; the first apply
		// creates the object with the manifest as its last applied.
		kubectlApply := func(m map[string]any) {
			GinkgoHelper()
			original, err := json.Marshal(m)
			Expect(err).NotTo(HaveOccurred())
			modified := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(m)}
			annotations := modified.GetAnnotations()
			annotations[lastApplied] = string(original)
			modified.SetAnnotations(annotations)

			live := &unstructured.Unstructured{}
			live.SetGroupVersionKind(kubevirtv1.VirtualMachineGroupVersionKind)
			if err := bed.api.Client.Get(ctx, bed.key(modified.GetName()), live); err != nil {
				Expect(bed.api.Client.Create(ctx, modified)).To(Succeed())
				return
			}
			modifiedJSON, err := json.Marshal(modified.Object)
			Expect(err).NotTo(HaveOccurred())
			current, err := json.Marshal(live.Object)
			Expect(err).NotTo(HaveOccurred())
			patch, err := jsonmergepatch.CreateThreeWayJSONMergePatch([]byte(live.GetAnnotations()[lastApplied]), modifiedJSON, current)
			Expect(err).NotTo(HaveOccurred())
			Expect(bed.api.Client.Patch(ctx, live, client.RawPatch(types.MergePatchType, patch))).To(Succeed())
		}
		// serverSideApply is what Argo CD (ServerSideApply=true) and Flux do:
		// server-side apply under a field manager of their own.
		serverSideApply := func(m map[string]any, opts ...client.PatchOption) *unstructured.Unstructured {
			GinkgoHelper()
			u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(m)}
			Expect(bed.api.Client.Patch(ctx, u, client.Apply, append([]client.PatchOption{client.FieldOwner("argocd-controller"), client.ForceOwnership}, opts...)...)).To(Succeed())
			return u
		}
		// oneValidVM checks the stored VM as KubeVirt's validation and the
		// guest would see it: one cloud-init volume, reading the VM's own
		// Secret, every disk backed by a volume, the owner's cloud-config in
		// the Secret, and the credentials issued once.
		oneValidVM := func(name string, own string) {
			GinkgoHelper()
			vm := bed.getVM(ctx, name)
			var st v1alpha1.InjectionStatus
			Expect(json.Unmarshal([]byte(vm.Annotations[v1alpha1.AnnotationStatus]), &st)).To(Succeed())
			Expect(st.Secret).To(Equal(mutate.SecretName(name)))
			Expect(st.Generation).To(BeEquivalentTo(1), "no credentials issued again")
			volumes := map[string]bool{}
			cloudInit := 0
			for _, v := range vm.Spec.Template.Spec.Volumes {
				Expect(volumes).NotTo(HaveKey(v.Name), "volume names are unique")
				volumes[v.Name] = true
				if v.CloudInitNoCloud != nil {
					cloudInit++
					Expect(v.CloudInitNoCloud.UserData).To(BeEmpty())
					Expect(v.CloudInitNoCloud.UserDataSecretRef.Name).To(Equal(mutate.SecretName(name)))
				}
			}
			Expect(cloudInit).To(Equal(1), "KubeVirt reads only the first cloud-init volume")
			disks := map[string]bool{}
			for _, d := range vm.Spec.Template.Spec.Domain.Devices.Disks {
				Expect(disks).NotTo(HaveKey(d.Name), "disk names are unique")
				disks[d.Name] = true
				Expect(volumes).To(HaveKey(d.Name), "every disk has a volume")
			}
			s, err := bed.secretOf(ctx, name)()
			Expect(err).NotTo(HaveOccurred())
			Expect(string(s.Data[v1alpha1.SecretKeyGeneration])).To(Equal("1"))
			if own != "" {
				part, err := cloudinit.UserPart(s.Data[v1alpha1.SecretKeyUserData])
				Expect(err).NotTo(HaveOccurred())
				Expect(string(part)).To(Equal(own))
			}
		}

		BeforeAll(func() {
			ctx = context.Background()
			bed = shared().tenant(ctx, "team-g", "backup-g")
		})

		for _, tc := range []struct {
			name, suffix string
			vm           func(string) *kubevirtv1.VirtualMachine
			own          string
		}{
			{"without cloud-init", "plain", func(name string) *kubevirtv1.VirtualMachine { return bed.optIn(story.TypicalVM(name)) }, ""},
			{"with its own inline cloud-config", "own", func(name string) *kubevirtv1.VirtualMachine {
				return withOwnCloudInit(bed.optIn(story.TypicalVM(name)))
			}, ownCloudConfig},
		} {
			// applied applies the manifest of VM name three times with apply,
			// checking each time that it converged.
			applied := func(name string, apply func(map[string]any)) map[string]any {
				GinkgoHelper()
				m := manifest(tc.vm(name))
				for range 3 {
					apply(m)
					oneValidVM(name, tc.own)
				}
				return m
			}

			It("converges with kubectl's client-side apply, for a VM "+tc.name, func() {
				applied("csa-"+tc.suffix, kubectlApply)
			})

			It("converges with server-side apply by another field manager, and a dry run shows no drift, for a VM "+tc.name, func() {
				name := "ssa-" + tc.suffix
				m := applied(name, func(m map[string]any) { serverSideApply(m) })
				live := bed.getVM(ctx, name)
				for _, mf := range live.ManagedFields {
					// KubeVirt's own controller writes the VM too (its finalizer,
					// annotations and status); no other manager does: the
					// webhook has no manager of its own for Argo CD's
					// managedFieldsManagers to name.
					Expect(mf.Manager).To(BeElementOf("argocd-controller", "virt-controller"))
				}
				// Flux and Argo CD's server-side diff: a dry-run apply of the
				// manifest, which the webhook mutates as a real one.
				dry := serverSideApply(m, client.DryRunAll)
				var fromDry kubevirtv1.VirtualMachine
				Expect(runtime.DefaultUnstructuredConverter.FromUnstructured(dry.Object, &fromDry)).To(Succeed())
				Expect(fromDry.Spec).To(Equal(live.Spec), "the dry run's spec is the live one: no drift")
				Expect(fromDry.Annotations[v1alpha1.AnnotationStatus]).To(Equal(live.Annotations[v1alpha1.AnnotationStatus]))
			})
		}
	})
}
