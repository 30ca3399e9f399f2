package requests_test

import (
	"context"
	"errors"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gbytes"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/plugin"
)

// `kubectl guestbackup restore` and `backup`, the plugin's own command run
// as kubectl runs it, against the real CRDs and admission: a tenant's
// request is created, stamped and judged as any other, what admission
// refuses reaches the tenant in its own words, and --wait follows a status
// this spec writes, playing the controller (nothing carries GuestRestores
// out here).
var _ = Describe("kubectl guestbackup, as a tenant runs it", Ordered, func() {
	// dave may only create and read GuestRestores in team-a: what restore
	// needs, and nothing more.
	const dave = "dave"
	var (
		ctx        context.Context
		kubeconfig string
	)
	BeforeAll(func() {
		ctx = context.Background()
		kubeconfig = api.Kubeconfig(GinkgoT())
		Expect(api.Client.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "restore-only", Namespace: teamA},
			Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"guestrestores"}, Verbs: []string{"create", "get"},
			}},
		})).To(Succeed())
		Expect(api.Client.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "dave-restore-only", Namespace: teamA},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "restore-only"},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: dave}},
		})).To(Succeed())
	})

	// run starts `kubectl guestbackup args...` as user in team-a; done
	// yields its exit code once it returns, and its error's message.
	type run struct {
		out, errOut *gbytes.Buffer
		done        chan error
	}
	start := func(user string, args ...string) run {
		r := run{out: gbytes.NewBuffer(), errOut: gbytes.NewBuffer(), done: make(chan error, 1)}
		cmd := plugin.NewCommand(genericiooptions.IOStreams{Out: r.out, ErrOut: r.errOut})
		cmd.SetArgs(append(args, "-n", teamA, "--kubeconfig", kubeconfig, "--as", user))
		go func() {
			defer GinkgoRecover()
			r.done <- cmd.ExecuteContext(ctx)
		}()
		return r
	}
	// exit is r's exit code, once it returned, and its error's message.
	exit := func(r run) (int, string) {
		GinkgoHelper()
		var err error
		Eventually(r.done).WithTimeout(time.Minute).Should(Receive(&err))
		if err == nil {
			return plugin.ExitOK, ""
		}
		var e *plugin.ExitError
		if errors.As(err, &e) {
			return e.Code, err.Error()
		}
		return plugin.ExitFailed, err.Error()
	}
	// controller writes the status of GuestRestore name, as the controller would.
	controller := func(name string, status v1alpha1.GuestRestoreStatus) {
		GinkgoHelper()
		r := &v1alpha1.GuestRestore{}
		Eventually(func() error { return api.Client.Get(ctx, client.ObjectKey{Namespace: teamA, Name: name}, r) }).Should(Succeed())
		r.Status = status
		Expect(api.Client.Status().Update(ctx, r)).To(Succeed())
	}

	It("creates the GuestRestore the flags ask for, stamped with its requester, with no right but to create and read GuestRestores", func() {
		r := start(dave, "restore", "vm/web", "/etc/nginx", "/srv/www", "--from", "k0123abcd", "--to", "/srv/restored", "-o", "yaml")
		code, msg := exit(r)
		Expect(code).To(Equal(plugin.ExitOK), msg)

		printed := &v1alpha1.GuestRestore{}
		Expect(yaml.Unmarshal(r.out.Contents(), printed)).To(Succeed(), string(r.out.Contents()))
		Expect(printed.Kind).To(Equal("GuestRestore"))
		Expect(printed.GenerateName).To(Equal("web-"))
		Expect(r.errOut).To(gbytes.Say(`guestrestore/` + printed.Name + ` created: it restores /etc/nginx, /srv/www from snapshot k0123abcd of VirtualMachine web under /srv/restored in the guest of VirtualMachine web\n`))

		stored := &v1alpha1.GuestRestore{}
		Expect(api.Client.Get(ctx, client.ObjectKeyFromObject(printed), stored)).To(Succeed())
		Expect(stored.Spec.Requester).NotTo(BeNil())
		Expect(stored.Spec.Requester.Username).To(Equal(dave))
		stored.Spec.Requester = nil
		Expect(stored.Spec).To(Equal(v1alpha1.GuestRestoreSpec{
			VM: "web", Paths: []string{"/etc/nginx", "/srv/www"},
			Snapshot: v1alpha1.SnapshotSelector{ID: "k0123abcd"},
			Target:   v1alpha1.RestoreTarget{Directory: "/srv/restored"},
		}))
	})

	DescribeTable("passes on, and exits 1, what admission refuses, saying what to fix",
		func(args []string, message string) {
			r := start(alice, append([]string{"restore"}, args...)...)
			code, msg := exit(r)
			Expect(code).To(Equal(plugin.ExitFailed))
			Expect(msg).To(HavePrefix("create a GuestRestore of VirtualMachine " + teamA + "/"))
			Expect(msg).To(ContainSubstring(`admission webhook "requests.guestbackup.io" denied the request`))
			Expect(msg).To(ContainSubstring(message))
		},
		Entry("another VM's snapshots, ungranted", []string{"db", "/etc/nginx", "--source-vm", "web"},
			"spec.sourceVM: VirtualMachine db may not read the snapshots of web: annotate it with guestbackup.io/restore-from=web to grant it"),
		Entry("a VM that is not opted in", []string{"vm/plain", "/etc/nginx"},
			"spec.vm: VirtualMachine plain is not opted in to guestbackup: annotate it with guestbackup.io/server=<namespace>/<server> first"),
		Entry("a relative path", []string{"web", "etc/nginx"}, `spec.paths[0]: "etc/nginx" is not absolute`),
		Entry("the guest's root as a folder", []string{"web", "/etc/nginx", "--to", "/"},
			`spec.target.directory: "/" restores over the guest's own files: set target.inPlace to mean that`),
		Entry("a time to come", []string{"web", "/etc/nginx", "--before", time.Now().Add(48 * time.Hour).UTC().Format(time.RFC3339)},
			"is in the future: give a time in the past (RFC 3339)"),
	)

	It("exits 1, saying so, for a tenant who may not create GuestRestores", func() {
		code, msg := exit(start(carol, "restore", "web", "/etc/nginx"))
		Expect(code).To(Equal(plugin.ExitFailed))
		Expect(msg).To(ContainSubstring(`guestrestores.guestbackup.io is forbidden: User "carol" cannot create resource "guestrestores"`))
	})

	It("follows a restore to its end, printing its progress, then what was restored, from which snapshots, and where", func() {
		r := start(dave, "restore", "web", "/etc/nginx", "--name", "followed", "--wait")
		Eventually(r.errOut).Should(gbytes.Say(`guestrestore/followed created: it restores /etc/nginx from the latest snapshot of VirtualMachine web into /var/lib/guestbackup/restores/followed in the guest of VirtualMachine web\n`))

		controller("followed", v1alpha1.GuestRestoreStatus{Phase: v1alpha1.PhasePending})
		Eventually(r.errOut).Should(gbytes.Say("Pending\n"))
		controller("followed", v1alpha1.GuestRestoreStatus{Phase: v1alpha1.PhaseRunning, Progress: v1alpha1.RestoreProgress{Files: 2, Bytes: 2048}})
		Eventually(r.errOut).Should(gbytes.Say("Running: 2 files, 2.0 KiB written\n"))
		controller("followed", v1alpha1.GuestRestoreStatus{
			Phase: v1alpha1.PhaseSucceeded, Progress: v1alpha1.RestoreProgress{Files: 5, Bytes: 5120},
			Snapshots: []v1alpha1.PathSnapshot{{Path: "/etc/nginx", ID: "k0123abcd"}},
			Message:   "restored /etc/nginx from snapshot k0123abcd for dave",
		})

		code, msg := exit(r)
		Expect(code).To(Equal(plugin.ExitOK), msg)
		Expect(r.errOut).To(gbytes.Say("Succeeded: 5 files, 5.0 KiB written; restored /etc/nginx from snapshot k0123abcd for dave\n"))
		Expect(string(r.out.Contents())).To(Equal(
			"guestrestore/followed succeeded: 5 files, 5.0 KiB restored into /var/lib/guestbackup/restores/followed in the guest of VirtualMachine web\n" +
				"restored /etc/nginx from snapshot k0123abcd for dave\n" +
				"PATH         SNAPSHOT\n" +
				"/etc/nginx   k0123abcd\n"))
	})

	It("prints what a dry run found", func() {
		r := start(dave, "restore", "web", "/etc/nginx", "--name", "listed", "--list", "--wait")
		Eventually(r.errOut).Should(gbytes.Say(`guestrestore/listed created: it lists, writing nothing, what restoring /etc/nginx`))
		stored := &v1alpha1.GuestRestore{}
		Eventually(func() error { return api.Client.Get(ctx, client.ObjectKey{Namespace: teamA, Name: "listed"}, stored) }).Should(Succeed())
		Expect(stored.Spec.DryRun).To(BeTrue())

		modified := metav1.NewTime(time.Date(2026, 12, 6, 17, 2, 11, 0, time.UTC))
		controller("listed", v1alpha1.GuestRestoreStatus{
			Phase:     v1alpha1.PhaseSucceeded,
			Snapshots: []v1alpha1.PathSnapshot{{Path: "/etc/nginx", ID: "k0123abcd"}},
			DryRun: &v1alpha1.DryRunListing{Files: 1, Bytes: 1024, Entries: []v1alpha1.DryRunEntry{
				{Path: "/var/lib/guestbackup/restores/listed/etc/nginx", Type: "directory", Size: 1024, ModTime: &modified},
				{Path: "/var/lib/guestbackup/restores/listed/etc/nginx/nginx.conf", Type: "file", Size: 1024, ModTime: &modified},
			}},
		})
		code, msg := exit(r)
		Expect(code).To(Equal(plugin.ExitOK), msg)
		Expect(r.out).To(gbytes.Say(`guestrestore/listed succeeded, a dry run: restoring would write 1 files, 1.0 KiB into /var/lib/guestbackup/restores/listed`))
		Expect(r.out).To(gbytes.Say(`(?m)^file\s+1\.0 KiB\s+2026-12-06T17:02:11Z\s+/var/lib/guestbackup/restores/listed/etc/nginx/nginx\.conf$`))
	})

	It("prints a file's versions across the snapshots, waiting for them without being asked to", func() {
		r := start(dave, "history", "vm/web", "/etc/nginx/nginx.conf", "--name", "versions")
		Eventually(r.errOut).Should(gbytes.Say(`guestrestore/versions created: it lists, writing nothing, the versions of /etc/nginx/nginx.conf across the snapshots of VirtualMachine web`))
		stored := &v1alpha1.GuestRestore{}
		Eventually(func() error { return api.Client.Get(ctx, client.ObjectKey{Namespace: teamA, Name: "versions"}, stored) }).Should(Succeed())
		Expect(stored.Spec).To(And(HaveField("DryRun", BeTrue()), HaveField("History", BeTrue()), HaveField("Paths", Equal([]string{"/etc/nginx/nginx.conf"}))))
		Expect(stored.Spec.Requester).To(HaveField("Username", dave), "stamped by the webhook")

		at := func(day int) *metav1.Time {
			t := metav1.NewTime(time.Date(2026, 12, day, 2, 0, 0, 0, time.UTC))
			return &t
		}
		controller("versions", v1alpha1.GuestRestoreStatus{
			Phase:   v1alpha1.PhaseSucceeded,
			Message: "listed 3 versions of /etc/nginx/nginx.conf, newest first; nothing was written",
			History: []v1alpha1.PathVersion{
				{SnapshotID: "kc3", StartTime: *at(7), Type: "file", Size: 2048, ModTime: at(6), Changed: true},
				{SnapshotID: "kb2", StartTime: *at(6), Type: "file", Size: 1024, ModTime: at(5)},
				{SnapshotID: "ka1", StartTime: *at(5), Type: "file", Size: 1024, ModTime: at(5), Changed: true},
			},
		})
		code, msg := exit(r)
		Expect(code).To(Equal(plugin.ExitOK), msg)
		Expect(r.out).To(gbytes.Say(`guestrestore/versions succeeded: 3 versions of /etc/nginx/nginx.conf, newest first, across the snapshots of VirtualMachine web`))
		Expect(r.out).To(gbytes.Say(`(?m)^2026-12-07T02:00:00Z\s+kc3\s+file\s+2\.0 KiB\s+2026-12-06T02:00:00Z\s+yes$`))
		Expect(r.out).To(gbytes.Say(`(?m)^2026-12-06T02:00:00Z\s+kb2\s+file\s+1\.0 KiB\s+2026-12-05T02:00:00Z\s+no$`))
	})

	It("exits 4 when the restore fails, saying why", func() {
		r := start(dave, "restore", "web", "/etc/nginx", "--name", "failing", "--wait")
		controller("failing", v1alpha1.GuestRestoreStatus{Phase: v1alpha1.PhaseFailed, Message: "no snapshot of VirtualMachine web holds /etc/nginx"})
		code, _ := exit(r)
		Expect(code).To(Equal(plugin.ExitRequestFailed))
		Expect(string(r.out.Contents())).To(Equal("guestrestore/failing failed: no snapshot of VirtualMachine web holds /etc/nginx\n"))
	})

	It("exits 4 when the restore does not end within --timeout, saying it goes on", func() {
		code, msg := exit(start(dave, "restore", "web", "/etc/nginx", "--name", "unanswered", "--wait", "--timeout", "3s"))
		Expect(code).To(Equal(plugin.ExitRequestFailed))
		Expect(msg).To(Equal("guestrestore/unanswered has not ended within 3s (it is not picked up yet); it goes on: kubectl get guestrestore unanswered -n " + teamA))
	})

	It("backs up the same way: created, followed, printed", func() {
		r := start(alice, "backup", "web", "--name", "backed-up", "--wait")
		Eventually(r.errOut).Should(gbytes.Say("guestsnapshot/backed-up created: the guest of VirtualMachine web takes it at its next poll of its server\n"))
		s := &v1alpha1.GuestSnapshot{}
		Eventually(func() error { return api.Client.Get(ctx, client.ObjectKey{Namespace: teamA, Name: "backed-up"}, s) }).Should(Succeed())
		s.Status = v1alpha1.GuestSnapshotStatus{Phase: v1alpha1.PhaseSucceeded, Files: 3, Bytes: 3072, Snapshots: []v1alpha1.PathSnapshot{{Path: "/etc", ID: "k0123abcd"}}}
		Expect(api.Client.Status().Update(ctx, s)).To(Succeed())
		code, msg := exit(r)
		Expect(code).To(Equal(plugin.ExitOK), msg)
		Expect(string(r.out.Contents())).To(Equal("guestsnapshot/backed-up succeeded: 3 files, 3.0 KiB\nPATH   SNAPSHOT\n/etc   k0123abcd\n"))
	})
})
