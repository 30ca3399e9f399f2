package kopiaserver

import (
	"go/ast"
	"go/parser"
	"go/token"
	"go/types"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// decideNow is the clock of every decide case.
var decideNow = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// decideBSLS is the BSLS of the decide cases: filesystem storage, every
// default, at generation 3, changed by mutate.
func decideBSLS(mutate ...func(*v1alpha1.BackupStorageLocationServer)) *v1alpha1.BackupStorageLocationServer {
	b := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup", Generation: 3},
		Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}},
	}
	for _, m := range mutate {
		m(b)
	}
	return b
}

// opened is a BSLS whose server opened the repository before.
func opened(b *v1alpha1.BackupStorageLocationServer) {
	b.Status.RepositoryOpened = &metav1.Time{Time: decideNow.Add(-time.Hour)}
	b.Status.Conditions = []metav1.Condition{{
		Type: v1alpha1.ConditionRepositoryReady, Status: metav1.ConditionTrue, Reason: ReasonRepositoryOpened,
		Message: "The server opened the repository on PersistentVolumeClaim main-repository", ObservedGeneration: 2,
	}}
}

// space is a storage state's measured space.
func space(free, capacity uint64) *maintenancestate.StorageSpace {
	return &maintenancestate.StorageSpace{FreeBytes: free, CapacityBytes: capacity}
}

// users is a UserSet of the given usernames; their hashes do not matter
// to decide.
func users(names ...string) UserSet {
	set := UserSet{Count: len(names)}
	for _, n := range names {
		add(&set.Shards[userset.ShardOf(n)], n)
	}
	return set
}

func add[V any](m *map[string]V, key string) {
	if *m == nil {
		*m = map[string]V{}
	}
	var zero V
	(*m)[key] = zero
}

// deployment is the server's Deployment with available of replicas pods
// available.
func deployment(replicas, available int32) *appsv1.Deployment {
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "main-server", Namespace: "backup"},
		Spec:       appsv1.DeploymentSpec{Replicas: ptr.To(replicas)},
		Status:     appsv1.DeploymentStatus{Replicas: replicas, AvailableReplicas: available},
	}
}

// initFailed is a server pod whose init container exited with code 1,
// logging message.
func initFailed(name, message string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "backup"},
		Status: corev1.PodStatus{InitContainerStatuses: []corev1.ContainerStatus{{
			Name: "init",
			// Restarting after the failure: the last termination counts.
			State:                corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}},
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: message + "\n"}},
		}}},
	}
}

// waiting is a server pod whose container kopia waits for reason.
func waiting(name, reason, message string) corev1.Pod {
	return corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "backup"},
		Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{
			Name: "kopia", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason, Message: message}},
		}}},
	}
}

// issued is the certificate of the controller's own CA, to be renewed at
// renewAt.
func issued(renewAt time.Time) *certificateResult {
	return &certificateResult{
		material: &tlsMaterial{CA: []byte("ca"), Pin: "pin", Checksum: "checksum"},
		source:   "the controller's CA in Secret main-ca", renewAt: renewAt,
	}
}

// wantCondition is what a decide case expects of one condition: its
// status, reason, and phrases of its message.
type wantCondition struct {
	status  metav1.ConditionStatus
	reason  string
	message []string
}

// decideCase is one row of the decide table: observations and what decide
// must make of them. Conditions not in want are not checked by the row.
type decideCase struct {
	name    string
	obs     func(*observations)
	want    map[string]wantCondition
	opened  bool
	requeue time.Duration
}

// lostState is what a verification that ended at verified publishes when
// the storage lost two packs and damaged one: five snapshots of three paths
// of two VMs reference what was lost.
func lostState(verified time.Time) *maintenancestate.IntegrityState {
	return &maintenancestate.IntegrityState{
		CheckedAt: verified, VerifiedAt: verified, Contents: 1000, Packs: 30, ReadPacks: 3, ReadBytes: 1 << 20,
		MissingPacks: []string{"p1", "p2"}, DamagedPacks: []string{"q1"}, LostContents: 40,
		DamagedSnapshots: 5, DamagedSince: verified,
		Damaged: []maintenancestate.DamagedSource{
			{User: "web", Host: "team-a", Path: "/var/www", Snapshots: 3, Files: 12, Oldest: verified.Add(-72 * time.Hour), Newest: verified.Add(-time.Hour), IDs: []string{"k3", "k2", "k1"}, Healing: true},
			{User: "web", Host: "team-a", Path: "/etc", Snapshots: 1, Files: 1, Oldest: verified.Add(-time.Hour), Newest: verified.Add(-time.Hour), IDs: []string{"k4"}, Healing: true},
			{User: "db", Host: "team-b", Path: "/srv", Snapshots: 1, Files: 2, Oldest: verified.Add(-48 * time.Hour), Newest: verified.Add(-48 * time.Hour), IDs: []string{"k9"}},
		},
	}
}

