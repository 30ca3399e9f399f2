package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/cluster"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// clusterBootTimeout bounds the guest's boot to power-off on the cluster.
const clusterBootTimeout = 15 * time.Minute

// demoCluster narrates the product on real KubeVirt on the test bed's real
// node: KubeVirt installed from its operator, guestbackup by helm, and a VM
// started by its runStrategy, which KubeVirt's virt-handler and
// virt-launcher boot under QEMU in a pod; its guest connects to the BSLS's
// server pod and snapshots. Nothing is played but the Service routing a
// cluster's kube-proxy would do (testbed.Node.ServiceProxy).
func demoCluster(ctx context.Context, r *run) error {
	start := time.Now()
	r.logger()
	r.step("Building guestbackup's image, starting a cluster with one real node (kube-apiserver, kube-scheduler, kube-controller-manager, a kubelet and containerd), " +
		"cert-manager's controllers in this process; then, as an admin: KubeVirt's operator manifest and a KubeVirt CR (useEmulation: no KVM here), " +
		"`helm install guestbackup charts/guestbackup`, and BackupStorageLocationServer " + bslsNamespace + "/main on a local volume")
	cb, err := cluster.Start(r, cluster.Options{
		Tag: "demo", BSLSNamespace: bslsNamespace, Namespaces: []string{vmNamespace},
		NamespaceLabels: map[string]string{"guestbackup.io/allowed": "true"},
	})
	if err != nil {
		return err
	}
	c := cb.Client
	var pods corev1.PodList
	if err := c.List(ctx, &pods); err != nil {
		return err
	}
	for _, p := range pods.Items {
		r.say("real pod %s/%s (%s)", p.Namespace, p.Name, p.Status.Phase)
	}
	r.say("KubeVirt %s is Available; the BSLS is Ready at %s (its Service, reached through the test bed's stand-in for kube-proxy), TLS fingerprint %s",
		cb.Images.Version, cb.BSLS.Status.Endpoint, cb.BSLS.Status.TLSFingerprint)
	r.done()

	r.step("Owner: creating VirtualMachine %s/%s with annotations %s=%s/main and %s=/srv/data, and their own cloud-config; then starting it (runStrategy Once)",
		vmNamespace, vmName, v1alpha1.AnnotationServer, bslsNamespace, v1alpha1.AnnotationPaths)
	vm := ownersVM(cb.BSLS)
	vm.Spec.RunStrategy = ptr.To(kubevirtv1.RunStrategyHalted)
	vm.Spec.Template.Spec.Domain.Devices.Interfaces = []kubevirtv1.Interface{{
		Name: "default", InterfaceBindingMethod: kubevirtv1.InterfaceBindingMethod{Masquerade: &kubevirtv1.InterfaceMasquerade{}},
	}}
	vm.Spec.Template.Spec.Networks = []kubevirtv1.Network{{Name: "default", NetworkSource: kubevirtv1.NetworkSource{Pod: &kubevirtv1.PodNetwork{}}}}
	testbed.ClusterGuest(vm, cb.Images)
	if err := c.Create(ctx, vm); err != nil {
		return fmt.Errorf("create the VirtualMachine: %w", err)
	}
	r.say("KubeVirt's virt-handler and virt-launcher boot its guest under QEMU (software emulation: several minutes); its serial console is read through virt-api")
	boot, err := testbed.BootVM(ctx, c, cb.Node, client.ObjectKeyFromObject(vm), clusterBootTimeout)
	if err != nil {
		return err
	}
	var seen []string
	for _, p := range boot.Processes {
		if p.UnderShim {
			seen = append(seen, p.Command)
		}
	}
	r.say("the guest ran %v from Running to power-off, in processes containerd's shims started: %s", boot.Elapsed.Round(time.Second), strings.Join(seen, ", "))
	r.done()

	r.step("The guest's own words, from its serial console")
	for _, m := range demoLine.FindAllStringSubmatch(boot.Console, -1) {
		r.say("guest: %s", m[1])
	}
	r.done()

	if err := sayEvents(ctx, r, c); err != nil {
		return err
	}
	fmt.Fprintf(r.out, "\nReal: KubeVirt's operator, virt-api, virt-controller, virt-handler, virt-launcher, libvirt and QEMU in pods; guestbackup's controller, webhook and server in pods. "+
		"In this process: cert-manager. The whole demo took %v; stopping everything.\n", time.Since(start).Round(time.Second))
	return nil
}
