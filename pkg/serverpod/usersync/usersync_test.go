package usersync_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	gtypes "github.com/onsi/gomega/types"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/activity"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// provisioned bounds how long a Secret change may take to reach the server.
const provisioned = 30 * time.Second

// guest is a VM's identity and password, hashed once as the controller does.
type guest struct {
	user, password string
	hash           identity.Hash
}

func newGuest(user string) guest {
	password := testbed.RandomPassword()
	h, err := identity.NewHash(password, identity.Scrypt)
	Expect(err).NotTo(HaveOccurred())
	return guest{user: user, password: password, hash: h}
}

// writeUsers writes every shard Secret so that they list exactly guests.
func writeUsers(guests ...guest) { writeUsersKeeping(nil, guests...) }

func writeShard(ctx context.Context, shard int, data []byte) {
	writeShardData(ctx, shard, map[string][]byte{userset.Key: data})
}

func writeShardData(ctx context.Context, shard int, data map[string][]byte) {
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name: userset.SecretName(bsls, shard), Namespace: namespace,
			Labels: map[string]string{userset.Label: bsls},
		},
		Data: data,
	}
	err := apiServer.Client.Create(ctx, secret)
	if apierrors.IsAlreadyExists(err) {
		err = apiServer.Client.Update(ctx, secret)
	}
	Expect(err).NotTo(HaveOccurred())
}

// connect runs a real kopia client as a guest would.
func connect(user, password string) (*testbed.KopiaClient, error) {
	client := testbed.NewKopiaClient(GinkgoT())
	out, err := client.Connect(context.Background(), server.URL, server.CA.CertPEM(), user, password)
	if err != nil {
		return nil, &connectError{err: err, out: out}
	}
	return client, nil
}

type connectError struct {
	err error
	out string
}

func (e *connectError) Error() string { return e.err.Error() + ": " + e.out }

func canConnect(g guest) func() error {
	return func() error { _, err := connect(g.user, g.password); return err }
}

