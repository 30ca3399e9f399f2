package serverpod_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/kopia/kopia/repo"
	kopiamaintenance "github.com/kopia/kopia/repo/maintenance"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
)

// kopiaCLI runs the real kopia binary as an admin would, with its own
// configuration.
func kopiaCLI(t *testing.T, configFile, password string, args ...string) (string, error) {
	t.Helper()
	tools := testbed.MustTools(t)
	env := []string{"KOPIA_PASSWORD=" + password, "KOPIA_CHECK_FOR_UPDATES=false", "HOME=" + t.TempDir()}
	return testbed.Run(context.Background(), 2*time.Minute, t.TempDir(), env, tools.Kopia, append(args, "--config-file="+configFile)...)
}

func mustKopia(t *testing.T, configFile, password string, args ...string) string {
	t.Helper()
	out, err := kopiaCLI(t, configFile, password, args...)
	if err != nil {
		t.Fatalf("kopia %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// storedBytes is the size of every blob of a filesystem repository.
func storedBytes(t testing.TB, dir string) int64 {
	t.Helper()
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		total += info.Size()
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return total
}

type maintenanceInfo struct {
	Owner    string `json:"owner"`
	Schedule struct {
		Runs map[string][]struct {
			Start   time.Time `json:"start"`
			Success bool      `json:"success"`
		} `json:"runs"`
	} `json:"schedule"`
}

func infoOf(t *testing.T, configFile, password string) maintenanceInfo {
	t.Helper()
	out := mustKopia(t, configFile, password, "maintenance", "info", "--json")
	var info maintenanceInfo
	if err := json.Unmarshal([]byte(out), &info); err != nil {
		t.Fatalf("maintenance info is not JSON: %v\n%s", err, out)
	}
	return info
}

type reports []string

type published []v1alpha1.MaintenanceStatus

func (p *published) Publish(_ context.Context, s v1alpha1.MaintenanceStatus) error {
	*p = append(*p, s)
	return nil
}

func (r *reports) Report(warning bool, reason, message string) {
	*r = append(*r, reason+": "+message)
}

// TestMaintenanceShrinksStorage proves that guestbackup owns maintenance
// (docs/design.md, decision 19): a repository guestbackup created gets
// guestbackup's maintenance owner, snapshots that retention expires are
// garbage-collected by guestbackup's run, the stored bytes shrink, and the
// admin's kopia CLI sees the owner and the run.
//
// Kopia deletes data only hours after its snapshots expired (its safety
// margins, on its own clock); the run here uses Kopia's SafetyNone, the
// one thing that differs from production (SafetyFull), instead of a kopia
// built with -tags testing and a fake clock server.
func TestMaintenanceShrinksStorage(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "repository")
	storage := serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: dir}}
	const password = "repository password"
	config := filepath.Join(t.TempDir(), "repository.config")
	if _, err := serverpod.ConnectOrCreate(ctx, storage, config, password,
		&v1alpha1.PolicySpec{Retention: &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](1), KeepHourly: ptr.To[int32](0),
			KeepDaily: ptr.To[int32](0), KeepWeekly: ptr.To[int32](0), KeepMonthly: ptr.To[int32](0), KeepAnnual: ptr.To[int32](0)}}); err != nil {
		t.Fatal(err)
	}

	admin := filepath.Join(t.TempDir(), "admin.config")
	mustKopia(t, admin, password, "repository", "connect", "filesystem", "--path="+dir, "--override-hostname=admin", "--override-username=admin")
	// Without guestbackup's claim, a repository created by the library has
	// no owner, and nobody may run maintenance.
	if info := infoOf(t, admin, password); info.Owner != "" {
		t.Fatalf("owner before claim: %q, want none", info.Owner)
	}
	if out, err := kopiaCLI(t, admin, password, "maintenance", "run", "--full"); err == nil || !strings.Contains(out, "designated user") {
		t.Fatalf("kopia maintenance run --full on an owner-less repository: %v\n%s; want a refusal", err, out)
	}

	action, previous, err := serverpod.ClaimMaintenance(ctx, storage, config, password,
		serverpod.MaintenanceOptions{Namespace: "ns", BSLS: "store", Schedule: maintenance.DefaultSchedule()})
	if err != nil || action != maintenance.ActionClaim || previous != "" {
		t.Fatalf("ClaimMaintenance = %v, %q, %v; want Claim of an owner-less repository", action, previous, err)
	}
	const owner = "guestbackup-maintenance@store.ns"
	if info := infoOf(t, admin, password); info.Owner != owner {
		t.Fatalf("owner after claim = %q, want %q", info.Owner, owner)
	}

	// Five snapshots of 4 MiB of fresh data each; retention keeps the latest.
	src := t.TempDir()
	for range 5 {
		data := make([]byte, 4<<20)
		_, _ = rand.Read(data)
		if err := os.WriteFile(filepath.Join(src, "data"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		mustKopia(t, admin, password, "snapshot", "create", src)
	}
	out := mustKopia(t, admin, password, "snapshot", "list", src, "--json")
	var kept []json.RawMessage
	if err := json.Unmarshal([]byte(out), &kept); err != nil || len(kept) != 1 {
		t.Fatalf("snapshots after retention: %d (%v), want 1", len(kept), err)
	}
	before := storedBytes(t, dir)

	r, err := repo.Open(ctx, serverpod.MaintenanceConfigFile(config), password, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx) //nolint:errcheck
	var (
		told  reports
		state published
	)
	// Kopia's margins without the waits: SafetyNone, except that contents
	// written this hour are not rewritten (as SafetyFull's RewriteMinAge),
	// else every run would copy the contents it just marked deleted into
	// new packs with a fresh timestamp and never drop them.
	safety := kopiamaintenance.SafetyNone
	safety.RewriteMinAge = time.Hour
	runner := maintenance.NewRunner(maintenance.Options{
		Repository: r.(repo.DirectRepository), Safety: &safety,
		Reports: &told, Publish: &state, Log: testr.New(t),
	})
	// One full cycle marks the expired contents deleted, drops them from
	// the index (content timestamps are whole seconds, never after the
	// drop time) and deletes their packs.
	start := time.Now()
	res, err := runner.RunOnce(ctx, kopiamaintenance.ModeFull)
	if err != nil || res.Cycle != "full" {
		t.Fatalf("RunOnce = %+v, %v; want a full run", res, err)
	}
	after := storedBytes(t, dir)
	t.Logf("stored bytes: %d before maintenance, %d after (full run: %s); next run %s", before, after, time.Since(start), res.Next)
	if after > before-3*(4<<20) {
		t.Fatalf("stored bytes %d -> %d: the four expired snapshots' 16 MiB were not collected", before, after)
	}
	info := infoOf(t, admin, password)
	if gc := info.Schedule.Runs["snapshot-gc"]; info.Owner != owner || len(gc) == 0 || !gc[0].Success {
		t.Fatalf("kopia maintenance info: owner %q, runs %+v; want %s and a successful snapshot GC", info.Owner, info.Schedule.Runs, owner)
	}
	if len(told) != 0 {
		t.Fatalf("a successful run reported %v", told)
	}
	// What the controller puts in status.maintenance.
	if len(state) != 1 || state[0].Owner != owner || state[0].LastCycle != "full" || state[0].LastSuccess == nil ||
		state[0].NextRun == nil || !state[0].NextRun.Time.Equal(res.Next) || state[0].Failure != "" {
		t.Fatalf("published %+v; want one successful full run by %s, next at %s", state, owner, res.Next)
	}
	t.Log(mustKopia(t, admin, password, "maintenance", "info"))
}

// TestClaimLeavesAForeignOwner: a repository whose maintenance an admin's
// kopia owns keeps its owner, and guestbackup's run reports why it cannot
// maintain the repository.
func TestClaimLeavesAForeignOwner(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "repository")
	const password = "pw"
	admin := filepath.Join(t.TempDir(), "admin.config")
	// The kopia CLI makes its user the owner when it creates a repository.
	mustKopia(t, admin, password, "repository", "create", "filesystem", "--path="+dir, "--override-hostname=laptop", "--override-username=admin")
	storage := serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: dir}}
	config := filepath.Join(t.TempDir(), "repository.config")
	if _, err := serverpod.ConnectOrCreate(ctx, storage, config, password, nil); err != nil {
		t.Fatal(err)
	}
	action, previous, err := serverpod.ClaimMaintenance(ctx, storage, config, password,
		serverpod.MaintenanceOptions{Namespace: "ns", BSLS: "store", Schedule: maintenance.DefaultSchedule()})
	if err != nil || action != maintenance.ActionLeave || previous != "admin@laptop" {
		t.Fatalf("ClaimMaintenance = %v, %q, %v; want Leave admin@laptop", action, previous, err)
	}
	r, err := repo.Open(ctx, serverpod.MaintenanceConfigFile(config), password, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx) //nolint:errcheck
	var told reports
	runner := maintenance.NewRunner(maintenance.Options{Repository: r.(repo.DirectRepository), Reports: &told, Log: testr.New(t)})
	if _, err := runner.RunOnce(ctx, kopiamaintenance.ModeAuto); err == nil || !strings.Contains(err.Error(), "admin@laptop") {
		t.Fatalf("run under a foreign owner: %v; want an error naming admin@laptop", err)
	}
	// The same failure again is not a second Event.
	_, _ = runner.RunOnce(ctx, kopiamaintenance.ModeAuto)
	if len(told) != 1 || !strings.HasPrefix(told[0], maintenance.ReasonMaintenanceFailing) {
		t.Fatalf("reports = %q; want one %s", told, maintenance.ReasonMaintenanceFailing)
	}
}

