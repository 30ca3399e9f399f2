package usersync

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// listing returns the lister user sync reads the users Secrets with,
// holding every shard of BSLS "main" with users.
func listing(t *testing.T, users map[string]identity.Hash) shardLister {
	t.Helper()
	l := shardLister{namespace: "backup", stores: map[string]cache.Store{}}
	for shard := range userset.Shards {
		of := map[string]identity.Hash{}
		for u, h := range users {
			if userset.ShardOf(u) == shard {
				of[u] = h
			}
		}
		name := userset.SecretName("main", shard)
		store := cache.NewStore(cache.MetaNamespaceKeyFunc)
		if err := store.Add(&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "backup", Name: name, Labels: map[string]string{userset.Label: "main"}},
			Data:       map[string][]byte{userset.Key: userset.Encode(of)},
		}); err != nil {
			t.Fatal(err)
		}
		l.stores[name] = store
	}
	return l
}

func hashOf(t *testing.T, password string) identity.Hash {
	t.Helper()
	h, err := identity.NewHash(password, identity.Scrypt)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// The Kopia server knows the users user sync could write; the gate asks
// Admits, which goes by the users Secrets, so that a user removed or a
// password rotated on a storage that refuses writes is refused all the same.
func TestAdmits(t *testing.T) {
	oldHash, newHash, otherHash := hashOf(t, "old"), hashOf(t, "new"), hashOf(t, "other")
	secrets := map[string]identity.Hash{"db@team-a": newHash, "web@team-a": otherHash}
	for _, tt := range []struct {
		name         string
		lister       bool
		missingShard bool
		enforced     map[string]identity.Hash
		// handed are the users whose credential the server loaded.
		handed         map[string]bool
		user, password string
		want           error
		// credential: the server is handed the user's credential rather
		// than the password.
		credential bool
	}{
		{name: "a user the Secrets no longer list (its VM deleted), still in the repository",
			lister: true, enforced: map[string]identity.Hash{"gone@team-a": oldHash}, user: "gone@team-a", password: "old", want: errNotListed},
		{name: "a listed user whose hash the server enforces: the server verifies the password",
			lister: true, enforced: secrets, user: "web@team-a", password: "wrong"},
		{name: "a rotation not written yet: the old password is refused",
			lister: true, enforced: map[string]identity.Hash{"db@team-a": oldHash}, user: "db@team-a", password: "old", want: errNotCurrent},
		{name: "a rotation not written yet: the new password is let through",
			lister: true, enforced: map[string]identity.Hash{"db@team-a": oldHash}, user: "db@team-a", password: "new"},
		{name: "before the first sync, every password is verified here",
			lister: true, user: "db@team-a", password: "old", want: errNotCurrent},
		{name: "before the Secrets are listed, nobody",
			user: "db@team-a", password: "new", want: errNotSynced},
		{name: "while the user's shard is missing (a new cluster on old storage), the repository decides",
			lister: true, missingShard: true, enforced: map[string]identity.Hash{"gone@team-a": oldHash}, user: "gone@team-a", password: "old"},
		{name: "a handed user whose hash the server enforces: its password verified here, the server handed its credential",
			lister: true, enforced: secrets, handed: map[string]bool{"web@team-a": true}, user: "web@team-a", password: "other", credential: true},
		{name: "a handed user whose hash the server enforces, with a wrong password",
			lister: true, enforced: secrets, handed: map[string]bool{"web@team-a": true}, user: "web@team-a", password: "wrong", want: errWrongPassword},
		{name: "a handed user whose rotation is not written yet: the new password goes on as it is, for the server to verify",
			lister: true, enforced: map[string]identity.Hash{"db@team-a": oldHash}, handed: map[string]bool{"db@team-a": true}, user: "db@team-a", password: "new"},
		{name: "a handed user whose rotation is not written yet: the old password is refused",
			lister: true, enforced: map[string]identity.Hash{"db@team-a": oldHash}, handed: map[string]bool{"db@team-a": true}, user: "db@team-a", password: "old", want: errNotCurrent},
		{name: "a handed user the Secrets no longer list",
			lister: true, enforced: map[string]identity.Hash{"gone@team-a": oldHash}, handed: map[string]bool{"gone@team-a": true}, user: "gone@team-a", password: "old", want: errNotListed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Options{BSLS: "main"})
			if tt.lister {
				l := listing(t, secrets)
				if tt.missingShard {
					delete(l.stores, userset.SecretName("main", userset.ShardOf(tt.user)))
				}
				s.lister = l
			}
			s.enforced, s.handed = tt.enforced, tt.handed
			upstream, err := s.Admits(context.Background(), tt.user, tt.password)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Admits(%s): %v, want %v", tt.user, err, tt.want)
			}
			want := tt.password
			switch {
			case err != nil:
				want = ""
			case tt.credential:
				want = s.credentials.For(tt.user)
			}
			if upstream != want {
				t.Errorf("Admits(%s) hands the server %q, want %q", tt.user, upstream, want)
			}
		})
	}
}

// ended records the users whose sessions a Syncer ended.
type ended struct{ users []string }

func (e *ended) End(match func(string) bool) map[string]int {
	out := map[string]int{}
	for _, u := range []string{"db@team-a", "web@team-a", "gone@team-a"} {
		if match(u) {
			e.users = append(e.users, u)
			out[u] = 1
		}
	}
	return out
}