// decideCases cover every condition reason (TestDecideCoversEveryReason).
var decideCases = []decideCase{
	{
		name: "a new BSLS whose Deployment was just written waits for its pod",
		obs:  func(o *observations) { o.Deployment = deployment(1, 0) },
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionTrue, ReasonCertificateIssued, []string{"Secret main-tls holds the server's certificate for main.backup.svc from the controller's CA in Secret main-ca"}},
			v1alpha1.ConditionRepositoryReady:  {metav1.ConditionUnknown, ReasonStorageResolved, []string{"PersistentVolumeClaim main-repository", "waiting for the server pod to open the repository"}},
			v1alpha1.ConditionServerAvailable:  {metav1.ConditionFalse, ReasonServerStarting, []string{"Deployment main-server has no available server pod yet"}},
			v1alpha1.ConditionUsersSynced:      {metav1.ConditionFalse, ReasonWaitingForServer, []string{"0 users written to the users Secrets; no server pod has applied them yet"}},
			v1alpha1.ConditionReady:            {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryReady, ServerAvailable, UsersSynced"}},
		},
		requeue: RecheckSecrets,
	},
	{
		name: "an available server opened the repository and applies the users",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup", "db@backup")
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionTrue, ReasonRepositoryOpened, []string{"The server opened the repository on PersistentVolumeClaim main-repository"}},
			v1alpha1.ConditionServerAvailable: {metav1.ConditionTrue, ReasonServerAvailable, []string{"1 of 1 server pods available"}},
			v1alpha1.ConditionUsersSynced:     {metav1.ConditionTrue, ReasonUsersSynced, []string{"2 users written; the server applies them by diff at once"}},
			v1alpha1.ConditionReady:           {metav1.ConditionTrue, ReasonReady, []string{"Guests can connect to https://main.backup.svc:51515"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "no server pod has checked the storage: StorageAvailable is Unknown, and Ready does not wait for it",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			// A pod that is gone said so long ago; it no longer counts.
			o.Storage = map[string]maintenancestate.StorageState{"main-server-old": {Error: "connection refused", Since: decideNow.Add(-time.Hour), CheckedAt: decideNow.Add(-maintenancestate.StorageStale - time.Second)}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageAvailable: {metav1.ConditionUnknown, ReasonStorageNotChecked, []string{"No server pod has checked the repository's storage lately"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "every server pod reaches the storage",
		obs: func(o *observations) {
			o.Deployment = deployment(2, 2)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow}, "main-server-b": {Available: true, Since: decideNow, CheckedAt: decideNow.Add(-time.Minute)}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageAvailable: {metav1.ConditionTrue, ReasonStorageReachable, []string{"2 server pods checked the repository's storage within 3m0s and reached it"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: 2*time.Minute + time.Second, // main-server-b's state grows stale,
	},
	{
		name: "a server pod could not apply the users to a full storage: UsersSynced is False with the storage's words",
		obs: func(o *observations) {
			o.Deployment = deployment(2, 2)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{
				"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow, UsersNotApplied: "write users: no space left on device"},
				"main-server-b": {Available: true, Since: decideNow, CheckedAt: decideNow},
				"main-server-c": {Available: true, Since: decideNow, CheckedAt: decideNow.Add(-maintenancestate.StorageStale - time.Second), UsersNotApplied: "a pod that is gone"},
			}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionUsersSynced: {metav1.ConditionFalse, ReasonUsersNotApplied, []string{
				"1 users written to the users Secrets, but the repository did not take them (server pod main-server-a: write users: no space left on device)",
				"removed users and changed passwords are refused meanwhile by the session gate",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: UsersSynced"}},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second, // the fresh states grow stale
	},
	{
		name: "a server pod cannot reach the storage: StorageAvailable is False with the storage's words, and the BSLS is not Ready",
		obs: func(o *observations) {
			o.Deployment = deployment(2, 2)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{
				"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow},
				"main-server-b": {Error: "dial tcp 10.0.0.1:9000: connect: connection refused", Since: decideNow, CheckedAt: decideNow},
			}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageAvailable: {metav1.ConditionFalse, ReasonStorageUnavailable, []string{
				"server pod main-server-b since " + decideNow.UTC().Format(time.RFC3339) + ": dial tcp 10.0.0.1:9000: connect: connection refused",
				"guests' snapshots fail until it does",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: StorageAvailable"}},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "the volume has space: StorageSpace is True and says how much",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow, Space: space(40<<20, 64<<20)}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageSpace: {metav1.ConditionTrue, ReasonSufficient, []string{"PersistentVolumeClaim main-repository) has 40.0 MiB free of 64.0 MiB (62%), as server pod main-server-a measured", "below 10% this condition warns"}},
			v1alpha1.ConditionReady:        {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "the volume is low on space: StorageSpace is False LowSpace with what to do, and the BSLS stays Ready",
		obs: func(o *observations) {
			o.Deployment = deployment(2, 2)
			o.Users = users("web@backup")
			// The pods share the volume; the lowest measurement counts.
			o.Storage = map[string]maintenancestate.StorageState{
				"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow, Space: space(8<<20, 64<<20)},
				"main-server-b": {Available: true, Since: decideNow, CheckedAt: decideNow, Space: space(5<<20, 64<<20)},
			}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageSpace: {metav1.ConditionFalse, ReasonLowSpace, []string{
				"has 5.0 MiB free of 64.0 MiB (7%), as server pod main-server-b measured, below 10%",
				"Grow PersistentVolumeClaim backup/main-repository (its StorageClass must allow volume expansion)", "lower retention (spec.repository.defaultPolicy)",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "a guest filled the volume: Kopia removed the pack it could not finish, so less than a pack is free, which is full",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow, Space: space(7<<20, 100<<30)}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageSpace: {metav1.ConditionFalse, ReasonStorageFull, []string{
				"is full, 7.0 MiB free of 100.0 GiB (0%)", "less than Kopia's next pack may need (20.0 MiB)",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: StorageSpace"}},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "the volume has no byte free: StorageSpace is False StorageFull, and the BSLS is not Ready",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow, Space: space(0, 64<<20)}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageSpace: {metav1.ConditionFalse, ReasonStorageFull, []string{
				"is full, 0 B free of 64.0 MiB (0%)", "guests' snapshots fail", "snapshot again by themselves", "Grow PersistentVolumeClaim backup/main-repository", "Make room first",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: StorageSpace"}},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "an S3 bucket refused a write over its quota: StorageFull with the storage's words; a stale refusal of a pod that is gone does not count",
		obs: func(o *observations) {
			o.BSLS = decideBSLS(func(b *v1alpha1.BackupStorageLocationServer) {
				b.Spec.Storage = v1alpha1.StorageSpec{S3: &v1alpha1.S3Storage{Bucket: "backups", Prefix: "main/"}}
			})
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{
				"main-server-a":   {Available: true, Since: decideNow, CheckedAt: decideNow, Refused: "PutBlob: XMinioAdminBucketQuotaExceeded: Bucket quota exceeded", RefusedAt: decideNow.Add(-time.Minute)},
				"main-server-old": {Available: true, Since: decideNow, CheckedAt: decideNow.Add(-maintenancestate.StorageStale - time.Second), Refused: "old refusal", RefusedAt: decideNow.Add(-time.Hour)},
			}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageSpace: {metav1.ConditionFalse, ReasonStorageFull, []string{
				"The repository's storage (s3://backups/main/) refused writes for want of space (server pod main-server-a since " + decideNow.Add(-time.Minute).Format(time.RFC3339) + ": PutBlob: XMinioAdminBucketQuotaExceeded: Bucket quota exceeded)",
				"Raise the bucket's quota",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: StorageSpace"}},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "an S3 bucket that refused nothing: StorageSpace is Unknown NotMeasured, and Ready does not wait for it",
		obs: func(o *observations) {
			o.BSLS = decideBSLS(func(b *v1alpha1.BackupStorageLocationServer) {
				b.Spec.Storage = v1alpha1.StorageSpec{S3: &v1alpha1.S3Storage{Bucket: "backups"}}
			})
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Storage = map[string]maintenancestate.StorageState{"main-server-a": {Available: true, Since: decideNow, CheckedAt: decideNow}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionStorageSpace: {metav1.ConditionUnknown, ReasonNotMeasured, []string{"an S3 bucket cannot tell it"}},
			v1alpha1.ConditionReady:        {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: maintenancestate.StorageStale + time.Second,
	},
	{
		name: "users of two namespaces, one Secret refused: the message says both",
		obs: func(o *observations) {
			o.Deployment = deployment(2, 1)
			o.Users = users("web@team-a", "db@team-b")
			o.Users.Refused = map[string]string{"team-c/x-guestbackup": "namespace team-c is not selected"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionServerAvailable: {metav1.ConditionTrue, ReasonServerAvailable, []string{"1 of 2 server pods available"}},
			v1alpha1.ConditionUsersSynced: {metav1.ConditionTrue, ReasonUsersSynced, []string{
				"2 users written", "1 credential Secrets refused (see Events)", "VMs of 2 namespaces (team-a, team-b) share this repository's deduplication", "one BackupStorageLocationServer per trust domain",
			}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "passwords not hashed yet: the first three Secrets are named",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Users.Pending = []string{"backup/a-guestbackup", "backup/b-guestbackup", "backup/c-guestbackup", "backup/d-guestbackup"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionUsersSynced: {metav1.ConditionFalse, ReasonHashPending, []string{
				"1 users written; 4 wait for their password to be hashed, or their VirtualMachine to be stored or to adopt them: backup/a-guestbackup, backup/b-guestbackup, backup/c-guestbackup and 1 more",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: UsersSynced"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "a Secret whose VM may still be in admission: looked at again when its grace ends",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Users.Pending = []string{"backup/new-guestbackup"}
			o.Users.RecheckAfter = 4 * time.Second
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionUsersSynced: {metav1.ConditionFalse, ReasonHashPending, []string{"VirtualMachine to be stored", "backup/new-guestbackup"}},
		},
		opened:  true,
		requeue: 4 * time.Second,
	},
	{
		name: "scaled to zero after the repository was opened: RepositoryReady stays as it was",
		obs: func(o *observations) {
			opened(o.BSLS)
			o.Deployment = deployment(0, 0)
			// A pod on its way out does not speak for a server scaled to zero.
			o.Pods = []corev1.Pod{initFailed("main-server-a", "going away")}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionTrue, ReasonRepositoryOpened, []string{"PersistentVolumeClaim main-repository"}},
			v1alpha1.ConditionServerAvailable: {metav1.ConditionFalse, ReasonScaledToZero, []string{"spec.replicas is 0: no server runs; the repository is untouched"}},
			v1alpha1.ConditionUsersSynced:     {metav1.ConditionFalse, ReasonWaitingForServer, []string{"no server pod has applied them yet"}},
			v1alpha1.ConditionReady:           {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: ServerAvailable, UsersSynced"}},
		},
		requeue: RecheckSecrets,
	},
	{
		name: "a container that cannot start: the message says which and why",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 0)
			o.Pods = []corev1.Pod{
				waiting("main-server-b", "ImagePullBackOff", `Back-off pulling image "guestbackup:typo"`),
				waiting("main-server-a", "ContainerCreating", ""),
			}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionServerAvailable: {metav1.ConditionFalse, ReasonServerStarting, []string{`pod main-server-b, container kopia: ImagePullBackOff Back-off pulling image "guestbackup:typo"`}},
		},
		requeue: RecheckSecrets,
	},
	{
		name: "the init container cannot open a repository with the generated password: restore the old one",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 0)
			o.Pods = []corev1.Pod{initFailed("main-server-a", "error connecting to repository: invalid repository password")}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonRepositoryInitFailed, []string{
				"pod main-server-a: the init container, which opens the repository, exited with code 1: error connecting to repository: invalid repository password.",
				"replace Secret main-repository (key password) with the one backed up from the old cluster, then delete the server pod",
			}},
			v1alpha1.ConditionServerAvailable: {metav1.ConditionFalse, ReasonServerStarting, []string{"Deployment main-server has no available server pod yet"}},
		},
		requeue: RecheckSecrets,
	},
	{
		name: "the init container cannot reach the storage: its log says so, and nothing about passwords",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 0)
			o.Pods = []corev1.Pod{initFailed("main-server-a", "dial tcp 10.0.0.1:9000: connection refused")}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonRepositoryInitFailed, []string{"exited with code 1: dial tcp 10.0.0.1:9000: connection refused"}},
		},
		requeue: RecheckSecrets,
	},
	{
		name: "a claim that does not exist: no server until it does, looked at again soon",
		obs: func(o *observations) {
			o.BSLS.Spec.Storage.Filesystem.ClaimName = "nope"
			o.RepositoryProblem = &problem{ReasonClaimNotFound, "PersistentVolumeClaim nope not found in namespace backup: create it, or remove storage.filesystem.claimName so that the controller creates one"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonClaimNotFound, []string{"PersistentVolumeClaim nope not found in namespace backup: create it"}},
			v1alpha1.ConditionServerAvailable: {metav1.ConditionFalse, ReasonWaitingForPrerequisites, []string{"The server starts once RepositoryReady and CertificateReady have no problem left"}},
			v1alpha1.ConditionUsersSynced:     {metav1.ConditionFalse, ReasonWaitingForServer, nil},
			v1alpha1.ConditionReady:           {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryReady, ServerAvailable, UsersSynced"}},
		},
		requeue: retryProblem,
	},
	{
		name: "two replicas on a ReadWriteOnce claim: the storage cannot be shared, says which fixes exist",
		obs: func(o *observations) {
			o.BSLS.Spec.Replicas = ptr.To[int32](2)
			o.RepositoryProblem = claimShared(o.BSLS, &corev1.PersistentVolumeClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "main-repository"},
				Spec:       corev1.PersistentVolumeClaimSpec{AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce}},
			})
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonStorageNotShared, []string{
				"spec.replicas is 2 but PersistentVolumeClaim main-repository is not ReadWriteMany (access modes [ReadWriteOnce])",
				"Set replicas to 1, or use S3 storage or a ReadWriteMany claim"}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, nil},
		},
		requeue: retryProblem,
	},
	{
		name: "S3 credentials without a key",
		obs: func(o *observations) {
			o.RepositoryProblem = &problem{ReasonCredentialsInvalid, "Secret s3-creds has no key AWS_SECRET_ACCESS_KEY"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonCredentialsInvalid, []string{"Secret s3-creds has no key AWS_SECRET_ACCESS_KEY"}},
			v1alpha1.ConditionServerAvailable: {metav1.ConditionFalse, ReasonWaitingForPrerequisites, nil},
		},
		requeue: retryProblem,
	},
	{
		name: "a Velero BSL that is not there",
		obs: func(o *observations) {
			o.RepositoryProblem = &problem{ReasonBackupStorageLocationInvalid, "Velero BackupStorageLocation velero/default not found: create it, or fix storage.backupStorageLocation"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonBackupStorageLocationInvalid, []string{"create it, or fix storage.backupStorageLocation"}},
		},
		requeue: retryProblem,
	},
	{
		name: "a Velero BSL that does not consent",
		obs: func(o *observations) {
			o.BSLS.Spec.Storage = v1alpha1.StorageSpec{BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Namespace: "velero", Name: "default"}}
			o.RepositoryProblem = veleroConsentRequired(o.BSLS.Spec.Storage.BackupStorageLocation, o.BSLS)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonVeleroConsentRequired, []string{"a Velero admin adds backup/main to the comma-separated list in its annotation guestbackup.io/allowed-servers"}},
		},
		requeue: retryProblem,
	},
	{
		name: "the admin's password Secret is missing",
		obs: func(o *observations) {
			o.BSLS.Spec.Repository.PasswordSecretRef = &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "repo-pass"}, Key: "pw"}
			_, o.RepositoryProblem = decidePassword(o.BSLS, false, false)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonPasswordSecretInvalid, []string{"Secret repo-pass not found in namespace backup: create it with the repository password in key pw"}},
		},
		requeue: retryProblem,
	},
	{
		name: "the generated password is gone after the repository was opened, while the server still runs",
		obs: func(o *observations) {
			opened(o.BSLS)
			_, o.RepositoryProblem = decidePassword(o.BSLS, false, false)
			o.Deployment = deployment(1, 1)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryReady: {metav1.ConditionFalse, ReasonRepositoryPasswordLost, []string{"Restore Secret main-repository (key password) in namespace backup"}},
			// What runs is reported as it is.
			v1alpha1.ConditionServerAvailable: {metav1.ConditionTrue, ReasonServerAvailable, []string{"1 of 1 server pods available"}},
			v1alpha1.ConditionReady:           {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryReady"}},
		},
		requeue: retryProblem,
	},
	{
		name: "cert-manager has not issued yet",
		obs: func(o *observations) {
			o.Certificate = nil
			o.CertificateProblem = &problem{ReasonCertificatePending, "Certificate main-server from cert-manager ClusterIssuer absent is not issued yet: no Secret main-tls yet"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionFalse, ReasonCertificatePending, []string{"Certificate main-server from cert-manager ClusterIssuer absent is not issued yet"}},
			v1alpha1.ConditionRepositoryReady:  {metav1.ConditionUnknown, ReasonStorageResolved, nil},
			v1alpha1.ConditionServerAvailable:  {metav1.ConditionFalse, ReasonWaitingForPrerequisites, nil},
			v1alpha1.ConditionReady:            {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: CertificateReady, RepositoryReady, ServerAvailable, UsersSynced"}},
		},
		requeue: retryProblem,
	},
	{
		name: "an issuer named while cert-manager is not installed",
		obs: func(o *observations) {
			o.Certificate = nil
			o.CertificateProblem = &problem{ReasonCertManagerMissing, "tls.issuerRef names cert-manager ClusterIssuer ca, but cert-manager's Certificate CRD is not installed: install cert-manager, or remove tls.issuerRef"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionFalse, ReasonCertManagerMissing, []string{"install cert-manager, or remove tls.issuerRef"}},
		},
		requeue: retryProblem,
	},
	{
		name: "the admin's TLS Secret is missing",
		obs: func(o *observations) {
			o.Certificate = nil
			o.CertificateProblem = &problem{ReasonTLSSecretNotFound, "Secret my-tls not found in namespace backup: create a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt, or remove tls.secretName"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionFalse, ReasonTLSSecretNotFound, []string{"Secret my-tls not found in namespace backup"}},
		},
		requeue: retryProblem,
	},
	{
		name: "the admin's TLS Secret has no CA, while an old server still runs",
		obs: func(o *observations) {
			o.Certificate = nil
			_, o.CertificateProblem = checkTLSSecret(&corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "leaf-only"},
				Data:       map[string][]byte{corev1.TLSCertKey: []byte("x"), corev1.TLSPrivateKeyKey: []byte("y")},
			}, EndpointHost(o.BSLS))
			o.Deployment = deployment(1, 1)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionFalse, ReasonTLSSecretInvalid, []string{"Secret leaf-only has no key ca.crt"}},
			v1alpha1.ConditionRepositoryReady:  {metav1.ConditionTrue, ReasonRepositoryOpened, nil},
			v1alpha1.ConditionServerAvailable:  {metav1.ConditionTrue, ReasonServerAvailable, nil},
			v1alpha1.ConditionReady:            {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: CertificateReady"}},
		},
		opened:  true,
		requeue: retryProblem,
	},
	{
		name: "a leaf due for renewal within the recheck period is looked at then",
		obs:  func(o *observations) { o.Certificate = issued(decideNow.Add(90 * time.Second)) },
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionTrue, ReasonCertificateIssued, nil},
		},
		requeue: 90 * time.Second,
	},
	{
		name:    "a leaf overdue for renewal is looked at again in a second, not in a busy loop",
		obs:     func(o *observations) { o.Certificate = issued(decideNow.Add(-time.Hour)) },
		requeue: time.Second,
	},
	{
		name: "no verification published (a new BSLS, or a server pod of an older guestbackup): RepositoryIntact is Unknown, and Ready does not wait for it",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionUnknown, ReasonNotVerified, []string{"No verification of the repository is published yet", "a server pod of an older guestbackup does not"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "verification turned off, nothing published: Unknown, saying so",
		obs: func(o *observations) {
			o.BSLS.Spec.Repository.Maintenance = &v1alpha1.MaintenanceSpec{VerifyInterval: &metav1.Duration{}}
			o.Deployment = deployment(1, 1)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionUnknown, ReasonNotVerified, []string{"Verification is off (spec.repository.maintenance.verifyInterval is 0s): nothing checks"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "verification turned off after an intact pass: Unknown, with what that pass found",
		obs: func(o *observations) {
			o.BSLS.Spec.Repository.Maintenance = &v1alpha1.MaintenanceSpec{Disabled: true}
			o.Deployment = deployment(1, 1)
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, VerifiedAt: decideNow, Contents: 3, Packs: 1}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionUnknown, ReasonNotVerified, []string{
				"Verification is off (spec.repository.maintenance.disabled is set); the last complete one, ended " + decideNow.Format(time.RFC3339) + ", found all 3 contents",
			}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "verification turned off after a loss: still False, saying nothing will say when it heals",
		obs: func(o *observations) {
			o.BSLS.Spec.Repository.Maintenance = &v1alpha1.MaintenanceSpec{VerifyInterval: &metav1.Duration{}}
			o.Deployment = deployment(1, 1)
			o.Integrity = lostState(decideNow)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{"verification is off (spec.repository.maintenance.verifyInterval is 0s), so nothing says when it heals"}},
			v1alpha1.ConditionReady:            {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryIntact"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "the first verification could not complete: Unknown with the storage's words, and Ready does not wait for it",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Users = users("web@backup")
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, Error: "list packs: dial tcp 10.0.0.1:9000: connection refused"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionUnknown, ReasonVerificationFailed, []string{
				"The last verification, ended " + decideNow.Format(time.RFC3339) + ", could not complete: list packs: dial tcp 10.0.0.1:9000: connection refused; no verification has completed yet",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "the last verification failed after an intact one: Unknown, saying both",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, Error: "timeout", VerifiedAt: decideNow.Add(-24 * time.Hour), Contents: 10, Packs: 2, ReadPacks: 1, ReadBytes: 4096}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionUnknown, ReasonVerificationFailed, []string{
				"ended " + decideNow.Format(time.RFC3339) + ", could not complete: timeout",
				"the last complete one, ended " + decideNow.Add(-24*time.Hour).Format(time.RFC3339) + ", found all 10 contents the index names are in the 2 packs the storage holds",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "what the server pod published of its verification is unreadable: Unknown, naming the ConfigMap",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.IntegrityUnreadable = "state ConfigMap, key integrity: invalid character 'x'"
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionUnknown, ReasonVerificationFailed, []string{"in ConfigMap main-maintenance cannot be read (state ConfigMap, key integrity: invalid character 'x')"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "every content present: True, saying when and what was read back",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, VerifiedAt: decideNow, Contents: 1200, Packs: 34, ReadPacks: 5, ReadBytes: 104857600}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionTrue, ReasonIntact, []string{
				"Verified at " + decideNow.Format(time.RFC3339) + ": all 1200 contents the index names are in the 34 packs the storage holds, and 5 packs (104857600 bytes) read back and decrypted",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "snapshots reference lost data: False, naming the packs, the VMs and how it heals, and the BSLS is not Ready",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = lostState(decideNow)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{
				"The repository's storage lost data (packs p1, p2 missing from the storage; pack q1 holding data that does not read back; 40 contents lost and dropped from the index): 5 snapshots of 2 VMs reference it and cannot be restored whole: team-a/web:/var/www (3), team-a/web:/etc (1), team-b/db:/srv (1).",
				"Everything else in those snapshots restores; each guest uploads the lost files again at its next snapshot if they are unchanged",
				"Last complete verification ended " + decideNow.Format(time.RFC3339),
				"see docs/operations.md, \"Verification\"",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryIntact"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "a loss found, then a pass that failed: False wins, and says the failure",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = lostState(decideNow.Add(-time.Hour))
			o.Integrity.CheckedAt, o.Integrity.Error = decideNow, "connection reset"
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{
				"5 snapshots of 2 VMs",
				"the last verification, ended " + decideNow.Format(time.RFC3339) + ", could not complete: connection reset",
			}},
			v1alpha1.ConditionReady: {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryIntact"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "more damaged paths than the pod lists, and as many packs as it lists: the message says the lists are cut",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = lostState(decideNow)
			o.Integrity.DamagedSnapshots = 9000
			o.Integrity.MissingPacks = nil
			for i := range maintenancestate.MaxListedPacks {
				o.Integrity.MissingPacks = append(o.Integrity.MissingPacks, "p"+strconv.Itoa(i))
			}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{
				"20 or more packs, among them p0, p1, p2, missing from the storage",
				"9000 snapshots of at least 2 VMs reference it",
				"status.integrity.damaged is truncated: it lists 3 paths with 5 of those snapshots.",
			}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "a pass finds contents lost that no snapshot references: False while it says so",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = lostState(decideNow)
			o.Integrity.Damaged, o.Integrity.DamagedSnapshots = nil, 0
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{"40 contents lost and dropped from the index): no snapshot references it."}},
			v1alpha1.ConditionReady:            {metav1.ConditionFalse, ReasonNotReady, []string{"Not True: RepositoryIntact"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "lost contents the index still holds as deleted: the message says guests upload them only later",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.Integrity = lostState(decideNow)
			o.Integrity.Pending = 7
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{
				"7 lost contents stay in the index, marked deleted, until Kopia's maintenance lets go of them (a day or two): guests upload those again only then.",
			}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "a restarted server pod whose first pass failed knows no earlier pass: the loss the status holds stays False",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.BSLS.Status.Integrity = integrityStatus(lostState(decideNow.Add(-time.Hour)), "", nil)
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, Error: "open repository: timeout"}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionFalse, ReasonContentsLost, []string{
				"5 snapshots of 2 VMs",
				"Last complete verification ended " + decideNow.Add(-time.Hour).Format(time.RFC3339) + "; the last verification, ended " + decideNow.Format(time.RFC3339) + ", could not complete: open repository: timeout",
			}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "a pass that settled the snapshots that could no longer heal: True, saying what it settled",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.BSLS.Status.Integrity = integrityStatus(lostState(decideNow.Add(-time.Hour)), "", nil)
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, VerifiedAt: decideNow, Contents: 1040, Packs: 31,
				Settled: []maintenancestate.DamagedSource{{User: "db", Host: "team-b", Path: "/srv", Snapshots: 1, Files: 2}, {User: "web", Host: "team-a", Path: "/etc", Snapshots: 1, Files: 1}}}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionTrue, ReasonIntact, []string{
				"; settled 2 damaged snapshots of 2 VMs that could no longer heal: their 3 lost files are replaced by stubs, .INVALID.<name>, and every other file restores (each VM gets a BackupSettled Event)",
			}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "the pass after the guests uploaded the lost data again: True again",
		obs: func(o *observations) {
			o.Deployment = deployment(1, 1)
			o.BSLS.Status.Integrity = integrityStatus(lostState(decideNow.Add(-time.Hour)), "", nil)
			o.Integrity = &maintenancestate.IntegrityState{CheckedAt: decideNow, VerifiedAt: decideNow, Contents: 1040, Packs: 31, ReadPacks: 3, ReadBytes: 1 << 20}
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionRepositoryIntact: {metav1.ConditionTrue, ReasonIntact, []string{"Verified at " + decideNow.Format(time.RFC3339) + ": all 1040 contents"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, nil},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
	{
		name: "a clientURL is what guests connect to",
		obs: func(o *observations) {
			o.BSLS.Spec.ClientURL = "https://backup.example.com:443"
			o.Deployment = deployment(1, 1)
		},
		want: map[string]wantCondition{
			v1alpha1.ConditionCertificateReady: {metav1.ConditionTrue, ReasonCertificateIssued, []string{"certificate for backup.example.com from"}},
			v1alpha1.ConditionReady:            {metav1.ConditionTrue, ReasonReady, []string{"Guests can connect to https://backup.example.com:443"}},
		},
		opened:  true,
		requeue: RecheckSecrets,
	},
}

func TestDecide(t *testing.T) {
	order := []string{v1alpha1.ConditionCertificateReady, v1alpha1.ConditionRepositoryReady, v1alpha1.ConditionServerAvailable, v1alpha1.ConditionUsersSynced, v1alpha1.ConditionStorageAvailable, v1alpha1.ConditionStorageSpace, v1alpha1.ConditionRepositoryIntact, v1alpha1.ConditionReady}
	for _, tc := range decideCases {
		t.Run(tc.name, func(t *testing.T) {
			obs := observations{BSLS: decideBSLS(), Now: decideNow, Certificate: issued(decideNow.Add(40 * 24 * time.Hour))}
			if tc.obs != nil {
				tc.obs(&obs)
			}
			before := obs.BSLS.DeepCopy()
			d := decide(obs)
			if !equalBSLS(before, obs.BSLS) {
				t.Errorf("decide changed the BSLS it was given")
			}

			var types []string
			for _, c := range d.Conditions {
				types = append(types, c.Type)
				if c.Message == "" || strings.Contains(c.Message, "%!") {
					t.Errorf("%s: message %q", c.Type, c.Message)
				}
				if prev := meta.FindStatusCondition(obs.BSLS.Status.Conditions, c.Type); prev != nil && c == *prev {
					continue // kept as the previous pass wrote it
				}
				if c.ObservedGeneration != obs.BSLS.Generation {
					t.Errorf("%s: observedGeneration %d, want %d", c.Type, c.ObservedGeneration, obs.BSLS.Generation)
				}
			}
			if !slices.Equal(types, order) {
				t.Errorf("conditions %v, want %v", types, order)
			}
			for typ, want := range tc.want {
				c := meta.FindStatusCondition(d.Conditions, typ)
				if c == nil {
					t.Errorf("no condition %s", typ)
					continue
				}
				if c.Status != want.status || c.Reason != want.reason {
					t.Errorf("%s: %s %s (%q), want %s %s", typ, c.Status, c.Reason, c.Message, want.status, want.reason)
				}
				for _, phrase := range want.message {
					if !strings.Contains(c.Message, phrase) {
						t.Errorf("%s: message %q lacks %q", typ, c.Message, phrase)
					}
				}
			}
			if d.RepositoryOpened != tc.opened {
				t.Errorf("repository opened %t, want %t", d.RepositoryOpened, tc.opened)
			}
			if d.RequeueAfter != tc.requeue {
				t.Errorf("requeue after %s, want %s", d.RequeueAfter, tc.requeue)
			}
		})
	}
}

// equalBSLS compares two BSLSs by their fields that decide reads.
func equalBSLS(a, b *v1alpha1.BackupStorageLocationServer) bool {
	return a.Generation == b.Generation && a.Spec.ClientURL == b.Spec.ClientURL &&
		slices.EqualFunc(a.Status.Conditions, b.Status.Conditions, func(x, y metav1.Condition) bool { return x == y }) &&
		a.Status.RepositoryOpened.Equal(b.Status.RepositoryOpened)
}

// reasonConstants are the Reason* constants of conditions.go, by the
// comment that opens their block, with their values and doc comments.
func reasonConstants(t *testing.T) map[string][]reasonConstant {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "conditions.go", nil, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]reasonConstant{}
	for _, decl := range f.Decls {
		gen, ok := decl.(*ast.GenDecl)
		if !ok || gen.Tok != token.CONST {
			continue
		}
		block := strings.SplitN(gen.Doc.Text(), "\n", 2)[0]
		for _, spec := range gen.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Reason") {
					continue
				}
				rc := reasonConstant{name: name.Name, doc: vs.Doc.Text()}
				if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					rc.value, _ = strconv.Unquote(lit.Value)
				}
				blocks[block] = append(blocks[block], rc)
			}
		}
	}
	return blocks
}

type reasonConstant struct{ name, value, doc string }

// TestDecideCoversEveryReason fails when a condition reason is declared
// in conditions.go but no decide case expects it, and when a reason is
// not a documented constant whose value is its name.
func TestDecideCoversEveryReason(t *testing.T) {
	blocks := reasonConstants(t)
	conditionReasons := blocks["Reasons of a BSLS's conditions. Each names what happened in words an admin"]
	if len(conditionReasons) == 0 {
		t.Fatalf("no condition reasons found in conditions.go: blocks %v", blocks)
	}
	covered := map[string]bool{}
	for _, tc := range decideCases {
		for _, w := range tc.want {
			covered[w.reason] = true
		}
	}
	for _, rc := range conditionReasons {
		if !covered[rc.value] {
			t.Errorf("no decide case expects condition reason %s (%q): add one to decideCases", rc.name, rc.value)
		}
	}
	for _, rcs := range blocks {
		for _, rc := range rcs {
			if rc.value != strings.TrimPrefix(rc.name, "Reason") {
				t.Errorf("%s = %q: a reason's value is its name without the Reason prefix", rc.name, rc.value)
			}
			if !strings.HasPrefix(rc.doc, rc.name+" ") && !strings.HasPrefix(rc.doc, rc.name+":") {
				t.Errorf("%s has no doc comment saying what it means", rc.name)
			}
		}
	}
}

// TestReasonsAreConstants fails when the package states a condition's or
// an Event's reason as a bare string rather than a documented Reason*
// constant: in a problem, a metav1.Condition or a recorded Event.
func TestReasonsAreConstants(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		literal := func(e ast.Expr) bool {
			lit, ok := e.(*ast.BasicLit)
			return ok && lit.Kind == token.STRING
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.CompositeLit:
				typ := types.ExprString(n.Type)
				for i, elt := range n.Elts {
					kv, keyed := elt.(*ast.KeyValueExpr)
					switch {
					case typ == "problem" && !keyed && i == 0 && literal(elt),
						keyed && types.ExprString(kv.Key) == "Reason" && literal(kv.Value):
						t.Errorf("%s: reason %s is a bare string: declare a documented Reason* constant in conditions.go", fset.Position(elt.Pos()), types.ExprString(elt))
					}
				}
			case *ast.CallExpr:
				if sel, ok := n.Fun.(*ast.SelectorExpr); ok && slices.Contains([]string{"Event", "Eventf"}, sel.Sel.Name) && len(n.Args) >= 3 && literal(n.Args[2]) {
					t.Errorf("%s: Event reason %s is a bare string: declare a documented Reason* constant in conditions.go", fset.Position(n.Pos()), types.ExprString(n.Args[2]))
				}
			}
			return true
		})
	}
}
