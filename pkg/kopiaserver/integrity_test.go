package kopiaserver

import (
	"context"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
)

// damagedVM is a damaged path of VM team-a/<name> with snapshots
// damaged snapshots.
func damagedVM(name, path string, snapshots int64) v1alpha1.DamagedVM {
	at := metav1.NewTime(decideNow.Add(-time.Hour))
	return v1alpha1.DamagedVM{Namespace: "team-a", Name: name, Path: path, Snapshots: snapshots, Files: 2, Oldest: &at, Newest: &at, IDs: []string{"k1"}, Healing: true}
}

// verifiedWith is a status.integrity of a complete pass that lists
// damaged, with total damaged snapshots (0: their sum).
func verifiedWith(total int64, damaged ...v1alpha1.DamagedVM) *v1alpha1.IntegrityStatus {
	st := &v1alpha1.IntegrityStatus{LastVerified: &metav1.Time{Time: decideNow}, Damaged: damaged, DamagedSnapshots: total}
	if total == 0 {
		for _, d := range damaged {
			st.DamagedSnapshots += d.Snapshots
		}
	}
	return st
}

// nextPass is st as a later pass than verifiedWith's wrote it.
func nextPass(st *v1alpha1.IntegrityStatus) *v1alpha1.IntegrityStatus {
	st.LastVerified = &metav1.Time{Time: st.LastVerified.Add(10 * time.Minute)}
	return st
}

// settledBy is st with the paths a pass settled.
func settledBy(st *v1alpha1.IntegrityStatus, settled ...v1alpha1.DamagedVM) *v1alpha1.IntegrityStatus {
	st.Settled = settled
	return st
}

// The VMs' Events follow the damage as it changes between two passes'
// statuses, never at every reconcile that finds the same.
func TestDamageNotices(t *testing.T) {
	server := types.NamespacedName{Namespace: "backup", Name: "main"}
	web, etc, db := damagedVM("web", "/var/www", 3), damagedVM("web", "/etc", 1), damagedVM("db", "/srv", 1)
	more := damagedVM("web", "/var/www", 4)
	for _, tc := range []struct {
		name          string
		before, after *v1alpha1.IntegrityStatus
		want          []string // "<type> <reason> <namespace>/<name>: <message prefix>"
	}{
		{name: "nothing published", before: verifiedWith(0, web), after: nil},
		{name: "the first loss", before: nil, after: verifiedWith(0, web, db), want: []string{
			"Warning BackupDamaged team-a/web: 3 snapshots of /var/www on BackupStorageLocationServer backup/main reference data the storage lost",
			"Warning BackupDamaged team-a/db: 1 snapshot of /srv on BackupStorageLocationServer backup/main references data the storage lost",
		}},
		{name: "the same damage again", before: verifiedWith(0, web, db), after: verifiedWith(0, web, db)},
		{name: "fewer damaged snapshots of a path: nothing to warn of", before: verifiedWith(0, more), after: verifiedWith(0, web)},
		{name: "more damaged snapshots of a path", before: verifiedWith(0, web), after: verifiedWith(0, more), want: []string{
			"Warning BackupDamaged team-a/web: 4 snapshots of /var/www",
		}},
		{name: "another path of the same VM", before: verifiedWith(0, web), after: verifiedWith(0, web, etc), want: []string{
			"Warning BackupDamaged team-a/web: 1 snapshot of /etc",
		}},
		{name: "a path healed", before: verifiedWith(0, web, db), after: verifiedWith(0, web), want: []string{
			"Normal BackupHealed team-a/db: No snapshot of /srv on BackupStorageLocationServer backup/main references lost data any more (verified at " + decideNow.Format(time.RFC3339) + ")",
		}},
		{name: "every path healed", before: verifiedWith(0, web, db), after: verifiedWith(0), want: []string{
			"Normal BackupHealed team-a/web: No snapshot of /var/www",
			"Normal BackupHealed team-a/db: No snapshot of /srv",
		}},
		{name: "a path that left a truncated list may still be damaged", before: verifiedWith(0, web, db), after: verifiedWith(5000, web)},
		{name: "a truncated list still warns of what it lists anew", before: verifiedWith(0, web), after: verifiedWith(5000, web, db), want: []string{
			"Warning BackupDamaged team-a/db: 1 snapshot of /srv",
		}},
		{name: "no complete pass heals nothing", before: verifiedWith(0, web), after: &v1alpha1.IntegrityStatus{Failure: "timeout"}},
		{name: "a pass settles a path: settled, not healed", before: verifiedWith(0, web, db), after: nextPass(settledBy(verifiedWith(0, web), db)), want: []string{
			"Warning BackupSettled team-a/db: 1 damaged snapshot of /srv on BackupStorageLocationServer backup/main could no longer heal",
		}},
		{name: "the first pass to find a loss settles it at once", before: nil, after: settledBy(verifiedWith(0), db), want: []string{
			"Warning BackupSettled team-a/db: 1 damaged snapshot of /srv",
		}},
		{name: "the same settling pass again: said once", before: settledBy(verifiedWith(0, web), db), after: settledBy(verifiedWith(0, web), db)},
		{name: "what a failed pass keeps of the settling pass: said once", before: settledBy(verifiedWith(0, web), db), after: func() *v1alpha1.IntegrityStatus {
			st := settledBy(verifiedWith(0, web), db)
			st.Failure = "timeout"
			return st
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			expectNotices(t, damageNotices(server, tc.before, tc.after), tc.want)
		})
	}
}

