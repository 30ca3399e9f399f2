package retention

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/testbed"
)

var (
	db  = snapshot.SourceInfo{UserName: "db", Host: "team-a", Path: "/data"}
	web = snapshot.SourceInfo{UserName: "web", Host: "team-b", Path: "/data"}
	// now is the server's clock in these tables.
	now    = time.Date(2025, 6, 15, 12, 0, 0, 0, time.UTC)
	future = time.Date(2040, 1, 1, 0, 0, 0, 0, time.UTC)
)

// show is a retention as JSON, for comparing and printing.
func show(r policy.RetentionPolicy) string {
	b, err := json.Marshal(r)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func opt(n int) *policy.OptionalInt { v := policy.OptionalInt(n); return &v }

// snap is snapshot id of src that its client says started at claimed and
// the server wrote at written.
func snap(id string, src snapshot.SourceInfo, claimed, written time.Time, pins ...string) Snapshot {
	return Snapshot{
		Manifest: &snapshot.Manifest{ID: manifest.ID(id), Source: src, StartTime: fs.UTCTimestampFromTime(claimed), EndTime: fs.UTCTimestampFromTime(claimed), Pins: pins},
		Owner:    src,
		Written:  written,
	}
}

// forged is snap written by owner, under its own labels, with a payload
// that claims src.
func forged(id string, owner, src snapshot.SourceInfo, written time.Time) Snapshot {
	s := snap(id, src, written, written)
	s.Owner = owner
	return s
}

func day(n int) time.Time { return now.AddDate(0, 0, n) }

func TestExpired(t *testing.T) {
	daily := policy.RetentionPolicy{KeepLatest: opt(0), KeepDaily: opt(7)}
	cases := []struct {
		name      string
		ret       policy.RetentionPolicy
		snapshots []Snapshot
		want      []string
	}{
		{
			name: "snapshots dated 2040 by the client are ranked by when the server wrote them",
			ret:  daily,
			snapshots: []Snapshot{
				snap("real-3", db, day(-3), day(-3)), snap("real-2", db, day(-2), day(-2)), snap("real-1", db, day(-1), day(-1)),
				snap("fake-1", db, future, now.Add(-2*time.Minute)), snap("fake-2", db, future.Add(time.Hour), now.Add(-time.Minute)), snap("fake-3", db, future.Add(2*time.Hour), now),
			},
			// Today's place goes to today's newest; every earlier day keeps its snapshot.
			want: []string{"fake-1", "fake-2"},
		},
		{
			name: "a snapshot backdated by its client does not take an old period's place",
			ret:  daily,
			snapshots: []Snapshot{
				snap("real", db, day(-5), day(-5)), snap("backdated", db, day(-5).Add(time.Hour), now.Add(-time.Hour)), snap("today", db, now, now),
			},
			want: []string{"backdated"},
		},
		{
			name:      "the admin's schedule still expires old snapshots",
			ret:       daily,
			snapshots: []Snapshot{snap("old", db, day(-30), day(-30)), snap("new", db, now, now)},
			want:      []string{"old"},
		},
		{
			name:      "pinned snapshots are kept",
			ret:       daily,
			snapshots: []Snapshot{snap("old", db, day(-30), day(-30), "legal-hold"), snap("new", db, now, now)},
		},
		{
			name: "each source is ranked on its own",
			ret:  policy.RetentionPolicy{KeepLatest: opt(1)},
			snapshots: []Snapshot{
				snap("db-1", db, day(-2), day(-2)), snap("db-2", db, day(-1), day(-1)),
				snap("web-1", web, future, now),
			},
			want: []string{"db-1"},
		},
		{
			name: "snapshots whose payload claims another user's source are ranked among their writer's",
			ret:  policy.RetentionPolicy{KeepLatest: opt(1)},
			snapshots: []Snapshot{
				snap("db-real", db, day(-1), day(-1)),
				forged("web-claims-db-1", web, db, now.Add(-time.Minute)), forged("web-claims-db-2", web, db, now),
			},
			// db keeps its only snapshot; web's forgeries compete with each other.
			want: []string{"web-claims-db-1"},
		},
		{
			name:      "keep-all deletes nothing",
			ret:       keepAll(),
			snapshots: []Snapshot{snap("a", db, day(-400), day(-400)), snap("b", db, future, now), snap("c", db, future, now)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := make([]fs.UTCTimestamp, len(c.snapshots))
			for i, s := range c.snapshots {
				before[i] = s.Manifest.StartTime
			}
			got := Expired(c.ret, c.snapshots)
			ids := make([]string, len(got))
			for i, id := range got {
				ids[i] = string(id)
			}
			if !slices.Equal(ids, c.want) {
				t.Errorf("expired %v, want %v", ids, c.want)
			}
			for i, s := range c.snapshots {
				if s.Manifest.StartTime != before[i] || s.Manifest.RetentionReasons != nil {
					t.Errorf("Expired changed the manifest %s it was given", s.Manifest.ID)
				}
			}
		})
	}
}

func TestFromSpec(t *testing.T) {
	d := policy.DefaultPolicy.RetentionPolicy
	cases := []struct {
		name string
		spec *v1alpha1.PolicySpec
		want policy.RetentionPolicy
	}{
		{"no spec: Kopia's defaults", nil, d},
		{"no retention: Kopia's defaults", &v1alpha1.PolicySpec{Compression: "zstd"}, d},
		{"what the admin sets, over Kopia's defaults",
			&v1alpha1.PolicySpec{Retention: &v1alpha1.RetentionPolicy{KeepLatest: ptr.To[int32](3), KeepAnnual: ptr.To[int32](0)}},
			policy.RetentionPolicy{KeepLatest: opt(3), KeepHourly: d.KeepHourly, KeepDaily: d.KeepDaily, KeepWeekly: d.KeepWeekly, KeepMonthly: d.KeepMonthly, KeepAnnual: opt(0), IgnoreIdenticalSnapshots: d.IgnoreIdenticalSnapshots}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := FromSpec(c.spec)
			if show(got) != show(c.want) {
				t.Errorf("got %s, want %s", show(got), show(c.want))
			}
		})
	}
}