var _ = Describe("The user-sync loop", Ordered, func() {
	alice, bob := newGuest("alice@team-a"), newGuest("bob@team-b")

	It("changes nothing until every shard Secret exists", func() {
		// A user already in the repository, as on storage a new cluster attaches.
		earlier := newGuest("earlier@team-a")
		Expect(server.SetUsers(context.Background(), map[string]identity.Hash{earlier.user: earlier.hash})).To(Succeed())

		Eventually(syncer.Ready).WithTimeout(provisioned).Should(MatchError(ContainSubstring("main-users-0")))
		writeShard(context.Background(), 0, nil)
		Eventually(syncer.Ready).WithTimeout(provisioned).Should(MatchError(ContainSubstring("main-users-1")))
		Expect(syncer.Ready()).To(MatchError(ContainSubstring("the controller writes all 16 shards")))
		Expect(canConnect(earlier)()).To(Succeed(), "an incomplete view must not revoke anyone")
	})

	It("provisions users: a real client authenticates within seconds", func() {
		writeUsers(alice, bob)
		Eventually(syncer.Ready).WithTimeout(provisioned).Should(Succeed())
		Expect(syncer.Users()).To(Equal(2))
		Eventually(canConnect(alice)).WithTimeout(provisioned).Should(Succeed())
		Eventually(canConnect(bob)).WithTimeout(provisioned).Should(Succeed())
	})

	It("authenticates a guest's report by the password the repository is synced to, and nothing else", func() {
		Expect(syncer.Authenticate(alice.user, alice.password)).To(BeTrue())
		Expect(syncer.Authenticate(alice.user, bob.password)).To(BeFalse(), "another guest's password")
		Expect(syncer.Authenticate(bob.user, alice.password)).To(BeFalse())
		Expect(syncer.Authenticate("nobody@team-a", alice.password)).To(BeFalse(), "a user no Secret lists")
		Expect(syncer.Authenticate("Alice@team-a", alice.password)).To(BeFalse(), "not a Kopia user name")
	})

	It("keeps users apart: one cannot list the other's snapshots", func() {
		ctx := context.Background()
		aliceClient, err := connect(alice.user, alice.password)
		Expect(err).NotTo(HaveOccurred())
		data := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(data, "secret.txt"), []byte("alice's\n"), 0o600)).To(Succeed())
		out, err := aliceClient.Run(ctx, "snapshot", "create", data)
		Expect(err).NotTo(HaveOccurred(), out)

		bobClient, err := connect(bob.user, bob.password)
		Expect(err).NotTo(HaveOccurred())
		out, err = bobClient.Run(ctx, "snapshot", "list", "--all")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).NotTo(ContainSubstring("alice"))
		Expect(out).NotTo(ContainSubstring(data))
	})

	It("applies a new password: the old one is refused, the new one accepted", func() {
		oldPassword := alice.password
		alice = newGuest(alice.user)
		writeUsers(alice, bob)
		Eventually(func() error { _, err := connect(alice.user, oldPassword); return err }).
			WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")))
		Expect(canConnect(alice)()).To(Succeed())
	})

	It("keeps every user while a shard is malformed", func() {
		shard := userset.ShardOf(bob.user)
		writeShard(context.Background(), shard, []byte("not a users list\n"))
		Eventually(syncer.Ready).WithTimeout(provisioned).Should(MatchError(ContainSubstring("line 1")))
		Expect(canConnect(bob)()).To(Succeed())
		writeUsers(alice, bob)
		Eventually(syncer.Ready).WithTimeout(provisioned).Should(Succeed())
	})

	It("revokes a user removed from its Secret", func() {
		writeUsers(alice)
		Eventually(canConnect(bob)).WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")))
		Expect(canConnect(alice)()).To(Succeed())
		Expect(syncer.Users()).To(Equal(1))
	})

	It("undoes, within a resync period, users another writer added behind its back", func() {
		mallory := newGuest("mallory@team-c")
		// SetUsers returns once the other writer's user is in the
		// repository. Whether it is still there when the spec looks, or
		// could log in meanwhile, depends on when the syncer's next pass
		// runs, which the spec does not control: it looks only at the end
		// state the syncer must reach.
		Expect(server.SetUsers(context.Background(), map[string]identity.Hash{mallory.user: mallory.hash})).To(Succeed())
		Eventually(repositoryUsers).WithTimeout(provisioned).ShouldNot(HaveKey(mallory.user))
		Eventually(canConnect(mallory)).WithTimeout(provisioned).Should(MatchError(ContainSubstring("access denied")))
		Expect(canConnect(alice)()).To(Succeed())
	})

	It("keeps the repository's access rules exactly guestbackup's, even when not append-only", func() {
		Eventually(repositoryACLs).WithTimeout(provisioned).Should(HaveLen(len(kopiauser.DefaultACLs())))
		for _, e := range repositoryACLs() {
			Expect(e.Labels).To(Equal(map[string]string{manifest.TypeLabelKey: "acl", kopiauser.LabelManagedACL: "true"}))
		}
	})

	It("removes an ACL manifest it did not write, and reports it: log, counter, Event on the BSLS", func() {
		ctx := context.Background()
		before := testutil.ToFloat64(usersync.ForeignACLsRemoved)
		forged := kopiauser.ACL{User: "alice@team-a", Target: map[string]string{manifest.TypeLabelKey: "user"}, Access: kopiauser.AccessFull}
		Expect(repo.WriteSession(ctx, observer, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
			_, err := w.PutManifest(ctx, map[string]string{manifest.TypeLabelKey: "acl", "username": "alice", "hostname": "team-a"}, forged)
			return err
		})).To(Succeed())
		// Not checked here: that the forged manifest is in the repository
		// before the syncer's next pass, which may come at any moment. The
		// counter and the Event below prove it was there and was removed.

		Eventually(repositoryACLs).WithTimeout(provisioned).Should(HaveLen(len(kopiauser.DefaultACLs())))
		Eventually(func() float64 { return testutil.ToFloat64(usersync.ForeignACLsRemoved) }).WithTimeout(provisioned).Should(Equal(before + 1))
		Eventually(func() []corev1.Event {
			list := &corev1.EventList{}
			Expect(apiServer.Client.List(ctx, list, client.InNamespace(namespace))).To(Succeed())
			return list.Items
		}).WithTimeout(provisioned).Should(ContainElement(And(
			HaveField("Type", corev1.EventTypeWarning),
			HaveField("Reason", usersync.ReasonForeignACLRemoved),
			HaveField("InvolvedObject.Kind", "BackupStorageLocationServer"),
			HaveField("InvolvedObject.Name", bsls),
			HaveField("InvolvedObject.UID", types.UID(bslsUID)),
			HaveField("Message", ContainSubstring("alice@team-a FULL type=user")),
		)))
	})

	// A BSLS with several replicas runs one Kopia server and one user sync
	// per pod, on one repository: a user the other pod's sync wrote must
	// authenticate at this pod's server too, though this pod's sync finds
	// nothing to write.
	It("makes a second replica's server know a user the first wrote before it started", func() {
		ctx := context.Background()
		second := testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{RepoPath: server.RepoPath, RepoPassword: server.RepoPassword, CA: server.CA})
		connectTo := func(srv *testbed.KopiaServer, g guest) func() error {
			return func() error {
				out, err := testbed.NewKopiaClient(GinkgoT()).Connect(ctx, srv.URL, srv.CA.CertPEM(), g.user, g.password)
				if err != nil {
					return &connectError{err: err, out: out}
				}
				return nil
			}
		}
		carol := newGuest("carol@team-a")
		writeUsersKeeping(repositoryUsers(), carol)
		Eventually(connectTo(server, carol)).WithTimeout(provisioned).Should(Succeed(), "the first replica wrote carol")
		Expect(connectTo(second, carol)()).To(MatchError(ContainSubstring("access denied")), "the second server loaded the repository before carol")

		replica := runReplica(second, "second")
		Eventually(replica.Ready).WithTimeout(provisioned).Should(Succeed())
		Eventually(connectTo(second, carol)).WithTimeout(provisioned).Should(Succeed(), "the second replica's server knows carol")
	})
	It("hands a guest its own requests, and records its results as the repository holds them", func() {
		ctx := context.Background()
		for shard := range userset.Shards {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: activity.ConfigMapName(bsls, shard), Namespace: namespace, Labels: map[string]string{activity.Label: bsls}}}
			Expect(client.IgnoreAlreadyExists(apiServer.Client.Create(ctx, cm))).To(Succeed())
		}
		for shard := range activity.CatalogueShards {
			cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: activity.CatalogueConfigMapName(bsls, shard), Namespace: namespace, Labels: map[string]string{activity.Label: bsls}}}
			Expect(client.IgnoreAlreadyExists(apiServer.Client.Create(ctx, cm))).To(Succeed())
		}
		users := repositoryUsers()
		Expect(users).To(HaveKey(alice.user))
		// In alice's shard: what tells their requests apart is the user.
		dave := newGuest(sameShard(alice.user))
		users[dave.user] = dave.hash
		one, two := GinkgoT().TempDir(), GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(one, "a.txt"), []byte("one\n"), 0o600)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(two, "b.txt"), []byte("two\n"), 0o600)).To(Succeed())
		now := userset.Request{UID: "0b7c8f2a-1111-4000-8000-000000000001", User: alice.user, Kind: userset.RequestSnapshot, Name: "now", Paths: []string{one}, Order: "2026-12-07T08:00:01Z/now"}
		both := userset.Request{UID: "0b7c8f2a-1111-4000-8000-000000000002", User: alice.user, Kind: userset.RequestSnapshot, Name: "both", Paths: []string{one, two}, Order: "2026-12-07T08:00:00Z/both"}
		daves := userset.Request{UID: "0b7c8f2a-1111-4000-8000-000000000003", User: dave.user, Kind: userset.RequestSnapshot, Name: "daves", Paths: []string{two}}
		writeUsersWithRequests(users, now, both, daves)
		Eventually(func() ([]userset.Request, error) { return syncer.Pending(alice.user) }).WithTimeout(provisioned).Should(Equal([]userset.Request{both, now}),
			"oldest first: the order its guest carries them out in")
		Expect(syncer.Pending(dave.user)).To(ConsistOf(daves), "a guest is handed its own requests only")

		By("refusing a result from a guest the request is not addressed to")
		Expect(syncer.Result(ctx, dave.user, now.UID, "Running", "")).To(MatchError(clientserver.ErrUnknownRequest))

		By("taking the snapshots the request's tag marks under the guest's own identity, and no other's")
		aliceClient, err := connect(alice.user, alice.password)
		Expect(err).NotTo(HaveOccurred())
		Expect(syncer.Result(ctx, alice.user, now.UID, "Running", "")).To(Succeed())
		tag := "--tags=" + userset.RequestTag + ":" + now.UID
		out, err := aliceClient.Run(ctx, "snapshot", "create", tag, one)
		Expect(err).NotTo(HaveOccurred(), out)
		ids, err := aliceClient.SnapshotIDs(ctx, one)
		Expect(err).NotTo(HaveOccurred())
		Expect(ids).To(HaveLen(1))
		// Dave's guest forges alice's request tag on a snapshot of its own.
		var daveClient *testbed.KopiaClient
		Eventually(func() (err error) { daveClient, err = connect(dave.user, dave.password); return err }).WithTimeout(provisioned).Should(Succeed())
		out, err = daveClient.Run(ctx, "snapshot", "create", tag, two)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(syncer.Result(ctx, alice.user, now.UID, "Succeeded", "took it")).To(Succeed())
		Eventually(func() []activity.Result { return activityOf(alice.user).Results }).WithTimeout(provisioned).Should(ConsistOf(And(
			HaveField("UID", now.UID), HaveField("Phase", "Succeeded"), HaveField("Message", "took it"), HaveField("Ended", Not(BeNil())),
			HaveField("Snapshots", ConsistOf(And(HaveField("ID", ids[0]), HaveField("Path", one), HaveField("Files", BeEquivalentTo(1))))),
		)))
		Expect(syncer.Pending(alice.user)).To(ConsistOf(both), "a finished request is not handed out again")
		Expect(syncer.Result(ctx, alice.user, now.UID, "Failed", "again")).To(Succeed(), "a repeated ending changes nothing")
		Expect(activityOf(alice.user).Results).To(ContainElement(HaveField("Phase", "Succeeded")))

		By("recording a success without a snapshot of each path as the failure it is")
		out, err = aliceClient.Run(ctx, "snapshot", "create", "--tags="+userset.RequestTag+":"+both.UID, two)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(syncer.Result(ctx, alice.user, both.UID, "Succeeded", "")).To(Succeed())
		Eventually(func() []activity.Result { return activityOf(alice.user).Results }).WithTimeout(provisioned).Should(ContainElement(And(
			HaveField("UID", both.UID), HaveField("Phase", "Failed"),
			HaveField("Message", "the guest reported success, but the repository holds no snapshot of "+one+" for this request"),
			HaveField("Snapshots", ConsistOf(HaveField("Path", two))),
		)))

		By("listing the guest's newest snapshots, newest first, in its catalogue, and no other guest's")
		ofTwo, err := aliceClient.SnapshotIDs(ctx, two)
		Expect(err).NotTo(HaveOccurred())
		Expect(ofTwo).To(HaveLen(1))
		newestTwo := func(c []activity.Snapshot) []activity.Snapshot { return c[:min(2, len(c))] }
		Eventually(func() []activity.Snapshot { return catalogueOf(alice.user) }).WithTimeout(provisioned).Should(WithTransform(newestTwo, HaveExactElements(
			And(HaveField("ID", ofTwo[0]), HaveField("Path", two), HaveField("Files", BeEquivalentTo(1)), HaveField("Bytes", BeEquivalentTo(4))),
			And(HaveField("ID", ids[0]), HaveField("Path", one)),
		)))
		Eventually(func() []activity.Snapshot { return catalogueOf(dave.user) }).WithTimeout(provisioned).Should(ConsistOf(HaveField("Path", two)),
			"dave's own snapshot, forged tag and all, in dave's catalogue")

		By("dropping the results of requests the Secrets no longer list")
		writeUsersWithRequests(users, daves)
		Eventually(func() ([]userset.Request, error) { return syncer.Pending(alice.user) }).WithTimeout(provisioned).Should(BeEmpty())
		Expect(syncer.Result(ctx, alice.user, daves.UID, "Running", "")).To(MatchError(clientserver.ErrUnknownRequest))
		Expect(syncer.Result(ctx, dave.user, daves.UID, "Running", "")).To(Succeed())
		Eventually(func() []activity.Result { return activityOf(alice.user).Results }).WithTimeout(provisioned).Should(BeEmpty())
		Expect(activityOf(dave.user).Results).To(ConsistOf(HaveField("Phase", "Running")))
	})

	// A BSLS with replicas balances a guest's connections over them: its
	// answers to one request may reach two server pods, each of which
	// writes the activity ConfigMaps.
	It("keeps a guest's result whichever replica its answers reach, and whichever writes last", func() {
		ctx := context.Background()
		users := repositoryUsers()
		Expect(users).To(HaveKey(alice.user))
		data := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(data, "c.txt"), []byte("three\n"), 0o600)).To(Succeed())
		twice := userset.Request{UID: "0b7c8f2a-1111-4000-8000-000000000004", User: alice.user, Kind: userset.RequestSnapshot, Name: "twice", Paths: []string{data}}
		writeUsersWithRequests(users, twice)

		replica := runReplica(server, "replica")
		Eventually(func() ([]userset.Request, error) { return replica.Pending(alice.user) }).WithTimeout(provisioned).Should(ConsistOf(twice))
		Eventually(func() ([]userset.Request, error) { return syncer.Pending(alice.user) }).WithTimeout(provisioned).Should(ConsistOf(twice))

		By("taking the guest's Running through one pod and its ending through the other")
		Expect(syncer.Result(ctx, alice.user, twice.UID, "Running", "")).To(Succeed())
		aliceClient, err := connect(alice.user, alice.password)
		Expect(err).NotTo(HaveOccurred())
		out, err := aliceClient.Run(ctx, "snapshot", "create", "--tags="+userset.RequestTag+":"+twice.UID, data)
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(replica.Result(ctx, alice.user, twice.UID, "Succeeded", "through the other")).To(Succeed())
		succeeded := And(HaveField("UID", twice.UID), HaveField("Phase", "Succeeded"), HaveField("Message", "through the other"),
			HaveField("Snapshots", ConsistOf(HaveField("Path", data))))
		Expect(activityOf(alice.user).Results).To(ConsistOf(succeeded), "recorded at once, where every pod and the controller read it")

		By("keeping it when the pod that saw only Running publishes its own news of the guest")
		syncer.Report(alice.user, activity.Report{Kind: clientdist.ReportHookFailed, Message: "heard by the first pod", At: time.Now().UTC().Truncate(time.Second)})
		Eventually(func() *activity.Report { return activityOf(alice.user).Report }).WithTimeout(provisioned).Should(HaveField("Message", "heard by the first pod"))
		Expect(activityOf(alice.user).Results).To(ConsistOf(succeeded))

		By("taking no second ending, through either pod")
		Expect(syncer.Result(ctx, alice.user, twice.UID, "Running", "")).To(MatchError(clientserver.ErrRequestEnded),
			"a guest handed the request again by a pod that had not heard of the ending starts nothing")
		Expect(syncer.Result(ctx, alice.user, twice.UID, "Failed", "late")).To(Succeed())
		Expect(activityOf(alice.user).Results).To(ConsistOf(succeeded))
		Expect(syncer.Pending(alice.user)).To(BeEmpty(), "the first pod found the ending the other recorded")
		Expect(replica.Pending(alice.user)).To(BeEmpty())

		By("dropping it, on every pod's next publish, once the Secrets no longer list the request")
		writeUsersWithRequests(users)
		Eventually(func() error { return syncer.Result(ctx, alice.user, twice.UID, "Running", "") }).WithTimeout(provisioned).Should(MatchError(clientserver.ErrUnknownRequest))
		syncer.Report(alice.user, activity.Report{Kind: clientdist.ReportHookFailed, Message: "heard again", At: time.Now().UTC().Add(time.Second).Truncate(time.Second)})
		Eventually(func() *activity.Report { return activityOf(alice.user).Report }).WithTimeout(provisioned).Should(HaveField("Message", "heard again"))
		Expect(activityOf(alice.user).Results).To(BeEmpty())
	})

	// The server pod, not the guest, chooses what a restore restores
	// from: among the snapshots of the request's source identity only,
	// of the snapshot source that holds each path, by ID, time or the
	// latest; a request it cannot carry out ends at its start, saying why.
	It("chooses what a restore restores from, under the source's identity only", func() {
		ctx := context.Background()
		users := repositoryUsers()
		Expect(users).To(HaveKey(alice.user))
		eve := newGuest("eve@team-a")
		users[eve.user] = eve.hash
		writeUsersWithRequests(users)
		data := GinkgoT().TempDir()
		Expect(os.MkdirAll(filepath.Join(data, "sub"), 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(data, "sub", "a.txt"), []byte("first\n"), 0o600)).To(Succeed())
		Expect(os.Symlink("/etc", filepath.Join(data, "link"))).To(Succeed())
		aliceClient, err := connect(alice.user, alice.password)
		Expect(err).NotTo(HaveOccurred())
		snapshot := func(c *testbed.KopiaClient, dir string) string {
			out, err := c.Run(ctx, "snapshot", "create", dir)
			Expect(err).NotTo(HaveOccurred(), out)
			ids, err := c.SnapshotIDs(ctx, dir)
			Expect(err).NotTo(HaveOccurred())
			return ids[len(ids)-1]
		}
		first := snapshot(aliceClient, data)
		between := time.Now().UTC()
		Expect(os.WriteFile(filepath.Join(data, "sub", "a.txt"), []byte("second, longer\n"), 0o600)).To(Succeed())
		second := snapshot(aliceClient, data)
		var eveClient *testbed.KopiaClient
		Eventually(func() (err error) { eveClient, err = connect(eve.user, eve.password); return err }).WithTimeout(provisioned).Should(Succeed())
		eves := snapshot(eveClient, GinkgoT().TempDir())

		restore := func(n int, change func(*userset.Request)) userset.Request {
			r := userset.Request{UID: fmt.Sprintf("0b7c8f2a-2222-4000-8000-%012d", n), User: alice.user, Kind: userset.RequestRestore, Name: fmt.Sprintf("restore-%d", n),
				Paths: []string{filepath.Join(data, "sub", "a.txt")}, Source: alice.user, Target: "/var/lib/guestbackup/restores/x"}
			change(&r)
			return r
		}
		byID := restore(1, func(r *userset.Request) { r.SnapshotID = first })
		latest := restore(2, func(*userset.Request) {})
		before := restore(3, func(r *userset.Request) { r.Before = &between; r.Paths = []string{data} })
		unknown := restore(4, func(r *userset.Request) { r.Paths = []string{"/nowhere/x"} })
		others := restore(5, func(r *userset.Request) { r.SnapshotID = eves })
		through := restore(6, func(r *userset.Request) { r.Paths = []string{filepath.Join(data, "link", "passwd")} })
		writeUsersWithRequests(users, byID, latest, before, unknown)
		Eventually(func() ([]userset.Request, error) { return syncer.Pending(alice.user) }).WithTimeout(provisioned).Should(HaveLen(4))

		By("by ID, by the latest, and by time, each with what lies at its path in the snapshot")
		// start answers Running for r, and returns what the result
		// records, which is the plan handed to the guest.
		start := func(r userset.Request) []activity.Snapshot {
			GinkgoHelper()
			Expect(syncer.Result(ctx, alice.user, r.UID, "Running", "")).To(Succeed())
			plan, err := syncer.Plan(ctx, alice.user, r.UID)
			Expect(err).NotTo(HaveOccurred())
			res := activityOf(alice.user).Results
			i := slices.IndexFunc(res, func(res activity.Result) bool { return res.UID == r.UID })
			Expect(i).NotTo(BeNumerically("<", 0))
			Expect(plan).To(HaveLen(len(res[i].Snapshots)))
			for j, step := range plan {
				Expect(step).To(Equal(clientdist.PlanStep{ID: res[i].Snapshots[j].ID, Root: res[i].Snapshots[j].Root, Path: res[i].Snapshots[j].Path}))
			}
			return res[i].Snapshots
		}
		Expect(start(byID)).To(ConsistOf(And(HaveField("ID", first), HaveField("Path", byID.Paths[0]), HaveField("Root", data),
			HaveField("Files", BeEquivalentTo(1)), HaveField("Bytes", BeEquivalentTo(len("first\n"))))))
		Expect(start(latest)).To(ConsistOf(And(HaveField("ID", second), HaveField("Bytes", BeEquivalentTo(len("second, longer\n"))))))
		Expect(start(before)).To(ConsistOf(And(HaveField("ID", first), HaveField("Path", data), HaveField("Files", BeEquivalentTo(1)))))
		Expect(start(latest)).To(ConsistOf(HaveField("ID", second)), "a repeated Running is handed the same plan")
		Expect(activityOf(alice.user).Results).To(ContainElement(And(HaveField("UID", byID.UID), HaveField("Phase", "Running"), HaveField("Snapshots", HaveLen(1)))))

		By("recording how far a running restore got, as far as its plan goes, and told by its guest alone")
		restoredOf := func(uid string) int {
			GinkgoHelper()
			res := activityOf(alice.user).Results
			i := slices.IndexFunc(res, func(res activity.Result) bool { return res.UID == uid })
			Expect(i).NotTo(BeNumerically("<", 0))
			return res[i].Restored
		}
		Expect(syncer.Progress(ctx, eve.user, latest.UID, 1)).To(MatchError(clientserver.ErrUnknownRequest), "another guest's restore")
		Expect(syncer.Progress(ctx, alice.user, unknown.UID, 1)).To(MatchError(clientserver.ErrUnknownRequest), "a restore not started has no plan")
		Expect(syncer.Progress(ctx, alice.user, latest.UID, 2)).To(Succeed())
		Expect(restoredOf(latest.UID)).To(BeZero(), "beyond its one-path plan: nothing recorded")
		Expect(syncer.Progress(ctx, alice.user, latest.UID, 1)).To(Succeed())
		Expect(restoredOf(latest.UID)).To(Equal(1))
		Expect(activityOf(alice.user).Results).To(ContainElement(And(HaveField("UID", latest.UID), HaveField("Phase", "Running"), HaveField("Snapshots", ConsistOf(HaveField("ID", second))))),
			"the plan stands")

		By("keeping the plan when the guest ends the restore")
		Expect(syncer.Result(ctx, alice.user, byID.UID, "Succeeded", "Restored 1 files")).To(Succeed())
		Expect(syncer.Progress(ctx, alice.user, byID.UID, 1)).To(MatchError(clientserver.ErrRequestEnded), "progress after the ending")
		Expect(activityOf(alice.user).Results).To(ContainElement(And(HaveField("UID", byID.UID), HaveField("Phase", "Succeeded"),
			HaveField("Snapshots", ConsistOf(HaveField("ID", first))))))

		By("ending at its start a restore of a path no snapshot holds")
		Expect(syncer.Result(ctx, alice.user, unknown.UID, "Running", "")).To(And(
			MatchError(clientserver.ErrRequestEnded), MatchError(ContainSubstring(alice.user+" has no snapshot of /nowhere/x or of a folder holding it (its snapshots are of "))))

		By("refusing another identity's snapshot, and a path through a snapshot's symbolic link")
		writeUsersWithRequests(users, others, through)
		Eventually(func() ([]userset.Request, error) { return syncer.Pending(alice.user) }).WithTimeout(provisioned).Should(HaveLen(2))
		Expect(syncer.Result(ctx, alice.user, others.UID, "Running", "")).To(MatchError(ContainSubstring(alice.user + " has no snapshot " + eves + ": give an ID")))
		Expect(syncer.Result(ctx, alice.user, through.UID, "Running", "")).To(MatchError(ContainSubstring(filepath.Join(data, "link") + " is not a folder in it")))
		Expect(activityOf(alice.user).Results).To(ContainElement(And(HaveField("UID", others.UID), HaveField("Phase", "Failed"), HaveField("Snapshots", BeEmpty()))))

		By("listing a dry run from the repository alone: no guest is handed it, nor may answer it")
		dry := restore(7, func(r *userset.Request) { r.DryRun = true; r.Paths = []string{data} })
		writeUsersWithRequests(users, dry)
		Eventually(func() []activity.Result { return activityOf(alice.user).Results }).WithTimeout(provisioned).Should(ContainElement(And(
			HaveField("UID", dry.UID), HaveField("Phase", "Succeeded"), HaveField("Ended", Not(BeNil())),
			HaveField("Snapshots", ConsistOf(HaveField("ID", second))),
			HaveField("Listing.Files", BeEquivalentTo(1)), HaveField("Listing.Bytes", BeEquivalentTo(len("second, longer\n"))), HaveField("Listing.Truncated", BeFalse()),
			// A folder's time, as kopia reads it back, is the newest of
			// what it holds: a file's is its own.
			HaveField("Listing.Entries", WithTransform(func(es []activity.Entry) []string {
				var out []string
				for _, e := range es {
					out = append(out, fmt.Sprintf("%s %s %d %t", strings.TrimPrefix(e.Path, "/var/lib/guestbackup/restores/x"+data), e.Type, e.Size, e.ModTime.IsZero()))
				}
				return out
			}, Equal([]string{
				" directory 15 false", "/link symlink 0 false", "/sub directory 15 false", "/sub/a.txt file 15 false",
			}))),
			HaveField("Listing.Entries", ContainElement(And(HaveField("Path", "/var/lib/guestbackup/restores/x"+data+"/sub/a.txt"), HaveField("ModTime", fileTime(filepath.Join(data, "sub", "a.txt")))))),
		)), "the listing, in path order, where the restore would write")
		Expect(syncer.Pending(alice.user)).NotTo(ContainElement(HaveField("UID", dry.UID)))
		Expect(syncer.Result(ctx, alice.user, dry.UID, "Running", "")).To(HaveOccurred(), "a guest has nothing to do with a dry run")

		By("listing a file's versions across the snapshots, newest first, each changed or not, from the repository alone")
		Expect(os.WriteFile(filepath.Join(data, "sub", "a.txt"), []byte("third, the longest yet\n"), 0o600)).To(Succeed())
		third := snapshot(aliceClient, data)
		fourth := snapshot(aliceClient, data)
		history := restore(8, func(r *userset.Request) { r.DryRun, r.History = true, true })
		bounded := restore(9, func(r *userset.Request) { r.DryRun, r.History, r.Before = true, true, &between })
		nowhere := restore(10, func(r *userset.Request) {
			r.DryRun, r.History, r.Paths = true, true, []string{filepath.Join(data, "sub", "b.txt")}
		})
		writeUsersWithRequests(users, history, bounded, nowhere)
		version := func(id string, size int, changed bool) gtypes.GomegaMatcher {
			return And(HaveField("ID", id), HaveField("Type", "file"), HaveField("Size", BeEquivalentTo(size)), HaveField("Changed", changed), HaveField("ModTime", Not(BeZero())))
		}
		resultOf := func(uid string) func() *activity.Result {
			return func() *activity.Result {
				res := activityOf(alice.user).Results
				if i := slices.IndexFunc(res, func(r activity.Result) bool { return r.UID == uid }); i >= 0 {
					return &res[i]
				}
				return nil
			}
		}
		Eventually(resultOf(history.UID)).WithTimeout(provisioned).Should(And(HaveField("Phase", "Succeeded"), HaveField("Listing", BeNil()),
			HaveField("History", HaveExactElements(
				version(fourth, len("third, the longest yet\n"), false),
				version(third, len("third, the longest yet\n"), true),
				version(second, len("second, longer\n"), true),
				version(first, len("first\n"), true),
			))))
		Eventually(resultOf(bounded.UID)).WithTimeout(provisioned).Should(HaveField("History", HaveExactElements(version(first, len("first\n"), true))),
			"only the snapshots started before the time")
		Eventually(resultOf(nowhere.UID)).WithTimeout(provisioned).Should(And(HaveField("Phase", "Failed"),
			HaveField("Message", "no complete snapshot of "+data+" by "+alice.user+" holds "+filepath.Join(data, "sub", "b.txt"))))
		writeUsersWithRequests(users)
	})
})

