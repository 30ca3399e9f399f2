package audit_test

import (
	"context"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	kubevirtv1 "kubevirt.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// The controller's clock is a fake one: the delay is the controller's to
// judge, on its clock, from the instance's creation as the API server
// recorded it. What the server pod publishes is written here as it writes
// it (the scan itself is proven by the other specs of the suite).
var _ = Describe("A guest that never connects", Ordered, func() {
	const after = 10 * time.Minute
	var (
		ctx         context.Context
		api         *testbed.APIServer
		clk         *clocktesting.FakeClock
		metricsAddr string
	)
	user := "app@" + vmNamespace
	events := func(reason string) func() []string { return vmEvents(ctx, api, "app", reason) }
	notConnected := func() (float64, error) {
		return testbed.Metric(metricsAddr, "guestbackup_vm_guest_not_connected", map[string]string{"namespace": vmNamespace, "vm": "app", "bsls": bslsNamespace + "/" + bslsName})
	}
	// poke makes the controller look at the VM again, as its periodic
	// resync would: the fake clock moved, which no watch sees.
	poke := func(n int) {
		GinkgoHelper()
		vm := &kubevirtv1.VirtualMachine{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: "app"}, vm)).To(Succeed())
		vm.Labels = map[string]string{"poke": strconv.Itoa(n)}
		Expect(api.Client.Update(ctx, vm)).To(Succeed())
	}
	secretAnnotation := func() string {
		s := &corev1.Secret{}
		_ = api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName("app")}, s)
		return s.Annotations[audit.AnnotationNotConnected]
	}

	BeforeAll(func() {
		ctx = context.Background()
		api = startAuditBed(ctx)
		createOptedInVM(ctx, api, "app", map[string]string{v1alpha1.AnnotationPaths: "/srv/app"}, kubevirtv1.RunStrategyAlways,
			time.Now().UTC().Add(-time.Minute), testbed.RandomPassword())
		clk = clocktesting.NewFakeClock(time.Now())
		port, err := testbed.FreePort()
		Expect(err).NotTo(HaveOccurred())
		metricsAddr = "127.0.0.1:" + strconv.Itoa(port)
		stop, err := testbed.RunManager(api, testbed.ManagerOptions{Logger: GinkgoLogr, MetricsAddr: metricsAddr, Cache: controller.Cache()}, func(mgr ctrl.Manager) error {
			return (&audit.Reconciler{NotConnectedAfter: after, Clock: clk}).SetupWithManager(mgr)
		})
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { Expect(stop()).To(Succeed()) })
	})

	It("says nothing while the VM is stopped, and nothing within the delay of its start", func() {
		clk.Step(time.Hour)
		poke(1)
		// The clock is set before the instance exists: the controller may
		// judge it the moment its creation is watched, and must find it
		// within the delay then (its creation time, in whole seconds, is
		// at most a second before now).
		clk.SetTime(time.Now().Add(after - time.Minute))
		vmi := &kubevirtv1.VirtualMachineInstance{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: vmNamespace}}
		Expect(api.Client.Create(ctx, vmi)).To(Succeed())
		poke(2)
		Eventually(notConnected).Should(Equal(0.0))
		Expect(events(audit.ReasonGuestNotConnected)()).To(BeEmpty())
	})

	It("warns once the delay after the start has passed, on the VM and in the metric", func() {
		clk.Step(2 * time.Minute)
		poke(3)
		Eventually(events(audit.ReasonGuestNotConnected)).Should(ConsistOf(And(
			HavePrefix("Warning The guest has not connected to BackupStorageLocationServer backup/main as app@team-a within 10m0s of the VM's start"),
			ContainSubstring("cannot reach the server's URL"), ContainSubstring("journalctl -u guestbackup-connect"))))
		Eventually(notConnected).Should(Equal(1.0))
		By("once per instance")
		poke(4)
		Eventually(secretAnnotation).ShouldNot(BeEmpty())
		Expect(events(audit.ReasonGuestNotConnected)()).To(HaveLen(1))
	})

	It("clears when the guest's first snapshot reaches the server", func() {
		end := time.Now().UTC()
		cm := &corev1.ConfigMap{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: bslsNamespace, Name: activity.ConfigMapName(bslsName, userset.ShardOf(user))}, cm)).To(Succeed())
		cm.Data = map[string]string{activity.Key: string(activity.Encode(map[string]activity.Guest{user: {
			User: user, Snapshots: 1, First: end,
			Last: activity.Snapshot{ID: "k1", Path: "/srv/app", Start: end.Add(-time.Second), End: end, Bytes: 10, Files: 1},
		}}))}
		Expect(api.Client.Update(ctx, cm)).To(Succeed())
		Eventually(events(audit.ReasonGuestConnected)).Should(ConsistOf(HavePrefix("Normal Guest backs up as app@team-a")))
		Eventually(notConnected).Should(Equal(0.0))
		Eventually(secretAnnotation).Should(BeEmpty())
		Expect(events(audit.ReasonGuestNotConnected)()).To(HaveLen(1))
	})

	It("keeps no series for a server the VM left", func() {
		// The alerts match every series of a VM: one kept for the old
		// server would fire for as long as the controller runs.
		series := func(bsls string) func() error {
			return func() error {
				_, err := testbed.Metric(metricsAddr, "guestbackup_vm_last_snapshot_timestamp_seconds", map[string]string{"namespace": vmNamespace, "vm": "app", "bsls": bsls})
				return err
			}
		}
		Eventually(series(bslsNamespace + "/" + bslsName)).Should(Succeed())
		s := &corev1.Secret{}
		Expect(api.Client.Get(ctx, client.ObjectKey{Namespace: vmNamespace, Name: v1alpha1.CredentialSecretName("app")}, s)).To(Succeed())
		s.Labels[vmsecret.LabelServerName] = "other"
		Expect(api.Client.Update(ctx, s)).To(Succeed())
		poke(5)
		Eventually(func() (float64, error) {
			return testbed.Metric(metricsAddr, "guestbackup_vm_guest_not_connected", map[string]string{"namespace": vmNamespace, "vm": "app", "bsls": bslsNamespace + "/other"})
		}).Should(Equal(0.0))
		// Absent either way: no series of that server, or, when it was the
		// metric's last series, no metric at all (testbed.ErrNoSeries both).
		absent := MatchError(testbed.ErrNoSeries)
		Expect(series(bslsNamespace + "/" + bslsName)()).To(absent)
		_, err := notConnected()
		Expect(err).To(absent)
	})
})