// A sync that cannot write (a full storage) still ends the sessions the
// Secrets took away, once: the Kopia server, not updated, would keep them.
func TestEndUnwritten(t *testing.T) {
	oldHash, newHash, webHash := hashOf(t, "old"), hashOf(t, "new"), hashOf(t, "web")
	sessions := &ended{}
	s := New(Options{BSLS: "main", Sessions: sessions})
	s.inForce = &Access{Users: map[string]identity.Hash{"db@team-a": oldHash, "web@team-a": webHash, "gone@team-a": oldHash}}
	now := map[string]identity.Hash{"db@team-a": newHash, "web@team-a": webHash}

	s.endUnwritten(listing(t, now))
	if want := []string{"db@team-a", "gone@team-a"}; !slices.Equal(slices.Sorted(slices.Values(sessions.users)), want) {
		t.Fatalf("sessions ended after the first failed sync: %v, want %v", sessions.users, want)
	}
	if !maps.EqualFunc(s.listed, now, identity.Hash.Equal) {
		t.Errorf("listed: %v, want the Secrets' view", s.listed)
	}
	sessions.users = nil
	s.endUnwritten(listing(t, now))
	if len(sessions.users) != 0 {
		t.Errorf("the next failed sync ended %v again", sessions.users)
	}
}

// A pod serves guests while a sync cannot write the users (a full
// storage): the gate enforces the Secrets, and guests must still list and
// restore, a pod that restarted on the full storage included. An
// incomplete view of the Secrets keeps it out of its Service, and so do
// access rules not yet guestbackup's before any sync applied the users.
func TestServing(t *testing.T) {
	full := errors.New("write users: no space left on device")
	errIncomplete := errors.New("users Secret main-users-15: not found")
	applied := &Access{Users: map[string]identity.Hash{}}
	for _, tt := range []struct {
		name         string
		inForce      *Access
		rulesInPlace bool
		missingShard bool
		viewErr      error
		err, want    error
	}{
		{name: "a sync that applied everything", inForce: applied, rulesInPlace: true},
		{name: "a later sync that could not write", inForce: applied, rulesInPlace: true, err: full},
		{name: "a later sync that could not write the access rules", inForce: applied, err: full},
		{name: "the first sync of a pod restarted on a full storage: the rules are in place, the users not written", rulesInPlace: true, err: full},
		{name: "the first sync, which could not write the access rules", err: full, want: full},
		{name: "a sync whose view is incomplete", inForce: applied, rulesInPlace: true, missingShard: true, err: full},
		{
			// The last shard came while it ran: the Secrets are complete
			// now, but the users it applied are not theirs.
			name: "a sync that read an incomplete view, the Secrets complete since", rulesInPlace: true,
			viewErr: errIncomplete, err: errIncomplete, want: errIncomplete,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Options{BSLS: "main"})
			s.inForce, s.rulesInPlace, s.viewErr = tt.inForce, tt.rulesInPlace, tt.viewErr
			l := listing(t, nil)
			if tt.missingShard {
				delete(l.stores, userset.SecretName("main", 3))
			}
			got := s.serving(l, tt.err)
			if tt.missingShard && !apierrors.IsNotFound(got) {
				t.Errorf("serving: %v, want the missing shard", got)
			}
			if !tt.missingShard && !errors.Is(got, tt.want) {
				t.Errorf("serving: %v, want %v", got, tt.want)
			}
		})
	}
}

// The storage's words of a refused write are kept from the first refusal
// until a write is taken, so that retries against the same full storage
// publish nothing new.
func TestNoteApplied(t *testing.T) {
	s := New(Options{})
	s.noteApplied(errors.New("write p1.tmp.aaaa: no space left on device"))
	s.noteApplied(errors.New("write p1.tmp.bbbb: no space left on device"))
	if got := s.NotApplied(); got != "write p1.tmp.aaaa: no space left on device" {
		t.Errorf("NotApplied after two refusals: %q, want the first's words", got)
	}
	s.noteApplied(nil)
	if got := s.NotApplied(); got != "" {
		t.Errorf("NotApplied after a write was taken: %q", got)
	}
}

func TestCommonVersion(t *testing.T) {
	scrypt, pbkdf2 := identity.Hash{Version: identity.Scrypt}, identity.Hash{Version: identity.PBKDF2}
	for _, tc := range []struct {
		name  string
		users map[string]identity.Hash
		want  identity.HashVersion
	}{
		{"no users: Kopia's default", nil, identity.Scrypt},
		{"all PBKDF2", map[string]identity.Hash{"a@x": pbkdf2, "b@x": pbkdf2}, identity.PBKDF2},
		{"most PBKDF2, one hashed before a change", map[string]identity.Hash{"a@x": pbkdf2, "b@x": pbkdf2, "c@x": scrypt}, identity.PBKDF2},
		{"a tie: the lower", map[string]identity.Hash{"a@x": pbkdf2, "b@x": scrypt}, identity.Scrypt},
	} {
		if got := commonVersion(tc.users); got != tc.want {
			t.Errorf("%s: commonVersion = %v, want %v", tc.name, got, tc.want)
		}
	}
}