// fileTime is p's modification time, as a snapshot records it.
func fileTime(p string) time.Time {
	GinkgoHelper()
	fi, err := os.Stat(p)
	Expect(err).NotTo(HaveOccurred())
	return fi.ModTime().UTC()
}

// runReplica runs the user sync of another server pod of the BSLS, whose
// Kopia server is srv, with its own view of the repository, until the
// spec ends.
func runReplica(srv *testbed.KopiaServer, name string) *usersync.Syncer {
	GinkgoHelper()
	ctx := context.Background()
	r, err := repo.Open(ctx, srv.ConfigFile, srv.RepoPassword, &repo.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(func() { Expect(r.Close(context.Background())).To(Succeed()) })
	replica := usersync.New(usersync.Options{
		Client: kubernetes.NewForConfigOrDie(apiServer.Config), Namespace: namespace, BSLS: bsls, BSLSUID: bslsUID,
		Repository: r, Server: controlOf(GinkgoT(), srv), Log: GinkgoLogr.WithName(name),
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- replica.Run(runCtx) }()
	DeferCleanup(func() {
		cancel()
		Eventually(done).WithTimeout(30 * time.Second).Should(Receive(BeNil()))
	})
	return replica
}

// writeUsersKeeping writes every shard Secret so that they list the users
// of keep (hashed already) and guests.
func writeUsersKeeping(keep map[string]identity.Hash, guests ...guest) {
	shards := make([]map[string]identity.Hash, userset.Shards)
	for i := range shards {
		shards[i] = map[string]identity.Hash{}
	}
	for user, h := range keep {
		shards[userset.ShardOf(user)][user] = h
	}
	for _, g := range guests {
		shards[userset.ShardOf(g.user)][g.user] = g.hash
	}
	for i, users := range shards {
		writeShard(context.Background(), i, userset.Encode(users))
	}
}

// repositoryUsers is the users the repository holds now.
func repositoryUsers() map[string]identity.Hash {
	ctx := context.Background()
	Expect(observer.Refresh(ctx)).To(Succeed())
	users, err := kopiauser.List(ctx, observer)
	Expect(err).NotTo(HaveOccurred())
	return users
}

// repositoryACLs is the ACL manifests the repository holds now.
func repositoryACLs() []*manifest.EntryMetadata {
	ctx := context.Background()
	Expect(observer.Refresh(ctx)).To(Succeed())
	entries, err := observer.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: "acl"})
	Expect(err).NotTo(HaveOccurred())
	return entries
}

