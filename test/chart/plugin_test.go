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
var _ = Describe("kubectl guestbackup status, with the chart's view rules only", Ordered, func() {
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
		protect(ns, "web", v1alpha1.GuestProtectionStatus{
			Server: "backup/main", Identity: "web@" + ns, Snapshots: 12, FirstSnapshotTime: &end,
			LastSnapshot: &v1alpha1.GuestSnapshotSummary{ID: "kweb", Path: "/etc", StartTime: end, EndTime: end, Bytes: 4096, Files: 3},
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
		out, errOut, code := kubectl("status", "web", "-n", ns)
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

	It("explains itself to a newcomer", func() {
		out, _, code := kubectl("status", "--help")
		Expect(code).To(Equal(plugin.ExitOK))
		Expect(out).To(ContainSubstring("Exit codes: 0 every VM shown is fresh and connected"))
		Expect(out).To(ContainSubstring("kubectl guestbackup status web -n apps"))
	})
})
