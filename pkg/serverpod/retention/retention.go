// Package retention expires the snapshots of an append-only BSLS on the
// server's clock.
//
// Kopia applies a source's retention policy on the server, at the end of
// every snapshot, whenever the guest that made it asks (the
// ApplyRetentionPolicy request needs only APPEND on its own snapshots), and
// it ranks snapshots by their StartTime, which the client chooses: ten
// empty snapshots dated 2040 made the server delete every real one. So on
// an append-only server:
//
//   - the retention a guest can trigger keeps everything: GuestPolicies
//     makes the global policy's retention all zeros (Kopia's "keep all") and
//     clears retention from every other policy;
//   - the admin's retention (the BSLS's spec.repository.defaultPolicy,
//     Kopia's defaults for what it leaves unset) is applied by guestbackup
//     itself, periodically, ranking snapshots by the time the server wrote
//     their manifests (manifest.EntryMetadata.ModTime, stamped by the
//     server's repository, never by the client): Apply.
//
// Snapshots are then expired by the admin's schedule on the server's
// clock. A compromised guest cannot age its history; it can only add new
// snapshots, which compete with the snapshots of the current period (this
// hour, day, ...) for that period's place, as honest snapshots at the same
// times would.
package retention

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kopia/kopia/fs"
	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/repo/manifest"
	"github.com/kopia/kopia/snapshot"
	"github.com/kopia/kopia/snapshot/policy"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// FromSpec is the admin's retention: Kopia's default retention with what
// spec sets. A nil spec is Kopia's default.
func FromSpec(spec *v1alpha1.PolicySpec) policy.RetentionPolicy {
	r := policy.DefaultPolicy.RetentionPolicy
	if spec == nil || spec.Retention == nil {
		return r
	}
	set := func(dst **policy.OptionalInt, v *int32) {
		if v != nil {
			n := policy.OptionalInt(*v)
			*dst = &n
		}
	}
	s := spec.Retention
	set(&r.KeepLatest, s.KeepLatest)
	set(&r.KeepHourly, s.KeepHourly)
	set(&r.KeepDaily, s.KeepDaily)
	set(&r.KeepWeekly, s.KeepWeekly)
	set(&r.KeepMonthly, s.KeepMonthly)
	set(&r.KeepAnnual, s.KeepAnnual)
	return r
}

// Snapshot is a snapshot manifest, whose it is, and when the server wrote
// it.
type Snapshot struct {
	Manifest *snapshot.Manifest
	// Owner is the source the manifest entry's labels name: the labels
	// are what the server checked against its writer's ACL, and what
	// Kopia lists a source's snapshots by. The payload's Source is the
	// client's word: a guest may write a manifest under its own labels
	// that claims another user's source.
	Owner snapshot.SourceInfo
	// Written is the manifest entry's ModTime: the server's clock.
	Written time.Time
}

// OwnerOf is the source a snapshot manifest entry's labels name.
func OwnerOf(labels map[string]string) snapshot.SourceInfo {
	return snapshot.SourceInfo{
		UserName: labels[snapshot.UsernameLabel],
		Host:     labels[snapshot.HostnameLabel],
		Path:     labels[snapshot.PathLabel],
	}
}

// Expired returns the snapshots ret does not keep when each is dated by
// when the server wrote it, whatever start time its client claimed, and
// ranked among its owner's snapshots, whatever source its payload claims;
// oldest first. Pinned snapshots are kept, as Kopia keeps them. It never
// changes the manifests it is given.
func Expired(ret policy.RetentionPolicy, snapshots []Snapshot) []manifest.ID {
	bySource := map[snapshot.SourceInfo][]*snapshot.Manifest{}
	for _, s := range snapshots {
		m := *s.Manifest // a copy: StartTime is replaced, RetentionReasons written
		m.StartTime = fs.UTCTimestampFromTime(s.Written)
		m.EndTime = m.StartTime
		m.RetentionReasons = nil
		bySource[s.Owner] = append(bySource[s.Owner], &m)
	}
	var expired []*snapshot.Manifest
	for _, src := range slices.SortedFunc(maps.Keys(bySource), func(a, b snapshot.SourceInfo) int { return strings.Compare(a.String(), b.String()) }) {
		group := bySource[src]
		r := ret
		r.ComputeRetentionReasons(group)
		for _, m := range group {
			if len(m.RetentionReasons) == 0 && len(m.Pins) == 0 {
				expired = append(expired, m)
			}
		}
	}
	slices.SortStableFunc(expired, func(a, b *snapshot.Manifest) int { return a.StartTime.ToTime().Compare(b.StartTime.ToTime()) })
	ids := make([]manifest.ID, len(expired))
	for i, m := range expired {
		ids[i] = m.ID
	}
	return ids
}