// keepAllAnd is keep-all with the policy's other retention setting kept.
func keepAllAnd(ignoreIdentical *policy.OptionalBool) policy.RetentionPolicy {
	r := keepAll()
	r.IgnoreIdenticalSnapshots = ignoreIdentical
	return r
}

func TestGuestRetention(t *testing.T) {
	policyOf := func(src snapshot.SourceInfo, r policy.RetentionPolicy) *policy.Policy {
		return &policy.Policy{Labels: policy.LabelsForSource(src), RetentionPolicy: r}
	}
	cases := []struct {
		name        string
		policy      *policy.Policy
		wantChanged bool
		want        policy.RetentionPolicy
	}{
		{"the global policy with Kopia's defaults becomes keep-all",
			policyOf(policy.GlobalPolicySourceInfo, policy.DefaultPolicy.RetentionPolicy), true, keepAllAnd(policy.DefaultPolicy.RetentionPolicy.IgnoreIdenticalSnapshots)},
		{"a global policy that leaves counts unset becomes keep-all, or they fall back to Kopia's defaults",
			policyOf(policy.GlobalPolicySourceInfo, policy.RetentionPolicy{}), true, keepAll()},
		{"a keep-all global policy stays", policyOf(policy.GlobalPolicySourceInfo, keepAll()), false, keepAll()},
		{"a guest's path policy loses its counts",
			policyOf(db, policy.RetentionPolicy{KeepLatest: opt(1), KeepDaily: opt(0)}), true, policy.RetentionPolicy{KeepDaily: opt(0)}},
		{"a host policy loses its counts",
			policyOf(snapshot.SourceInfo{Host: "team-a"}, policy.RetentionPolicy{KeepMonthly: opt(2)}), true, policy.RetentionPolicy{}},
		{"a policy without counts stays", policyOf(web, policy.RetentionPolicy{}), false, policy.RetentionPolicy{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, changed := guestRetention(c.policy)
			if changed != c.wantChanged || show(got) != show(c.want) {
				t.Errorf("got %s (changed %v), want %s (changed %v)", show(got), changed, show(c.want), c.wantChanged)
			}
		})
	}
}

