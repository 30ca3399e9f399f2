// Package story holds guestbackup's end-to-end stories with real guests,
// written once against a Bed, so that each backend runs the same specs:
// test/kubevirt runs them on the local test bed (guestbackup's managers in
// the test process, guests under qemu), test/cluster on real KubeVirt on the
// test bed's real node. The package is Ginkgo specs and their fixtures: the
// owners' cloud-configs, the report their guests print on the console, and
// the VMs.
package story
