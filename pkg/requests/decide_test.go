package requests

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// notASubdomain is what Kubernetes says of a name that is not a DNS subdomain.
var notASubdomain = strings.Join(validation.IsDNS1123Subdomain("Web_1"), "; ")

var now = time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)

// vm is VirtualMachine name of team-a with annotations (key, value, ...).
func vm(name string, kv ...string) *VM {
	m := &VM{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team-a", Annotations: map[string]string{}}}
	for i := 0; i+1 < len(kv); i += 2 {
		m.Annotations[kv[i]] = kv[i+1]
	}
	return m
}

// optedIn is an opted-in VM of team-a that backs up /etc.
func optedIn(name string, kv ...string) *VM {
	return vm(name, append([]string{v1alpha1.AnnotationServer, "backup/main", v1alpha1.AnnotationPaths, "/etc"}, kv...)...)
}

func TestRequesterOfCopiesTheUserInfoWhole(t *testing.T) {
	u := authenticationv1.UserInfo{Username: "alice", UID: "42", Groups: []string{"team-a", "system:authenticated"},
		Extra: map[string]authenticationv1.ExtraValue{"scopes": {"a", "b"}}}
	got := RequesterOf(u)
	want := v1alpha1.Requester{Username: "alice", UID: "42", Groups: []string{"team-a", "system:authenticated"}, Extra: map[string][]string{"scopes": {"a", "b"}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("RequesterOf = %+v, want %+v", got, want)
	}
	u.Groups[0], u.Extra["scopes"][0] = "changed", "changed"
	if got.Groups[0] != "team-a" || got.Extra["scopes"][0] != "a" {
		t.Errorf("the requester shares memory with the admission request: %+v", got)
	}
	if r := RequesterOf(authenticationv1.UserInfo{Username: "bob"}); r.Extra != nil || r.Groups != nil {
		t.Errorf("RequesterOf(bob) = %+v, want no groups and no extra", r)
	}
}

func TestValidateSnapshot(t *testing.T) {
	for _, tt := range []struct {
		name string
		spec v1alpha1.GuestSnapshotSpec
		vm   *VM
		want []string
	}{
		{name: "an opted-in VM's own paths", spec: v1alpha1.GuestSnapshotSpec{VM: "web"}, vm: optedIn("web")},
		{name: "paths of its own", spec: v1alpha1.GuestSnapshotSpec{VM: "web", Paths: []string{"/srv/data", "/home/"}},
			vm: vm("web", v1alpha1.AnnotationServer, "backup/main")},
		{name: "a VM that does not exist", spec: v1alpha1.GuestSnapshotSpec{VM: "web"},
			want: []string{"spec.vm: no VirtualMachine web in namespace team-a: name a VM of this request's namespace"}},
		{name: "a VM of another namespace", spec: v1alpha1.GuestSnapshotSpec{VM: "team-b/web"},
			want: []string{`spec.vm: "team-b/web" names a VM of another namespace, which a request can never reach: create the request in that VM's namespace, naming the VM alone`}},
		{name: "a VM of another namespace, as an identity", spec: v1alpha1.GuestSnapshotSpec{VM: "web@team-b"},
			want: []string{`spec.vm: "web@team-b" names a VM of another namespace, which a request can never reach: create the request in that VM's namespace, naming the VM alone`}},
		{name: "no VM name", spec: v1alpha1.GuestSnapshotSpec{VM: "Web_1"},
			want: []string{`spec.vm: "Web_1" is not a VirtualMachine name (` + notASubdomain + `)`}},
		{name: "a VM not opted in", spec: v1alpha1.GuestSnapshotSpec{VM: "web", Paths: []string{"/etc"}}, vm: vm("web"),
			want: []string{"spec.vm: VirtualMachine web is not opted in to guestbackup: annotate it with guestbackup.io/server=<namespace>/<server> first (docs/guest.md)"}},
		{name: "no paths to take", spec: v1alpha1.GuestSnapshotSpec{VM: "web"}, vm: vm("web", v1alpha1.AnnotationServer, "backup/main"),
			want: []string{"spec.paths: empty, and VirtualMachine web has no annotation guestbackup.io/paths to take them from: list the absolute paths to snapshot"}},
		{name: "relative and climbing paths, each named", spec: v1alpha1.GuestSnapshotSpec{VM: "web", Paths: []string{"etc", "/srv/../root", "/srv/..data", "/srv/a\x00"}}, vm: optedIn("web"),
			want: []string{
				`spec.paths[0]: "etc" is not absolute: name the path as the guest sees it, starting with /`,
				`spec.paths[1]: "/srv/../root" contains "..": name the path itself, without ..`,
				"spec.paths[3]: contains a NUL character, which no path holds",
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := ValidateSnapshot("team-a", tt.spec, tt.vm); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ValidateSnapshot =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestValidateRestore(t *testing.T) {
	restore := func(edit func(*v1alpha1.GuestRestoreSpec)) v1alpha1.GuestRestoreSpec {
		s := v1alpha1.GuestRestoreSpec{VM: "new", Paths: []string{"/etc/nginx"}}
		if edit != nil {
			edit(&s)
		}
		return s
	}
	for _, tt := range []struct {
		name string
		spec v1alpha1.GuestRestoreSpec
		vm   *VM
		want []string
	}{
		{name: "the latest snapshot of the VM itself, into the default folder", spec: restore(nil), vm: optedIn("new")},
		{name: "the VM itself named as the source", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "new" }), vm: optedIn("new")},
		{name: "another VM's snapshots under its grant", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }),
			vm: optedIn("new", v1alpha1.AnnotationRestoreFrom, "old")},
		{name: "another VM's snapshots without a grant", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }), vm: optedIn("new"),
			want: []string{`spec.sourceVM: VirtualMachine new may not read the snapshots of old: annotate it with guestbackup.io/restore-from=old to grant it (docs/guest.md, "A file from a VM that is gone")`}},
		{name: "another VM's snapshots under a grant of a third", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }),
			vm:   optedIn("new", v1alpha1.AnnotationRestoreFrom, "other"),
			want: []string{`spec.sourceVM: VirtualMachine new may not read the snapshots of old: annotate it with guestbackup.io/restore-from=old to grant it (docs/guest.md, "A file from a VM that is gone")`}},
		{name: "a grant that names another namespace", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }),
			vm:   optedIn("new", v1alpha1.AnnotationRestoreFrom, "team-b/old"),
			want: []string{`spec.sourceVM: VirtualMachine new may not read the snapshots of old: its annotation guestbackup.io/restore-from="team-b/old" grants nothing: a VM of another namespace can never be named; name a VirtualMachine of namespace team-a (it may be deleted) whose snapshots this VM's guest may read`}},
		{name: "a source in another namespace", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "team-b/old" }),
			vm:   optedIn("new", v1alpha1.AnnotationRestoreFrom, "team-b/old"),
			want: []string{`spec.sourceVM: "team-b/old" names a VM of another namespace, which a request can never reach: create the request in that VM's namespace, naming the VM alone`}},
		{name: "a VM that does not exist", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.SourceVM = "old" }),
			want: []string{"spec.vm: no VirtualMachine new in namespace team-a: name a VM of this request's namespace"}},
		{name: "a VM not opted in", spec: restore(nil), vm: vm("new"),
			want: []string{"spec.vm: VirtualMachine new is not opted in to guestbackup: annotate it with guestbackup.io/server=<namespace>/<server> first (docs/guest.md)"}},
		{name: "no path", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Paths = nil }), vm: optedIn("new"),
			want: []string{"spec.paths: empty: list the absolute paths, as snapshotted, to restore"}},
		{name: "a climbing path", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Paths = []string{"/etc/nginx/../../root/.ssh"} }), vm: optedIn("new"),
			want: []string{`spec.paths[0]: "/etc/nginx/../../root/.ssh" contains "..": name the path itself, without ..`}},
		{name: "a snapshot by ID", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.ID = "k3c5a1e2f" }), vm: optedIn("new")},
		{name: "a snapshot ID that is not one", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.ID = "latest;rm" }), vm: optedIn("new"),
			want: []string{"spec.snapshot.id: \"latest;rm\" is not a snapshot ID (letters and digits, as `guestbackup-kopia snapshot list` prints them)"}},
		{name: "the last snapshot before yesterday", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.Before = &metav1.Time{Time: now.Add(-24 * time.Hour)} }), vm: optedIn("new")},
		{name: "a time in the future", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Snapshot.Before = &metav1.Time{Time: now.Add(time.Hour)} }), vm: optedIn("new"),
			want: []string{"spec.snapshot.before: 2026-12-07T13:00:00Z is in the future: give a time in the past (RFC 3339), or leave the selector empty for the latest snapshot"}},
		{name: "an ID and a time", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Snapshot = v1alpha1.SnapshotSelector{ID: "k1", Before: &metav1.Time{Time: now.Add(-time.Hour)}}
		}), vm: optedIn("new"),
			want: []string{"spec.snapshot: choose the snapshot by id or by before, not both; set neither for the latest"}},
		{name: "in place", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Target.InPlace = true }), vm: optedIn("new")},
		{name: "a folder of the guest", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Target.Directory = "/srv/restored" }), vm: optedIn("new")},
		{name: "a relative folder", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Target.Directory = "restored" }), vm: optedIn("new"),
			want: []string{`spec.target.directory: "restored" is not absolute: name the path as the guest sees it, starting with /`}},
		{name: "the guest's root as a folder", spec: restore(func(s *v1alpha1.GuestRestoreSpec) { s.Target.Directory = "//" }), vm: optedIn("new"),
			want: []string{`spec.target.directory: "/" restores over the guest's own files: set target.inPlace to mean that, or name another folder`}},
		{name: "in place and into a claim", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target = v1alpha1.RestoreTarget{InPlace: true, PersistentVolumeClaim: &v1alpha1.RestoreClaim{ClaimName: "data"}}
		}), vm: optedIn("new"),
			want: []string{"spec.target: set at most one of directory, inPlace and persistentVolumeClaim; none restores into /var/lib/guestbackup/restores/<request name> in the guest"}},
		{name: "an existing claim", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data"}
		}), vm: optedIn("new")},
		{name: "a new claim", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("10Gi")), StorageClassName: ptr.To("fast")}
		}), vm: optedIn("new")},
		{name: "a claim neither named nor sized", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{}
		}), vm: optedIn("new"),
			want: []string{"spec.target.persistentVolumeClaim: set claimName to restore into an existing claim, or size to create one named after the request"}},
		{name: "a claim of another namespace", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "team-b/data"}
		}), vm: optedIn("new"),
			want: []string{`spec.target.persistentVolumeClaim.claimName: "team-b/data" is not a claim name (` + notASubdomain + `); name a claim of this request's namespace`}},
		{name: "an existing claim with a storage class", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: "data", StorageClassName: ptr.To("fast")}
		}), vm: optedIn("new"),
			want: []string{"spec.target.persistentVolumeClaim.storageClassName: applies only to a claim created with size"}},
		{name: "a new claim of no size", spec: restore(func(s *v1alpha1.GuestRestoreSpec) {
			s.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: ptr.To(resource.MustParse("0"))}
		}), vm: optedIn("new"),
			want: []string{"spec.target.persistentVolumeClaim.size: 0: give the new claim a positive size"}},
		{name: "every problem at once", spec: v1alpha1.GuestRestoreSpec{VM: "new", SourceVM: "old", Paths: []string{"etc"}, Target: v1alpha1.RestoreTarget{Directory: "out"}},
			vm: vm("new"),
			want: []string{
				"spec.vm: VirtualMachine new is not opted in to guestbackup: annotate it with guestbackup.io/server=<namespace>/<server> first (docs/guest.md)",
				`spec.sourceVM: VirtualMachine new may not read the snapshots of old: annotate it with guestbackup.io/restore-from=old to grant it (docs/guest.md, "A file from a VM that is gone")`,
				`spec.paths[0]: "etc" is not absolute: name the path as the guest sees it, starting with /`,
				`spec.target.directory: "out" is not absolute: name the path as the guest sees it, starting with /`,
			}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := ValidateRestore("team-a", tt.spec, tt.vm, now); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("ValidateRestore =\n%q\nwant\n%q", got, tt.want)
			}
		})
	}
}

func TestUnreadable(t *testing.T) {
	for _, tt := range []struct {
		name, spec, want string
	}{
		{name: "a time that is no time", spec: `{"vm": "web", "paths": ["/etc"], "snapshot": {"before": "yesterday"}}`,
			want: `spec.snapshot.before: "yesterday" is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z`},
		{name: "a date without its time", spec: `{"vm": "web", "paths": ["/etc"], "snapshot": {"before": "2026-12-06"}}`,
			want: `spec.snapshot.before: "2026-12-06" is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z`},
		// The decoder's own words are between the parentheses.
		{name: "paths as one string", spec: `{"vm": "web", "paths": "/etc"}`,
			want: "its spec cannot be read (…): give each field the form docs/requests.md describes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var spec v1alpha1.GuestRestoreSpec
			err := json.Unmarshal([]byte(tt.spec), &spec)
			if err == nil {
				t.Fatal("the spec was read")
			}
			got := Unreadable(err)
			if before, after, ok := strings.Cut(tt.want, "…"); ok && strings.HasPrefix(got, before) && strings.HasSuffix(got, after) {
				got = tt.want
			}
			if got != tt.want {
				t.Errorf("Unreadable = %q\nwant %q", got, tt.want)
			}
		})
	}
}
