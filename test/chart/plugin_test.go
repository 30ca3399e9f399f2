package chart

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/plugin"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

// `kubectl guestbackup`, the real plugin binary run by the real kubectl,
// as an owner who holds in the namespace only the chart's view rules (what
// the built-in view role aggregates).
var _ = Describe("kubectl guestbackup status and snapshots, with the chart's view rules only", Ordered, func() {
	const (
		release = "plugin"
		ns      = "plugin-apps"
		other   = "plugin-other"
		owner   = "owner@example.com"
	)
	var (
		ctx context.Context
		env []string
	)
	// kubectl runs `kubectl guestbackup args...` as the owner and returns
	// its output and exit code.
	kubectl := func(args ...string) (stdout, stderr string, code int) {
		GinkgoHelper()
		cmd := exec.Command("kubectl", append([]string{"guestbackup"}, append(args, "--as="+owner)...)...)
		cmd.Env = env
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errOut
		err := cmd.Run()
		var exit *exec.ExitError
		if err != nil && !errors.As(err, &exit) {
			Fail("run kubectl guestbackup: " + err.Error())
		}
		return out.String(), errOut.String(), cmd.ProcessState.ExitCode()
	}
	protect := func(namespace, name string, status v1alpha1.GuestProtectionStatus) {
		GinkgoHelper()
		p := &v1alpha1.GuestProtection{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace}}
		Expect(apiServer.Client.Create(ctx, p)).To(Succeed())
		p.Status = status
		Expect(apiServer.Client.Status().Update(ctx, p)).To(Succeed())
	}
	condition := func(typ string, status metav1.ConditionStatus, reason string) metav1.Condition {
		return metav1.Condition{Type: typ, Status: status, Reason: reason, Message: reason, LastTransitionTime: metav1.Now()}
	}

	BeforeAll(func() {
		ctx = context.Background()
		for _, name := range []string{ns, other} {
			Expect(apiServer.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}})).To(Succeed())
		}
		view := renderRelease(release, "guestbackup-system", "no-cert-manager.yaml").find("ClusterRole", release+"-guestbackup-view")
		Expect(apiServer.Client.Create(ctx, view.DeepCopy())).To(Succeed())
		Expect(apiServer.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "owner-view", Namespace: ns},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: view.GetName()},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: owner}},
		})).To(Succeed())

		end := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
		// web's catalogue: its newest three snapshots of its twelve, one
		// every six hours, newest first as its server publishes them.
		var recent []v1alpha1.GuestSnapshotSummary
		for i, id := range []string{"kweb", "kweb-6h", "kweb-12h"} {
			t := metav1.NewTime(end.Add(time.Duration(-6*i) * time.Hour))
			recent = append(recent, v1alpha1.GuestSnapshotSummary{ID: id, Path: "/etc", StartTime: t, EndTime: t, Bytes: 4096, Files: 3})
		}
		protect(ns, "web", v1alpha1.GuestProtectionStatus{
			Server: "backup/main", Identity: "web@" + ns, Snapshots: 12, FirstSnapshotTime: &end,
			LastSnapshot: &recent[0], RecentSnapshots: recent,
			Conditions: []metav1.Condition{
				condition(v1alpha1.ConditionGuestConnected, metav1.ConditionTrue, "SnapshotsSeen"),
				condition(v1alpha1.ConditionBackupFresh, metav1.ConditionTrue, "WithinSchedule"),
			},
		})
		protect(ns, "db", v1alpha1.GuestProtectionStatus{
			Server: "backup/main", Identity: "db@" + ns, Snapshots: 1, FirstSnapshotTime: &end,
			LastSnapshot: &v1alpha1.GuestSnapshotSummary{ID: "kdb", Path: "/var/lib/db", StartTime: end, EndTime: end, Bytes: 1 << 30, Files: 9},
			Conditions: []metav1.Condition{
				condition(v1alpha1.ConditionGuestConnected, metav1.ConditionTrue, "SnapshotsSeen"),
				condition(v1alpha1.ConditionBackupFresh, metav1.ConditionFalse, "BackupStale"),
			},
		})
		protect(other, "secret-project", v1alpha1.GuestProtectionStatus{Server: "backup/main", Identity: "secret-project@" + other})

		// The owner's machine: kubectl, the plugin on the PATH, a
		// kubeconfig (the admin's, used --as the owner).
		dir := GinkgoT().TempDir()
		bin := filepath.Join(dir, "bin")
		Expect(os.Mkdir(bin, 0o755)).To(Succeed())
		Expect(os.Symlink(tools.Kubectl, filepath.Join(bin, "kubectl"))).To(Succeed())
		Expect(os.Rename(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), filepath.Join(bin, "kubectl-guestbackup"))).To(Succeed())
		env = []string{"PATH=" + bin + ":/usr/bin:/bin", "HOME=" + dir, "KUBECONFIG=" + writeKubeconfig(apiServer)}
	})

	It("lists the namespace's VMs, and exits 3 because one's backup is stale", func() {
		out, errOut, code := kubectl("status", "-n", ns)
		Expect(code).To(Equal(plugin.ExitNotFresh), errOut)
		Expect(out).To(MatchRegexp(`(?m)^VM\s+SERVER\s+SNAPSHOTS\s+LAST BACKUP\s+SIZE\s+CONNECTED\s+FRESH$`))
		Expect(out).To(MatchRegexp(`(?m)^web\s+backup/main\s+12\s+\d+m\s+4\.0 KiB\s+True\s+True$`))
		Expect(out).To(MatchRegexp(`(?m)^db\s+backup/main\s+1\s+\S+\s+1\.0 GiB\s+True\s+False$`))
		Expect(out).NotTo(ContainSubstring("secret-project"))
	})

	It("shows one VM in detail, and exits 0 for a fresh one", func() {
		out, errOut, code := kubectl("status", "vm/web", "-n", ns)
		Expect(code).To(Equal(plugin.ExitOK), errOut)
		Expect(out).To(ContainSubstring("of /etc: 4.0 KiB in 3 files, snapshot kweb"))
		Expect(out).To(MatchRegexp(`(?m)^BackupFresh:\s+True \(WithinSchedule\)`))
	})

	It("prints JSON a script can read", func() {
		out, errOut, code := kubectl("status", "-n", ns, "-o", "json")
		Expect(code).To(Equal(plugin.ExitNotFresh), errOut)
		list := &v1alpha1.GuestProtectionList{}
		Expect(json.Unmarshal([]byte(out), list)).To(Succeed(), out)
		Expect(list.Items).To(ConsistOf(HaveField("Name", "web"), HaveField("Name", "db")))
		Expect(list.Kind).To(Equal("GuestProtectionList"))
	})

	It("exits 2 for a VM that is not protected, saying how to opt it in", func() {
		_, errOut, code := kubectl("status", "nope", "-n", ns)
		Expect(code).To(Equal(plugin.ExitNotProtected))
		Expect(errOut).To(ContainSubstring("is not protected by guestbackup"))
		Expect(errOut).To(ContainSubstring("guestbackup.io/server="))
	})

	It("shows nothing of a namespace the owner may not read, and exits 1 saying so", func() {
		_, errOut, code := kubectl("status", "-n", other)
		Expect(code).To(Equal(plugin.ExitFailed))
		Expect(errOut).To(ContainSubstring("forbidden"))
		Expect(errOut).NotTo(ContainSubstring("secret-project"))
	})

	It("lists a VM's snapshots newest first, saying the server holds more", func() {
		out, errOut, code := kubectl("snapshots", "vm/web", "-n", ns)
		Expect(code).To(Equal(plugin.ExitOK), errOut)
		Expect(out).To(MatchRegexp(`^ID\s+STARTED\s+AGE\s+PATH\s+FILES\s+SIZE\n` +
			`kweb\s+\S+Z\s+\d+m\s+/etc\s+3\s+4\.0 KiB\n` +
			`kweb-6h\s+\S+Z\s+7h(\d+m)?\s+/etc\s+3\s+4\.0 KiB\n` +
			`kweb-12h\s+\S+Z\s+13h\s+/etc\s+3\s+4\.0 KiB\n$`))
		Expect(errOut).To(HavePrefix("Listed: the newest 3 of the 12 snapshots of VirtualMachine " + ns + "/web."))
		Expect(errOut).To(ContainSubstring("--before TIME"))
	})

	It("lists them as JSON a script can read", func() {
		out, errOut, code := kubectl("snapshots", "web", "-n", ns, "-o", "json")
		Expect(code).To(Equal(plugin.ExitOK), errOut)
		var catalogue struct {
			Namespace, VM string
			Total         int32
			Snapshots     []v1alpha1.GuestSnapshotSummary
		}
		Expect(json.Unmarshal([]byte(out), &catalogue)).To(Succeed(), out)
		Expect(catalogue.Namespace).To(Equal(ns))
		Expect(catalogue.VM).To(Equal("web"))
		Expect(catalogue.Total).To(BeEquivalentTo(12))
		Expect(catalogue.Snapshots).To(HaveExactElements(HaveField("ID", "kweb"), HaveField("ID", "kweb-6h"), HaveField("ID", "kweb-12h")))
		Expect(errOut).To(BeEmpty())
	})

	It("lists nothing of a VM in a namespace the owner may not read, and exits 1 saying so", func() {
		out, errOut, code := kubectl("snapshots", "vm/secret-project", "-n", other)
		Expect(code).To(Equal(plugin.ExitFailed))
		Expect(errOut).To(ContainSubstring("forbidden"))
		Expect(out).To(BeEmpty())
	})

	It("exits 2 for the snapshots of a VM that is not protected, as status does", func() {
		out, errOut, code := kubectl("snapshots", "vm/nope", "-n", ns)
		Expect(code).To(Equal(plugin.ExitNotProtected))
		Expect(errOut).To(ContainSubstring("VirtualMachine " + ns + "/nope is not protected by guestbackup"))
		Expect(errOut).To(ContainSubstring("guestbackup.io/server="))
		Expect(out).To(BeEmpty())
	})

	It("explains itself to a newcomer", func() {
		out, _, code := kubectl("status", "--help")
		Expect(code).To(Equal(plugin.ExitOK))
		Expect(out).To(ContainSubstring("Exit codes: 0 every VM shown is fresh and connected"))
		Expect(out).To(ContainSubstring("kubectl guestbackup status web -n apps"))

		out, _, code = kubectl("snapshots", "--help")
		Expect(code).To(Equal(plugin.ExitOK))
		Expect(out).To(ContainSubstring("Exit codes: 0 the snapshots were listed"))
		Expect(out).To(ContainSubstring("kubectl guestbackup snapshots web -n apps"))
	})
})