// writeUsersWithRequests writes every shard Secret so that they list the
// users of keep and requests.
func writeUsersWithRequests(keep map[string]identity.Hash, requests ...userset.Request) {
	shards := make([]map[string]identity.Hash, userset.Shards)
	for i := range shards {
		shards[i] = map[string]identity.Hash{}
	}
	for user, h := range keep {
		shards[userset.ShardOf(user)][user] = h
	}
	listed := userset.Dispatch(func() []userset.Queued {
		var q []userset.Queued
		for _, r := range requests {
			q = append(q, userset.Queued{Request: r, Order: r.Order})
		}
		return q
	}())
	for i, users := range shards {
		writeShardData(context.Background(), i, map[string][]byte{userset.Key: userset.Encode(users), userset.RequestsKey: userset.EncodeRequests(listed[i])})
	}
}

// catalogueOf is the catalogue of user its server last published.
func catalogueOf(user string) []activity.Snapshot {
	cm := &corev1.ConfigMap{}
	Expect(apiServer.Client.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: activity.CatalogueConfigMapName(bsls, activity.CatalogueShardOf(user))}, cm)).To(Succeed())
	catalogues, err := activity.DecodeCatalogues([]byte(cm.Data[activity.CatalogueKey]))
	Expect(err).NotTo(HaveOccurred())
	return catalogues[user]
}

// activityOf is the activity of user its server last published.
func activityOf(user string) activity.Guest {
	cm := &corev1.ConfigMap{}
	Expect(apiServer.Client.Get(context.Background(), types.NamespacedName{Namespace: namespace, Name: activity.ConfigMapName(bsls, userset.ShardOf(user))}, cm)).To(Succeed())
	guests, err := activity.Decode([]byte(cm.Data[activity.Key]))
	Expect(err).NotTo(HaveOccurred())
	return guests[user]
}