// expectNotices checks notices, each as "<type> <reason> <namespace>/<name>:
// <message>", against the prefixes want, in order.
func expectNotices(t *testing.T, notices []vmNotice, want []string) {
	t.Helper()
	var got []string
	for _, n := range notices {
		got = append(got, n.Event.Type+" "+n.Event.Reason+" "+n.VM.String()+": "+n.Event.Message)
		if strings.Contains(n.Event.Message, "%!") {
			t.Errorf("malformed message %q", n.Event.Message)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("notices:\n%s\nwant %d:\n%s", strings.Join(got, "\n"), len(want), strings.Join(want, "\n"))
	}
	for i := range got {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("notice %d = %q, want it to start %q", i, got[i], want[i])
		}
	}
}

// What a VM's owner reads: which snapshots, what still restores and how
// they heal, in the singular and the plural.
func TestDamagedMessage(t *testing.T) {
	server := types.NamespacedName{Namespace: "backup", Name: "main"}
	oldest, newest := metav1.NewTime(decideNow.Add(-72*time.Hour)), metav1.NewTime(decideNow.Add(-time.Hour))
	for _, tc := range []struct {
		name string
		d    v1alpha1.DamagedVM
		want string
	}{
		{
			name: "healing, more snapshots than IDs listed",
			d:    v1alpha1.DamagedVM{Path: "/var/www", Snapshots: 5, Files: 7, Oldest: &oldest, Newest: &newest, IDs: []string{"k5", "k4", "k3"}, Healing: true},
			want: "5 snapshots of /var/www on BackupStorageLocationServer backup/main reference data the storage lost (started " + oldest.UTC().Format(time.RFC3339) + " to " + newest.UTC().Format(time.RFC3339) +
				"; the most recent IDs k5, k4, k3): 7 files in them miss data. Everything else in them restores (guestbackup-kopia snapshot restore --ignore-errors restores the rest and names what it skipped); those files do not restore from them until their data is uploaded again. " +
				"The guest's next snapshot uploads those files again if they are unchanged, which makes these snapshots whole; see docs/operations.md, \"Verification\"",
		},
		{
			name: "one older snapshot, no longer healing",
			d:    v1alpha1.DamagedVM{Path: "/srv", Snapshots: 1, Files: 1, Oldest: &oldest, Newest: &oldest, IDs: []string{"k1"}},
			want: "1 snapshot of /srv on BackupStorageLocationServer backup/main references data the storage lost (started " + oldest.UTC().Format(time.RFC3339) +
				"; ID k1): 1 file in it misses data. Everything else in it restores (guestbackup-kopia snapshot restore --ignore-errors restores the rest and names what it skipped); those files do not restore from it until their data is uploaded again. " +
				"The latest snapshot of /srv is whole, so it cannot heal that way: the server rewrites it with a stub for each lost file (BackupSettled); see docs/operations.md, \"Verification\"",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := damagedMessage(server, tc.d); got != tc.want {
				t.Errorf("message\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// What a VM's owner reads when snapshots that could not heal were
// rewritten: what is lost for good, and what restores.
func TestSettledVMMessage(t *testing.T) {
	server := types.NamespacedName{Namespace: "backup", Name: "main"}
	oldest, newest := metav1.NewTime(decideNow.Add(-72*time.Hour)), metav1.NewTime(decideNow.Add(-time.Hour))
	for _, tc := range []struct {
		name string
		d    v1alpha1.DamagedVM
		want string
	}{
		{
			name: "several snapshots",
			d:    v1alpha1.DamagedVM{Path: "/var/www", Snapshots: 2, Files: 3, Oldest: &oldest, Newest: &newest, IDs: []string{"k2", "k1"}},
			want: "2 damaged snapshots of /var/www on BackupStorageLocationServer backup/main could no longer heal (the guest's latest snapshot is whole, or the damage is a week old) and were rewritten (started " +
				oldest.UTC().Format(time.RFC3339) + " to " + newest.UTC().Format(time.RFC3339) + "; formerly IDs k2, k1): each of the 3 files whose data the storage lost is replaced by a stub, .INVALID.<name>, naming what was lost, and is lost from them for good; " +
				"every other file in them restores as before, under new snapshot IDs; see docs/operations.md, \"Verification\"",
		},
		{
			name: "one snapshot, one file",
			d:    v1alpha1.DamagedVM{Path: "/srv", Snapshots: 1, Files: 1, Oldest: &oldest, Newest: &oldest, IDs: []string{"k1"}},
			want: "1 damaged snapshot of /srv on BackupStorageLocationServer backup/main could no longer heal (the guest's latest snapshot is whole, or the damage is a week old) and was rewritten (started " +
				oldest.UTC().Format(time.RFC3339) + "; formerly ID k1): each of the 1 file whose data the storage lost is replaced by a stub, .INVALID.<name>, naming what was lost, and is lost from it for good; " +
				"every other file in it restores as before, under new snapshot IDs; see docs/operations.md, \"Verification\"",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := settledVMMessage(server, tc.d); got != tc.want {
				t.Errorf("message\n%q\nwant\n%q", got, tc.want)
			}
		})
	}
}

// status.integrity is the state, bounded as the state is whatever the
// pod wrote; an unreadable state keeps what the previous pass knew.
func TestIntegrityStatus(t *testing.T) {
	if got := integrityStatus(nil, "", verifiedWith(0, damagedVM("web", "/", 1))); got != nil {
		t.Errorf("nothing published: %+v, want nil", got)
	}

	previous := verifiedWith(0, damagedVM("web", "/", 1))
	got := integrityStatus(nil, "key integrity: bad", previous)
	if got.Failure != "key integrity: bad" || len(got.Damaged) != 1 || got.LastVerified == nil {
		t.Errorf("unreadable: %+v, want the previous status with the failure", got)
	}
	if previous.Failure != "" {
		t.Error("the previous status was changed")
	}
	if got := integrityStatus(nil, "bad", nil); got == nil || got.Failure != "bad" {
		t.Errorf("unreadable at first: %+v, want the failure alone", got)
	}

	// A pod that restarted and failed its first pass publishes no
	// complete pass: what the status knew of the last one stays.
	failedFirst := &maintenancestate.IntegrityState{CheckedAt: decideNow.Add(time.Minute), Error: "timeout"}
	got = integrityStatus(failedFirst, "", previous)
	if got.Failure != "timeout" || !got.LastChecked.Time.Equal(decideNow.Add(time.Minute)) || got.LastVerified == nil || len(got.Damaged) != 1 {
		t.Errorf("no complete pass after one: %+v, want the previous findings with the failure", got)
	}
	if got := integrityStatus(failedFirst, "", nil); got.LastVerified != nil || got.Failure != "timeout" || len(got.Damaged) != 0 {
		t.Errorf("no complete pass ever: %+v, want the failure alone", got)
	}

	s := lostState(decideNow)
	s.Error, s.Pending = "timeout", 7
	s.Settled = []maintenancestate.DamagedSource{{User: "old", Host: "team-c", Path: "/", Snapshots: 2, Files: 4, IDs: []string{"s2", "s1"}}}
	for i := range maintenancestate.MaxListedPacks + 5 {
		s.MissingPacks = append(s.MissingPacks, "m"+strconv.Itoa(i))
	}
	for i := range maintenancestate.MaxListedSources + 5 {
		s.Damaged = append(s.Damaged, maintenancestate.DamagedSource{User: "vm" + strconv.Itoa(i), Host: "team-c", Path: "/", Snapshots: 1, IDs: []string{"a", "b", "c", "d", "e"}})
	}
	got = integrityStatus(s, "", nil)
	if len(got.MissingPacks) != maintenancestate.MaxListedPacks || len(got.Damaged) != maintenancestate.MaxListedSources {
		t.Errorf("%d missing packs, %d damaged paths: want at most %d and %d", len(got.MissingPacks), len(got.Damaged), maintenancestate.MaxListedPacks, maintenancestate.MaxListedSources)
	}
	for _, d := range got.Damaged {
		if len(d.IDs) > maintenancestate.MaxListedSnapshots {
			t.Fatalf("%s lists %d IDs, want at most %d", d.Name, len(d.IDs), maintenancestate.MaxListedSnapshots)
		}
	}
	first := got.Damaged[0]
	if first.Namespace != "team-a" || first.Name != "web" || first.Path != "/var/www" || first.Snapshots != 3 || first.Files != 12 || !first.Healing ||
		!first.Oldest.Time.Equal(decideNow.Add(-72*time.Hour)) || !slices.Equal(first.IDs, []string{"k3", "k2", "k1"}) {
		t.Errorf("first damaged path %+v, want the state's team-a/web:/var/www", first)
	}
	if len(got.Settled) != 1 || got.Settled[0].Name != "old" || got.Settled[0].Namespace != "team-c" || got.Settled[0].Files != 4 || !slices.Equal(got.Settled[0].IDs, []string{"s2", "s1"}) {
		t.Errorf("settled %+v, want the state's team-c/old:/", got.Settled)
	}
	if got.Failure != "timeout" || got.Contents != 1000 || got.Packs != 30 || got.ReadPacks != 3 || got.ReadBytes != 1<<20 ||
		got.LostContents != 40 || got.PendingContents != 7 || got.DamagedSnapshots != 5 || !got.LastVerified.Time.Equal(decideNow) || got.DamagedSince == nil {
		t.Errorf("status %+v: fields not copied from the state", got)
	}
	if healed := integrityStatus(&maintenancestate.IntegrityState{CheckedAt: decideNow}, "", nil); healed.LastVerified != nil || healed.DamagedSince != nil {
		t.Errorf("zero times %+v: want unset", healed)
	}
}

// The CRD refuses more than the state lists: its maxItems are the
// state's bounds, so that the controller's status write never fails on
// what it copies.
func TestIntegrityBoundsMatchCRD(t *testing.T) {
	integrity := statusSchema(t).Properties["integrity"]
	damaged := integrity.Properties["damaged"]
	for field, want := range map[string]struct {
		schema apiextensionsv1.JSONSchemaProps
		bound  int
	}{
		"missingPacks":  {integrity.Properties["missingPacks"], maintenancestate.MaxListedPacks},
		"damagedPacks":  {integrity.Properties["damagedPacks"], maintenancestate.MaxListedPacks},
		"damaged":       {damaged, maintenancestate.MaxListedSources},
		"damaged[].ids": {damaged.Items.Schema.Properties["ids"], maintenancestate.MaxListedSnapshots},
		"settled":       {integrity.Properties["settled"], maintenancestate.MaxListedSources},
	} {
		if got := want.schema.MaxItems; got == nil || *got != int64(want.bound) {
			t.Errorf("status.integrity.%s: maxItems %v, want %d (maintenancestate)", field, got, want.bound)
		}
	}
}

// statusSchema is the BSLS CRD's schema of status, as the chart ships it.
func statusSchema(t *testing.T) apiextensionsv1.JSONSchemaProps {
	t.Helper()
	data, err := os.ReadFile("../../charts/guestbackup/files/crds/guestbackup.io_backupstoragelocationservers.yaml")
	if err != nil {
		t.Fatal(err)
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.UnmarshalStrict(data, crd); err != nil {
		t.Fatal(err)
	}
	return crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Properties["status"]
}

// A pass that follows the last one's status write before the cache does
// announces nothing that pass already announced: the notices are diffed
// again against the status the API server holds.
func TestLiveNoticesReadAroundALaggingCache(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	written := verifiedWith(0, damagedVM("web", "/var/www", 3))
	live := &v1alpha1.BackupStorageLocationServer{ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"}}
	live.Status.Integrity = written
	r := &Reconciler{APIReader: fake.NewClientBuilder().WithScheme(scheme).WithObjects(live).Build()}
	server := types.NamespacedName{Namespace: "backup", Name: "main"}

	// The cache still holds the BSLS from before the write.
	stale := live.DeepCopy()
	stale.Status.Integrity = nil
	d := decision{Integrity: written.DeepCopy(), VMNotices: damageNotices(server, nil, written)}
	if len(d.VMNotices) != 1 {
		t.Fatalf("notices against the stale status: %v, want one", d.VMNotices)
	}
	got, err := r.liveNotices(context.Background(), stale, d)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 0 {
		t.Errorf("notices %v: the API server's status already holds that damage, want none", got)
	}

	// The cache is current: its notices stand.
	got, err = r.liveNotices(context.Background(), live, d)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Errorf("notices %v, want the decision's one", got)
	}

	// Nothing to announce: no request at all.
	if got, err := (&Reconciler{}).liveNotices(context.Background(), stale, decision{}); err != nil || got != nil {
		t.Errorf("no notices: %v, %v", got, err)
	}
}