// TestGuestPoliciesDisarmKopiasRetention runs Kopia's own server-side
// retention, as a guest's ApplyRetentionPolicy request does, over real
// snapshots and ten dated 2040 (the measured attack), before and after
// GuestPolicies; then guestbackup's retention on the server's clock.
func TestGuestPoliciesDisarmKopiasRetention(t *testing.T) {
	ctx := context.Background()
	write := func(r repo.Repository, src snapshot.SourceInfo, start time.Time, n int) []manifest.ID {
		t.Helper()
		var ids []manifest.ID
		err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
			for i := range n {
				ts := fs.UTCTimestampFromTime(start.Add(time.Duration(i) * time.Minute))
				id, err := snapshot.SaveSnapshot(ctx, w, &snapshot.Manifest{Source: src, StartTime: ts, EndTime: ts})
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return ids
	}
	kopiaRetention := func(r repo.Repository) []manifest.ID {
		t.Helper()
		var deleted []manifest.ID
		err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
			var err error
			deleted, err = policy.ApplyRetentionPolicy(ctx, w, db, true)
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return deleted
	}
	setGlobal := func(r repo.Repository, p *policy.Policy) {
		t.Helper()
		err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
			return policy.SetPolicy(ctx, w, policy.GlobalPolicySourceInfo, p)
		})
		if err != nil {
			t.Fatal(err)
		}
	}

	// What the attack did to a repository with Kopia's default policy.
	attacked := testbed.NewRepository(t)
	setGlobal(attacked, policy.DefaultPolicy)
	real := write(attacked, db, time.Now().Add(-time.Hour), 2)
	write(attacked, db, future, 10)
	if deleted := kopiaRetention(attacked); !slices.Contains(deleted, real[0]) {
		t.Fatalf("the attack no longer works on Kopia's defaults (deleted %v): this test proves nothing", deleted)
	}

	r := testbed.NewRepository(t)
	setGlobal(r, policy.DefaultPolicy)
	fixed, _, err := GuestPolicies(ctx, r)
	if err != nil || len(fixed) != 1 {
		t.Fatalf("GuestPolicies: fixed %v, error %v; want the global policy", fixed, err)
	}
	if again, _, err := GuestPolicies(ctx, r); err != nil || len(again) != 0 {
		t.Errorf("a second GuestPolicies: fixed %v, error %v; want nothing to do", again, err)
	}
	real = write(r, db, time.Now().Add(-time.Hour), 2)
	write(r, db, future, 10)
	if deleted := kopiaRetention(r); len(deleted) != 0 {
		t.Errorf("Kopia's retention, as a guest triggers it, deleted %v", deleted)
	}
	// The admin's retention on the server's clock: all twelve were written
	// now, so one snapshot a day keeps the newest, a fake, and the two
	// reals and nine other fakes of the day expire. Under keep-latest 20
	// nothing does.
	if expired, err := Apply(ctx, r, policy.RetentionPolicy{KeepLatest: opt(20)}); err != nil || len(expired) != 0 {
		t.Errorf("keep-latest 20 on the server's clock expired %v (error %v)", expired, err)
	}
	expired, err := Apply(ctx, r, policy.RetentionPolicy{KeepLatest: opt(0), KeepDaily: opt(7)})
	if err != nil || len(expired) != 11 || !slices.Contains(expired, real[0]) {
		t.Errorf("keep-daily 7 on the server's clock expired %v (error %v), want the 11 older ones of today", expired, err)
	}
}

// TestApplyRanksForgedSourcesAmongTheirWriters is the attack a guest can
// make through a Kopia server, which checks a manifest's labels against
// the writer's ACL and never its payload: snapshot manifests under its own
// labels that claim another user's source. They must not take that
// user's places in the admin's retention.
func TestApplyRanksForgedSourcesAmongTheirWriters(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	var real manifest.ID
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		ts := fs.UTCTimestampFromTime(time.Now().Add(-time.Hour))
		var err error
		if real, err = snapshot.SaveSnapshot(ctx, w, &snapshot.Manifest{Source: db, StartTime: ts, EndTime: ts}); err != nil {
			return err
		}
		webLabels := map[string]string{
			manifest.TypeLabelKey:  snapshot.ManifestType,
			snapshot.UsernameLabel: web.UserName, snapshot.HostnameLabel: web.Host, snapshot.PathLabel: web.Path,
		}
		for range 3 {
			now := fs.UTCTimestampFromTime(time.Now())
			if _, err := w.PutManifest(ctx, webLabels, &snapshot.Manifest{Source: db, StartTime: now, EndTime: now}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	expired, err := Apply(ctx, r, policy.RetentionPolicy{KeepLatest: opt(1)})
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(expired, real) {
		t.Errorf("keep-latest 1 expired %s's only snapshot for manifests another user wrote claiming its source (expired %v)", db, expired)
	}
	if len(expired) != 2 {
		t.Errorf("expired %v, want 2 of the 3 forged manifests: they are ranked among their writer's", expired)
	}
}

// TestGuestPoliciesSkipsUnreadablePolicies: a guest with FULL access to
// its own policies (a BSLS before it is made append-only) can write one
// that does not parse. The other guests' retention is still made harmless.
func TestGuestPoliciesSkipsUnreadablePolicies(t *testing.T) {
	ctx := context.Background()
	r := testbed.NewRepository(t)
	var planted manifest.ID
	err := repo.WriteSession(ctx, r, repo.WriteSessionOptions{}, func(ctx context.Context, w repo.RepositoryWriter) error {
		if err := policy.SetPolicy(ctx, w, db, &policy.Policy{RetentionPolicy: policy.RetentionPolicy{KeepLatest: opt(1)}}); err != nil {
			return err
		}
		var err error
		planted, err = w.PutManifest(ctx, policy.LabelsForSource(web), json.RawMessage(`{"retention":{"keepLatest":"x"}}`))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	fixed, unreadable, err := GuestPolicies(ctx, r)
	if err != nil {
		t.Fatalf("GuestPolicies: %v", err)
	}
	if !slices.Contains(fixed, db) {
		t.Errorf("fixed %v, want %s's policy among them", fixed, db)
	}
	if !slices.Equal(unreadable, []manifest.ID{planted}) {
		t.Errorf("unreadable %v, want the planted manifest %s", unreadable, planted)
	}
	p, err := policy.GetDefinedPolicy(ctx, r, db)
	if err != nil {
		t.Fatal(err)
	}
	if p.RetentionPolicy.KeepLatest != nil {
		t.Errorf("%s's policy still says keep-latest %v", db, *p.RetentionPolicy.KeepLatest)
	}
}
