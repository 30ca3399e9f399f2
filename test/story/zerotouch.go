package story

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os/exec"
	"slices"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gtypes "github.com/onsi/gomega/types"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	kubevirtv1 "kubevirt.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

// Bed is where a story with real guests runs: guestbackup with an
// admin's BSLS <bslsNamespace>/main, and a way to boot a VM's guest until it
// powers itself off.
type Bed interface {
	// Client is the cluster's admin client.
	Client() client.Client
	// BSLS is the admin's BSLS.
	BSLS() *v1alpha1.BackupStorageLocationServer
	// ServerURL is the BSLS's server as a kopia client on this machine
	// reaches it.
	ServerURL() string
	// Guest makes vm's first volume the test guest as this bed runs it.
	Guest(vm *kubevirtv1.VirtualMachine) *kubevirtv1.VirtualMachine
	// Boot starts stored VM vm and returns its guest's console once the
	// guest powered itself off.
	Boot(vm *kubevirtv1.VirtualMachine) testbed.GuestResult
	// Events are the Events about an object, as "Type Reason: message".
	Events(ctx context.Context, namespace, kind, name string) ([]string, error)
	// Kubeconfig is a kubeconfig file of the cluster's admin, for kubectl
	// and its plugin.
	Kubeconfig() string
}

// JobBed is a Bed whose node runs the pods of Jobs (a kubelet and
// kube-controller-manager's Job controller): restores into claims run there.
type JobBed interface {
	Bed
	// ClaimClass makes a volume of size on the node that one claim of the
	// returned storage class binds, as an admin's provisioner would.
	ClaimClass(name, size string) string
	// ShellImage is an image the node holds that has a POSIX shell and
	// coreutils, for a pod that reads a claim back.
	ShellImage(ctx context.Context) (string, error)
}

// Option adds specs to a story for what its bed can do.
type Option int

// WithJobs adds the specs that need a JobBed: a stopped VM's restore into
// a claim, written by a Job and read back by a pod.
const WithJobs Option = iota + 1