// Apply deletes the snapshots Expired finds in r under ret, in one write
// session, and returns them.
func Apply(ctx context.Context, r repo.Repository, ret policy.RetentionPolicy) ([]manifest.ID, error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: snapshot.ManifestType})
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	byID := map[manifest.ID]*manifest.EntryMetadata{}
	ids := make([]manifest.ID, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
		byID[e.ID] = e
	}
	manifests, err := snapshot.LoadSnapshots(ctx, r, ids)
	if err != nil {
		return nil, fmt.Errorf("load snapshots: %w", err)
	}
	snapshots := make([]Snapshot, 0, len(manifests))
	for _, m := range manifests {
		e := byID[m.ID]
		snapshots = append(snapshots, Snapshot{Manifest: m, Owner: OwnerOf(e.Labels), Written: e.ModTime})
	}
	expired := Expired(ret, snapshots)
	if len(expired) == 0 {
		return nil, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup retention"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		for _, id := range expired {
			if err := w.DeleteManifest(ctx, id); err != nil {
				return fmt.Errorf("delete snapshot %s: %w", id, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("expire snapshots: %w", err)
	}
	return expired, nil
}

// keepAll is Kopia's "keep everything": with every count zero, a source's
// effective keep-latest is unlimited and no complete snapshot expires.
func keepAll() policy.RetentionPolicy {
	zero := func() *policy.OptionalInt { n := policy.OptionalInt(0); return &n }
	return policy.RetentionPolicy{
		KeepLatest: zero(), KeepHourly: zero(), KeepDaily: zero(),
		KeepWeekly: zero(), KeepMonthly: zero(), KeepAnnual: zero(),
	}
}

// guestRetention is the retention p must say for guests' server-side
// retention to delete nothing: the global policy says keep-all explicitly
// (an unset count falls back to Kopia's default), every other policy says
// nothing, or zero. It reports whether p must change.
func guestRetention(p *policy.Policy) (policy.RetentionPolicy, bool) {
	r := p.RetentionPolicy
	fields := []**policy.OptionalInt{&r.KeepLatest, &r.KeepHourly, &r.KeepDaily, &r.KeepWeekly, &r.KeepMonthly, &r.KeepAnnual}
	global := p.Target() == policy.GlobalPolicySourceInfo
	changed := false
	for _, f := range fields {
		switch {
		case global && (*f == nil || **f != 0):
			n := policy.OptionalInt(0)
			*f = &n
			changed = true
		case !global && *f != nil && **f != 0:
			*f = nil
			changed = true
		}
	}
	return r, changed
}

// GuestPolicies makes the retention every guest's server-side retention
// runs with keep everything, rewriting the policies that say otherwise
// (and creating the global policy if there is none), and returns the
// sources whose policy it rewrote. Other settings are left as they are.
//
// Policy manifests that do not parse are skipped and returned: a guest
// may write any payload to its own policies while it has FULL access, and
// one such manifest must not stop the others being made harmless. Kopia
// cannot read them either, so a guest's retention that meets one fails
// and deletes nothing.
func GuestPolicies(ctx context.Context, r repo.Repository) (fixed []snapshot.SourceInfo, unreadable []manifest.ID, err error) {
	entries, err := r.FindManifests(ctx, map[string]string{manifest.TypeLabelKey: policy.ManifestType})
	if err != nil {
		return nil, nil, fmt.Errorf("list policies: %w", err)
	}
	var policies []*policy.Policy
	for _, e := range entries {
		p, err := policy.GetPolicyByID(ctx, r, e.ID)
		if err != nil {
			unreadable = append(unreadable, e.ID)
			continue
		}
		policies = append(policies, p)
	}
	var fix []*policy.Policy
	hasGlobal := false
	for _, p := range policies {
		if p.Target() == policy.GlobalPolicySourceInfo {
			hasGlobal = true
		}
		if ret, changed := guestRetention(p); changed {
			c := *p
			c.RetentionPolicy = ret
			fix = append(fix, &c)
		}
	}
	if !hasGlobal {
		g := *policy.DefaultPolicy
		g.Labels = policy.LabelsForSource(policy.GlobalPolicySourceInfo)
		g.RetentionPolicy = keepAll()
		fix = append(fix, &g)
	}
	if len(fix) == 0 {
		return nil, unreadable, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup guest retention"}, func(ctx context.Context, w repo.RepositoryWriter) error {
		for _, p := range fix {
			src := p.Target()
			if err := policy.SetPolicy(ctx, w, src, p); err != nil {
				return fmt.Errorf("set the retention of %s: %w", src, err)
			}
			fixed = append(fixed, src)
		}
		return nil
	})
	if err != nil {
		return nil, unreadable, fmt.Errorf("make guests' retention keep everything: %w", err)
	}
	return fixed, unreadable, nil
}