// TestPolicyEditReachesRepository: an edit of the BSLS's policy reaches an
// existing repository's global policy when init runs again, as the real
// kopia CLI reads it.
func TestPolicyEditReachesRepository(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "repository")
	storage := serverpod.Storage{Filesystem: &serverpod.FilesystemLocation{Path: dir}}
	config := filepath.Join(t.TempDir(), "repository.config")
	const password = "pw"
	if _, err := serverpod.ConnectOrCreate(ctx, storage, config, password, &v1alpha1.PolicySpec{Retention: &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](3)}}); err != nil {
		t.Fatal(err)
	}
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx) //nolint:errcheck
	edited := &v1alpha1.PolicySpec{Retention: &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](7)}, Compression: "zstd"}
	start := time.Now()
	changed, err := serverpod.ApplyPolicy(ctx, r, edited, false)
	if err != nil || !changed {
		t.Fatalf("ApplyPolicy = %v, %v; want a change", changed, err)
	}
	keep, comp := globalPolicy(t, config, password)
	t.Logf("edit visible to kopia policy show after %s", time.Since(start))
	if keep != 7 || comp != "zstd" {
		t.Fatalf("global policy keeps %d latest with %q; want 7 with zstd", keep, comp)
	}
	if changed, err := serverpod.ApplyPolicy(ctx, r, edited, false); err != nil || changed {
		t.Fatalf("applying the same policy again = %v, %v; want no change", changed, err)
	}
	// Append-only: the global retention stays guestbackup's, compression is the admin's.
	changed, err = serverpod.ApplyPolicy(ctx, r, &v1alpha1.PolicySpec{Retention: &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](1)}, Compression: "s2-default"}, true)
	if err != nil || !changed {
		t.Fatalf("append-only ApplyPolicy = %v, %v", changed, err)
	}
	if keep, comp := globalPolicy(t, config, password); keep != 7 || comp != "s2-default" {
		t.Fatalf("append-only: keeps %d latest with %q; want 7 (untouched) with s2-default", keep, comp)
	}
}