// ZeroTouch is the zero-touch story, on the bed start makes: an admin's
// BSLS, two owners' VMs whose guests connect and snapshot with only what
// was injected, their isolation, and a deleted VM's revocation.
func ZeroTouch(start func(ctx context.Context, bslsNS string, namespaces ...string) Bed, opts ...Option) {
	const (
		bslsNS = "backup"
		vmNS   = "team-a"
	)
	var (
		ctx  context.Context
		bed  Bed
		c    client.Client
		bsls *v1alpha1.BackupStorageLocationServer
	)
	vmEvents := func(name string) func() ([]string, error) {
		return func() ([]string, error) { return bed.Events(ctx, vmNS, "VirtualMachine", name) }
	}

	// usersOfShard reads the users Secret of the shard that holds user.
	usersOfShard := func(user string) func() string {
		return func() string {
			s := &corev1.Secret{}
			_ = c.Get(ctx, types.NamespacedName{Namespace: bslsNS, Name: userset.SecretName("main", userset.ShardOf(user))}, s)
			return string(s.Data[userset.Key])
		}
	}
	// requestsOfShard reads the requests a guest's server lists in the
	// users Secret of the shard that holds user.
	requestsOfShard := func(user string) func() string {
		return func() string {
			s := &corev1.Secret{}
			_ = c.Get(ctx, types.NamespacedName{Namespace: bslsNS, Name: userset.SecretName("main", userset.ShardOf(user))}, s)
			return string(s.Data[userset.RequestsKey])
		}
	}
	// waitForUser waits until the controller has given user to the server.
	waitForUser := func(user string) {
		GinkgoHelper()
		Eventually(usersOfShard(user)).WithTimeout(30 * time.Second).Should(ContainSubstring(user))
	}
	// serverURL is the server as the host's kopia reaches it.
	serverURL := func() string { return bed.ServerURL() }
	// connected is what the guest says once it connected as user, to the
	// admin's clientURL (the endpoint the BSLS's status shows, spec 1).
	connected := func(user string) string { return "connected to " + bsls.Spec.ClientURL + " as " + user }

	BeforeAll(func() {
		ctx = context.Background()
		bed = start(ctx, bslsNS, vmNS)
		c, bsls = bed.Client(), bed.BSLS()
	})

	It("runs the admin's BSLS from the Deployment it writes: Ready, with endpoint and pin", func() {
		Eventually(func() bool {
			_ = c.Get(ctx, client.ObjectKeyFromObject(bsls), bsls)
			return meta.IsStatusConditionTrue(bsls.Status.Conditions, v1alpha1.ConditionReady)
		}).WithTimeout(30 * time.Second).Should(BeTrue())
		Expect(bsls.Status.Endpoint).To(Equal(bsls.Spec.ClientURL))
		Expect(bsls.Status.TLSFingerprint).To(HaveLen(64))
	})

	// web is the first VM's story: its guest's console and, from the host,
	// its first snapshot's ID and its password.
	var web struct {
		console, snapshot, password string
	}

	// asked is the owner's request to back up web now, made with `kubectl
	// guestbackup backup` before the VM boots; askedBack, made after it
	// with `kubectl guestbackup restore`, restores the file it takes.
	asked := &v1alpha1.GuestSnapshot{}
	askedBack := &v1alpha1.GuestRestore{}
	// hooked is a snapshot the owner asks for after both, which the
	// guest's own pre-snapshot hook refuses; inPlace, asked after it,
	// restores /srv/asked over itself, which that hook wrote over.
	hooked := &v1alpha1.GuestSnapshot{}
	inPlace := &v1alpha1.GuestRestore{}

	It("boots an opted-in VM whose guest connects and snapshots with only what was injected, and says so on the VM", func() {
		stored := CreateStored(ctx, c, bed.Guest(OwnersVM(vmNS, "web", bslsNS+"/main", "/srv/data", WebConfig)))
		waitForUser("web@team-a")

		By("asking, from the cluster, with kubectl guestbackup, for a snapshot the guest takes once it runs")
		plugin := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "backup", "vm/web", "-n", vmNS,
			"--path", "/srv/asked", "--tag", "why=upgrade", "-o", "json", "--kubeconfig", bed.Kubeconfig())
		var stderr bytes.Buffer
		plugin.Stderr = &stderr
		created, err := plugin.Output()
		Expect(err).NotTo(HaveOccurred(), stderr.String())
		Expect(json.Unmarshal(created, asked)).To(Succeed(), string(created))
		Expect(stderr.String()).To(ContainSubstring("guestsnapshot/" + asked.Name + " created: the guest of VirtualMachine web takes it at its next poll of its server\n"))
		Eventually(func() v1alpha1.RequestPhase {
			_ = c.Get(ctx, client.ObjectKeyFromObject(asked), asked)
			return asked.Status.Phase
		}).WithTimeout(30 * time.Second).Should(Equal(v1alpha1.PhasePending))
		Eventually(requestsOfShard("web@team-a")).WithTimeout(30*time.Second).Should(ContainSubstring(string(asked.UID)), "the request, handed to the guest's server")

		By("asking, after it, for the asked-for file back, restored into the request's own folder in the guest")
		// A guest carries out its requests oldest first, by creation
		// time (whole seconds), then name: this one is made in a later
		// second, so that it restores from the snapshot asked first.
		Eventually(func() bool { return time.Now().After(asked.CreationTimestamp.Add(time.Second)) }).WithPolling(100 * time.Millisecond).Should(BeTrue())
		plugin = exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "restore", "vm/web", "/srv/asked/note.txt", "--name", "web-restore-asked",
			"-n", vmNS, "-o", "json", "--kubeconfig", bed.Kubeconfig())
		stderr.Reset()
		plugin.Stderr = &stderr
		created, err = plugin.Output()
		Expect(err).NotTo(HaveOccurred(), stderr.String())
		Expect(json.Unmarshal(created, askedBack)).To(Succeed(), string(created))
		Eventually(requestsOfShard("web@team-a")).WithTimeout(30*time.Second).Should(ContainSubstring(string(askedBack.UID)), "the restore, handed to the guest's server")

		By("asking, after both, for a snapshot of /srv/hooked, which the guest's own pre-snapshot hook refuses")
		Eventually(func() bool { return time.Now().After(askedBack.CreationTimestamp.Add(time.Second)) }).WithPolling(100 * time.Millisecond).Should(BeTrue())
		plugin = exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "backup", "vm/web", "--path", "/srv/hooked", "--name", "web-hooked",
			"-n", vmNS, "-o", "json", "--kubeconfig", bed.Kubeconfig())
		stderr.Reset()
		plugin.Stderr = &stderr
		created, err = plugin.Output()
		Expect(err).NotTo(HaveOccurred(), stderr.String())
		Expect(json.Unmarshal(created, hooked)).To(Succeed(), string(created))
		Eventually(requestsOfShard("web@team-a")).WithTimeout(30*time.Second).Should(ContainSubstring(string(hooked.UID)), "the hooked snapshot, handed to the guest's server")

		By("asking, last, for the folder /srv/asked back in place, over what the hook wrote")
		Eventually(func() bool { return time.Now().After(hooked.CreationTimestamp.Add(time.Second)) }).WithPolling(100 * time.Millisecond).Should(BeTrue())
		plugin = exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "restore", "vm/web", "/srv/asked", "--in-place", "--name", "web-in-place",
			"-n", vmNS, "-o", "json", "--kubeconfig", bed.Kubeconfig())
		stderr.Reset()
		plugin.Stderr = &stderr
		created, err = plugin.Output()
		Expect(err).NotTo(HaveOccurred(), stderr.String())
		Expect(json.Unmarshal(created, inPlace)).To(Succeed(), string(created))
		Eventually(requestsOfShard("web@team-a")).WithTimeout(30*time.Second).Should(ContainSubstring(string(inPlace.UID)), "the restore in place, handed to the guest's server")

		Eventually(func() string {
			s := &corev1.Secret{}
			_ = c.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: v1alpha1.CredentialSecretName("web")}, s)
			return vmsecret.RenderedClient(s)
		}).WithTimeout(30*time.Second).Should(HaveSuffix(" requests every 30s"), "the guest's bootstrap, rendered with its requests poller")

		res := bed.Boot(stored)
		web.console = res.Console
		m := Markers(res.Console)
		Expect(m["status"]).To(ContainSubstring(connected("web@team-a")), "the guest's services said:\n%s", Logs(res.Console))
		Expect(m["snapshots"]).To(Equal("1"))

		By("finding the snapshot on the server as the VM's user")
		s := &corev1.Secret{}
		Expect(c.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: v1alpha1.CredentialSecretName("web")}, s)).To(Succeed())
		web.password = string(s.Data[v1alpha1.SecretKeyPassword])
		kopia := testbed.NewKopiaClient(GinkgoT())
		out, err := kopia.ConnectPinned(ctx, serverURL(), bsls.Status.TLSFingerprint, "web@team-a", web.password)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := kopia.SnapshotIDs(ctx, "/srv/data")
		Expect(err).NotTo(HaveOccurred())
		Expect(m["versions"]).To(HavePrefix("3 "), "the guest's two snapshots after changing hello.txt:\n%s", Logs(res.Console))
		Expect(ids).To(HaveLen(3))
		web.snapshot = ids[0] // the first, oldest first

		By("recording the whole story on the VM")
		Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElements(
			HavePrefix("Normal CredentialsIssued: Issued Kopia credentials for web@team-a"),
			HavePrefix("Normal UserProvisioned: User web@team-a provisioned"),
			HavePrefix("Normal GuestConnected: Guest backs up as web@team-a"),
			// The newest snapshot between two looks of the audit: one of
			// /srv/data (the schedule's, or one of the two the guest
			// took of hello.txt's later versions), or the one the owner
			// asked for of /srv/asked when they came together.
			And(HavePrefix("Normal SnapshotCreated: Snapshot"), Or(ContainSubstring("of /srv/data: "), ContainSubstring("of /srv/asked: 27 bytes in 1 files"))),
		))
		Expect(vmEvents("web")()).NotTo(ContainElement(ContainSubstring(web.password)))
	})

	It("backs up now when asked from the cluster: the guest takes the snapshot under its own identity, and the request says which, and who asked", func() {
		Expect(Markers(web.console)).To(HaveKeyWithValue("requested", string(asked.UID)+" Succeeded"), "the guest's services said:\n%s", Logs(web.console))
		Eventually(func() v1alpha1.RequestPhase {
			_ = c.Get(ctx, client.ObjectKeyFromObject(asked), asked)
			return asked.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhaseSucceeded), "the request's status: %+v", asked.Status)
		Expect(asked.Spec.Requester).NotTo(BeNil(), "the webhook stamps who asked")
		requester := asked.Spec.Requester.Username
		Expect(requester).NotTo(BeEmpty())
		Expect(asked.Status.Snapshots).To(ConsistOf(HaveField("Path", "/srv/asked")))
		Expect(asked.Status.Files).To(BeEquivalentTo(1))
		Expect(asked.Status.StartTime).NotTo(BeNil())
		Expect(asked.Status.CompletionTime).NotTo(BeNil())

		By("finding it on the server as the VM's user, with the request's tag")
		kopia := testbed.NewKopiaClient(GinkgoT())
		out, err := kopia.ConnectPinned(ctx, serverURL(), bsls.Status.TLSFingerprint, "web@team-a", web.password)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := kopia.SnapshotIDs(ctx, "/srv/asked")
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(Equal([]string{asked.Status.Snapshots[0].ID}))
		out, err = kopia.Run(ctx, "snapshot", "list", "--json", "/srv/asked")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(`"tag:why":"upgrade"`))

		By("restoring from it, inside the guest, what the guest had, byte for byte")
		note := sha256.Sum256([]byte("asked for from the cluster\n"))
		Expect(Markers(web.console)).To(HaveKeyWithValue("asked-restore", ids[0]+" identical "+hex.EncodeToString(note[:])))

		By("saying so, naming who asked, on the request and on the VM")
		taken := HavePrefix("Normal SnapshotTaken: Snapshot requested by " + requester + " (" + asked.Name + ") taken: /srv/asked (" + ids[0] + ")")
		Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElements(
			HavePrefix("Normal SnapshotRequested: Snapshot requested by "+requester+" ("+asked.Name+")"), taken))
		Expect(bed.Events(ctx, vmNS, "GuestSnapshot", asked.Name)).To(ContainElement(taken))
	})

	It("aborts a snapshot asked from the cluster when the guest's own pre-snapshot hook fails, naming the hook and its last words on the request and the VM; the post-hooks still run", func() {
		Expect(Markers(web.console)).To(HaveKeyWithValue("hooked", string(hooked.UID)+" Failed"), "the guest's services said:\n%s", Logs(web.console))
		Expect(Markers(web.console)).To(HaveKeyWithValue("post-hooks", "1"), "the post-hook ran once after the refused snapshot")
		Eventually(func() v1alpha1.RequestPhase {
			_ = c.Get(ctx, client.ObjectKeyFromObject(hooked), hooked)
			return hooked.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhaseFailed), "the request's status: %+v", hooked.Status)
		const why = "pre-snapshot hook 10-quiesce failed: the database is not ready: try again later; no snapshot taken"
		Expect(hooked.Status.Message).To(Equal(why))
		Expect(hooked.Status.Snapshots).To(BeEmpty())

		By("taking no snapshot of the path")
		kopia := testbed.NewKopiaClient(GinkgoT())
		out, err := kopia.ConnectPinned(ctx, serverURL(), bsls.Status.TLSFingerprint, "web@team-a", web.password)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(kopia.SnapshotIDs(ctx, "/srv/hooked")).To(BeEmpty())

		By("saying so, naming who asked, on the request and on the VM")
		failed := Equal("Warning SnapshotRequestFailed: Snapshot requested by " + hooked.Spec.Requester.Username + " (web-hooked) failed: " + why)
		Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElement(failed))
		Expect(bed.Events(ctx, vmNS, "GuestSnapshot", hooked.Name)).To(ContainElement(failed))
	})

	It("restores when asked from the cluster: the guest writes the file back into the request's folder, byte for byte with its mode and owner, from the snapshot its server chose", func() {
		Expect(asked.Status.Snapshots).To(HaveLen(1), "the snapshot asked before")
		from := asked.Status.Snapshots[0].ID
		Eventually(func() v1alpha1.RequestPhase {
			_ = c.Get(ctx, client.ObjectKeyFromObject(askedBack), askedBack)
			return askedBack.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhaseSucceeded), "the restore's status: %+v", askedBack.Status)
		note := sha256.Sum256([]byte("asked for from the cluster\n"))
		Expect(Markers(web.console)).To(HaveKeyWithValue("cluster-restore", string(askedBack.UID)+" Succeeded "+hex.EncodeToString(note[:])+" 644:root:root 644:root:root"),
			"the guest's services said:\n%s", Logs(web.console))
		Expect(askedBack.Status.Snapshots).To(Equal([]v1alpha1.PathSnapshot{{Path: "/srv/asked/note.txt", ID: from}}), "the latest snapshot holding the path")
		Expect(askedBack.Status.Progress).To(Equal(v1alpha1.RestoreProgress{Files: 1, Bytes: int64(len("asked for from the cluster\n"))}))
		Expect(askedBack.Status.StartTime).NotTo(BeNil())
		Expect(askedBack.Status.CompletionTime).NotTo(BeNil())

		By("saying so, naming who asked, on the request and on the VM")
		Expect(askedBack.Spec.Requester).NotTo(BeNil(), "the webhook stamps who asked")
		restored := HavePrefix("Normal Restored: Restore requested by " + askedBack.Spec.Requester.Username + " (web-restore-asked) restored /srv/asked/note.txt (" + from +
			") into /var/lib/guestbackup/restores/web-restore-asked in the guest")
		Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElements(
			HavePrefix("Normal RestoreRequested: Restore requested by "+askedBack.Spec.Requester.Username+" (web-restore-asked)"), restored))
		Expect(bed.Events(ctx, vmNS, "GuestRestore", askedBack.Name)).To(ContainElement(restored))
	})

	It("restores a folder in place when asked from the cluster: what was written over comes back byte for byte, and what the snapshot does not hold stays", func() {
		Expect(asked.Status.Snapshots).To(HaveLen(1), "the snapshot asked before")
		from := asked.Status.Snapshots[0].ID
		Eventually(func() v1alpha1.RequestPhase {
			_ = c.Get(ctx, client.ObjectKeyFromObject(inPlace), inPlace)
			return inPlace.Status.Phase
		}).WithTimeout(30*time.Second).Should(Equal(v1alpha1.PhaseSucceeded), "the restore's status: %+v", inPlace.Status)
		note := sha256.Sum256([]byte("asked for from the cluster\n"))
		Expect(Markers(web.console)).To(HaveKeyWithValue("in-place", string(inPlace.UID)+" Succeeded "+hex.EncodeToString(note[:])+" kept beside the restore"),
			"the guest's services said:\n%s", Logs(web.console))
		Expect(inPlace.Status.Snapshots).To(Equal([]v1alpha1.PathSnapshot{{Path: "/srv/asked", ID: from}}), "the latest snapshot holding the folder")

		By("saying so, naming who asked, on the request and on the VM")
		restored := HavePrefix("Normal Restored: Restore requested by " + inPlace.Spec.Requester.Username + " (web-in-place) restored /srv/asked (" + from + ") in place in the guest")
		Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElement(restored))
		Expect(bed.Events(ctx, vmNS, "GuestRestore", inPlace.Name)).To(ContainElement(restored))
	})

	It("lists the VM's snapshots, newest first, to an owner who holds only the namespace's view rules, and a file's versions to its owner, from the cluster", func() {
		const viewer = "viewer@example.com"
		By("granting the viewer what the chart aggregates into the built-in view role, and nothing else")
		Expect(client.IgnoreAlreadyExists(c.Create(ctx, &rbacv1.Role{
			ObjectMeta: metav1.ObjectMeta{Name: "guestbackup-view", Namespace: vmNS},
			Rules:      []rbacv1.PolicyRule{{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"guestprotections"}, Verbs: []string{"get", "list", "watch"}}},
		}))).To(Succeed())
		Expect(client.IgnoreAlreadyExists(c.Create(ctx, &rbacv1.RoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "viewer", Namespace: vmNS},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "guestbackup-view"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: viewer}},
		}))).To(Succeed())

		Expect(asked.Status.Snapshots).To(HaveLen(1), "the snapshot asked before")
		var catalogue struct {
			Total     int32                           `json:"total"`
			Snapshots []v1alpha1.GuestSnapshotSummary `json:"snapshots"`
		}
		snapshots := func(g Gomega) {
			plugin := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "snapshots", "vm/web", "-n", vmNS, "-o", "json",
				"--kubeconfig", bed.Kubeconfig(), "--as", viewer)
			var stderr bytes.Buffer
			plugin.Stderr = &stderr
			out, err := plugin.Output()
			g.Expect(err).NotTo(HaveOccurred(), stderr.String())
			g.Expect(json.Unmarshal(out, &catalogue)).To(Succeed(), string(out))
			g.Expect(catalogue.Snapshots).To(ContainElements(
				And(HaveField("ID", web.snapshot), HaveField("Path", "/srv/data"), HaveField("Files", BeEquivalentTo(1)), HaveField("Bytes", BeEquivalentTo(21))),
				And(HaveField("ID", asked.Status.Snapshots[0].ID), HaveField("Path", "/srv/asked"), HaveField("Files", BeEquivalentTo(1))),
			))
		}
		Eventually(snapshots).WithTimeout(90 * time.Second).Should(Succeed())
		Expect(catalogue.Total).To(BeNumerically(">=", len(catalogue.Snapshots)))
		Expect(catalogue.Snapshots).To(BeComparableTo(slices.SortedStableFunc(slices.Values(catalogue.Snapshots), func(a, b v1alpha1.GuestSnapshotSummary) int {
			return b.EndTime.Compare(a.EndTime.Time)
		})), "newest first")

		By("showing the viewer, with kubectl guestbackup status, that the VM is protected: exit code 0")
		status := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "status", "vm/web", "-n", vmNS, "--kubeconfig", bed.Kubeconfig(), "--as", viewer)
		shown, err := status.CombinedOutput()
		Expect(err).NotTo(HaveOccurred(), "exit code %d: %s", status.ProcessState.ExitCode(), shown)
		Expect(string(shown)).To(MatchRegexp(`(?m)^BackupFresh:\s+True`))

		By("listing, as the owner, hello.txt's three versions across the snapshots, with kubectl guestbackup history")
		plugin := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "history", "vm/web", "/srv/data/hello.txt", "--name", "web-hello-history",
			"-n", vmNS, "-o", "json", "--timeout", "3m", "--kubeconfig", bed.Kubeconfig())
		var stderr bytes.Buffer
		plugin.Stderr = &stderr
		out, err := plugin.Output()
		Expect(err).NotTo(HaveOccurred(), stderr.String())
		history := &v1alpha1.GuestRestore{}
		Expect(json.Unmarshal(out, history)).To(Succeed(), string(out))
		Expect(history.Status.Phase).To(Equal(v1alpha1.PhaseSucceeded), history.Status.Message)
		version := func(size int) gtypes.GomegaMatcher {
			return And(HaveField("Type", "file"), HaveField("Size", BeEquivalentTo(size)), HaveField("Changed", BeTrue()), HaveField("ModTime", Not(BeNil())))
		}
		Expect(history.Status.History).To(HaveExactElements(
			version(len("third version, longer\n")), version(len("second version\n")),
			And(version(len("hello from the guest\n")), HaveField("SnapshotID", web.snapshot)),
		), "newest first, each changed")
		Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElement(
			HavePrefix("Normal RestoreListed: Restore requested by " + history.Spec.Requester.Username + " (web-hello-history) listed the versions of /srv/data/hello.txt: 3, newest first")))
	})

	if slices.Contains(opts, WithJobs) {
		It("restores a stopped VM's file into a new claim, asked with kubectl guestbackup: a Job writes it under the VM's identity, and a pod reads it back byte for byte", func() {
			jobs, ok := bed.(JobBed)
			Expect(ok).To(BeTrue(), "a bed that runs Jobs")
			Expect(web.snapshot).NotTo(BeEmpty(), "the first VM's first snapshot")
			By("the VM is stopped: its guest powered itself off")
			Eventually(func() kubevirtv1.VirtualMachinePrintableStatus {
				vm := &kubevirtv1.VirtualMachine{}
				_ = c.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: "web"}, vm)
				return vm.Status.PrintableStatus
			}).WithTimeout(2*time.Minute).Should(Equal(kubevirtv1.VirtualMachineStatusStopped), "its guest ran once (runStrategy Once) and powered off")

			By("asking for hello.txt of its first snapshot in a new 1 GiB claim, and waiting for it")
			class := jobs.ClaimClass("web-to-claim", "1Gi")
			plugin := exec.Command(testbed.Build(GinkgoT(), "./cmd/kubectl-guestbackup"), "restore", "vm/web", "/srv/data/hello.txt", "--from", web.snapshot,
				"--pvc-size", "1Gi", "--storage-class", class, "--name", "web-to-claim", "--wait", "--timeout", "8m", "-n", vmNS, "-o", "json", "--kubeconfig", bed.Kubeconfig())
			var stderr bytes.Buffer
			plugin.Stderr = &stderr
			out, err := plugin.Output()
			Expect(err).NotTo(HaveOccurred(), "%s\n%s", stderr.String(), testbed.DescribePods(ctx, c, vmNS))
			restored := &v1alpha1.GuestRestore{}
			Expect(json.Unmarshal(out, restored)).To(Succeed(), string(out))
			Expect(restored.Status.Phase).To(Equal(v1alpha1.PhaseSucceeded), restored.Status.Message)
			hello := []byte("hello from the guest\n")
			Expect(restored.Status.Snapshots).To(Equal([]v1alpha1.PathSnapshot{{Path: "/srv/data/hello.txt", ID: web.snapshot}}))
			Expect(restored.Status.Progress).To(Equal(v1alpha1.RestoreProgress{Files: 1, Bytes: int64(len(hello))}))

			By("saying so, naming who asked and the claim, on the request and on the VM")
			said := HavePrefix("Normal Restored: Restore requested by " + restored.Spec.Requester.Username + " (web-to-claim) restored /srv/data/hello.txt (" + web.snapshot +
				") into folder /web-to-claim of PersistentVolumeClaim web-to-claim")
			Eventually(vmEvents("web")).WithTimeout(30 * time.Second).Should(ContainElements(
				HavePrefix("Normal RestoreStarted: Restore requested by "+restored.Spec.Requester.Username+" (web-to-claim) started by Job guestbackup-restore-"+string(restored.UID)), said))
			Expect(bed.Events(ctx, vmNS, "GuestRestore", restored.Name)).To(ContainElement(said))

			By("reading it back from a pod of another user that mounts the claim")
			image, err := jobs.ShellImage(ctx)
			Expect(err).NotTo(HaveOccurred())
			reader := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "read-web-to-claim", Namespace: vmNS},
				Spec: corev1.PodSpec{
					RestartPolicy:                corev1.RestartPolicyNever,
					AutomountServiceAccountToken: ptr.To(false),
					SecurityContext:              &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](1000), RunAsGroup: ptr.To[int64](1000)},
					Containers: []corev1.Container{{
						Name: "read", Image: image, ImagePullPolicy: corev1.PullNever,
						Command:      []string{"/bin/sh", "-c", `f=/claim/web-to-claim/srv/data/hello.txt; printf '%s %s' "$(sha256sum <"$f" | cut -d' ' -f1)" "$(stat -c %a "$f")" >/dev/termination-log`},
						VolumeMounts: []corev1.VolumeMount{{Name: "claim", MountPath: "/claim", ReadOnly: true}},
					}},
					Volumes: []corev1.Volume{{Name: "claim", VolumeSource: corev1.VolumeSource{
						PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "web-to-claim", ReadOnly: true},
					}}},
				},
			}
			Expect(c.Create(ctx, reader)).To(Succeed())
			DeferCleanup(func() { _ = c.Delete(context.Background(), reader) })
			Eventually(func() corev1.PodPhase {
				_ = c.Get(ctx, client.ObjectKeyFromObject(reader), reader)
				return reader.Status.Phase
			}).WithTimeout(3*time.Minute).Should(Or(Equal(corev1.PodSucceeded), Equal(corev1.PodFailed)), func() string { return testbed.DescribePods(ctx, c, vmNS) })
			Expect(reader.Status.Phase).To(Equal(corev1.PodSucceeded), testbed.DescribePods(ctx, c, vmNS))
			sum := sha256.Sum256(hello)
			Expect(reader.Status.ContainerStatuses).To(ConsistOf(HaveField("State.Terminated.Message", hex.EncodeToString(sum[:])+" 644")),
				"the file as the guest wrote it: its bytes and its mode")
		})
	}

	It("keeps the owner's own inline cloud-config: its marker file is written too", func() {
		Expect(Markers(web.console)).To(HaveKeyWithValue("marker", "the owner's own cloud-config ran"))
	})

	It("restores, inside the guest, a deleted file from its snapshot, byte-identical", func() {
		sum := sha256.Sum256([]byte("hello from the guest\n"))
		Expect(Markers(web.console)).To(HaveKeyWithValue("restore", "identical "+hex.EncodeToString(sum[:])))
	})

	// db is the second VM's guest console.
	var dbConsole string

	It("gives a VM that brings its own cloud-init Secret the secret disk; its guest connects from the disk", func() {
		Expect(web.snapshot).NotTo(BeEmpty(), "the first VM's snapshot")
		userData := DBConfig(web.snapshot)
		Expect(c.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "db-userdata", Namespace: vmNS},
			Data:       map[string][]byte{"userdata": []byte(userData)},
		})).To(Succeed())
		vm := bed.Guest(TypicalVM("db"))
		vm.Namespace = vmNS
		vm.Annotations = map[string]string{v1alpha1.AnnotationServer: bslsNS + "/main", v1alpha1.AnnotationPaths: "/srv/db"}
		vm.Spec.Template.Spec.Volumes[1].CloudInitNoCloud.UserDataSecretRef.Name = "db-userdata"
		Expect(c.Create(ctx, vm)).To(Succeed())
		stored := &kubevirtv1.VirtualMachine{}
		Expect(c.Get(ctx, client.ObjectKeyFromObject(vm), stored)).To(Succeed())
		Expect(stored.Spec.Template.Spec.Volumes[1]).To(Equal(vm.Spec.Template.Spec.Volumes[1]), "the owner's cloud-init volume is kept")
		Expect(stored.Spec.Template.Spec.Volumes).To(ContainElement(HaveField("Name", mutate.DiskVolume)))
		owners := &corev1.Secret{}
		Expect(c.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: "db-userdata"}, owners)).To(Succeed())
		Expect(string(owners.Data["userdata"])).To(Equal(userData), "the owner's cloud-init Secret is untouched")
		waitForUser("db@team-a")

		res := bed.Boot(stored)
		dbConsole = res.Console
		m := Markers(res.Console)
		Expect(m["status"]).To(ContainSubstring(connected("db@team-a")), "the guest's services said:\n%s", Logs(res.Console))
		Expect(m["snapshots"]).To(Equal("1"))
		Eventually(vmEvents("db")).WithTimeout(30 * time.Second).Should(ContainElement(
			And(HavePrefix("Normal SnapshotCreated: Snapshot"), ContainSubstring("of /srv/db: 25 bytes in 1 files"))))
	})

	It("keeps one VM's snapshots from another: the second guest can neither list nor restore the first's", func() {
		m := Markers(dbConsole)
		Expect(m).To(HaveKeyWithValue("visible", "1"), "all the snapshots the second guest can list: its own")
		Expect(m).To(HaveKeyWithValue("mine", "1"), "its own snapshots, listed by source")
		Expect(m).To(HaveKeyWithValue("others", "0"), "the first VM's snapshots, listed by source the same way")
		Expect(m).To(HaveKeyWithValue("own", "restored"), "restoring its own snapshot the same way, by ID and path")
		Expect(m["steal"]).To(HavePrefix("refused"), "restoring the first VM's snapshot by its ID and path")
	})

	It("revokes a deleted VM's user: its old credentials are refused, and other VMs keep theirs", func() {
		Expect(web.password).NotTo(BeEmpty(), "the first VM's password")
		Expect(c.Delete(ctx, &kubevirtv1.VirtualMachine{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: vmNS}})).To(Succeed())
		Eventually(usersOfShard("web@team-a")).WithTimeout(30 * time.Second).ShouldNot(ContainSubstring("web@team-a"))
		Eventually(func() string {
			out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, serverURL(), bsls.Status.TLSFingerprint, "web@team-a", web.password)
			if err == nil {
				return "accepted"
			}
			return out
		}).WithTimeout(30*time.Second).WithPolling(time.Second).Should(Or(ContainSubstring("access denied"), ContainSubstring("Unauthenticated")),
			"the server's answer to the deleted VM's credentials")

		s := &corev1.Secret{}
		Expect(c.Get(ctx, types.NamespacedName{Namespace: vmNS, Name: v1alpha1.CredentialSecretName("db")}, s)).To(Succeed())
		out, err := testbed.NewKopiaClient(GinkgoT()).ConnectPinned(ctx, serverURL(), bsls.Status.TLSFingerprint, "db@team-a", string(s.Data[v1alpha1.SecretKeyPassword]))
		Expect(err).NotTo(HaveOccurred(), out)
	})
}
