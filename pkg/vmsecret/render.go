package vmsecret

import (
	"maps"
	"time"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/cloudinit"
)

// Guest is what a Secret's payload says of its VM's guest: who it connects
// as, its credentials, and what it backs up when.
type Guest struct {
	// Username is the VM's Kopia identity (identity.OfVM).
	Username string
	// Password and Generation are the Secret's credentials.
	Password   string
	Generation int64
	// Paths and Schedule are the VM's (cloudinit.Schedule).
	Paths    []string
	Schedule string
}

// Render renders guest's bootstrap for server as it publishes itself now
// (its endpoint, CA, kopia client and guests' spread), placed as p, into
// s's payload, and records what it was rendered with (Rendered,
// RenderedClient), for the controller to render it again when the server
// publishes others. Every payload key of an earlier rendering goes, so that
// a mode change leaves none of the other mode's files; the credentials and
// the controller's keys stay as they are. The webhook renders a VM's
// payload at admission and the controller again as its server changes:
// both through Render, so both write the same Secret for the same input.
// at is when (RenderedCAAt).
func Render(s *corev1.Secret, server *v1alpha1.BackupStorageLocationServer, guest Guest, p cloudinit.Placement, at time.Time) error {
	endpoint, ca := server.Status.Endpoint, []byte(server.Status.TLSCA)
	kopiaClient := cloudinit.UsableClient(server.Status.Client)
	payload, err := cloudinit.Payload(cloudinit.Bootstrap{
		ServerURL: endpoint, CA: ca,
		Username: guest.Username, Password: guest.Password, Generation: guest.Generation,
		Paths: guest.Paths, Schedule: guest.Schedule,
		Spread: cloudinit.SpreadOf(server.Spec.GuestSpread), Client: kopiaClient,
		RequestPoll: requestPoll(server),
	}, p)
	if err != nil {
		return err // each caller says whose bootstrap, in its own words
	}
	if s.Data == nil {
		s.Data = map[string][]byte{}
	}
	maps.DeleteFunc(s.Data, func(k string, _ []byte) bool { return IsPayloadKey(k) })
	maps.Copy(s.Data, payload)
	SetRendered(s, endpoint, ca, at)
	SetRenderedClient(s, ClientDigest(server))
	return nil
}

// requestPoll is how often the server's guests poll for requests: its
// status.requestPollInterval, while it hands out a client (whose port
// serves them).
func requestPoll(server *v1alpha1.BackupStorageLocationServer) time.Duration {
	if d := server.Status.RequestPollInterval; d != nil && cloudinit.UsableClient(server.Status.Client) != nil {
		return d.Truncate(time.Second)
	}
	return 0
}

// ClientDigest sums what of server's client port a bootstrap renders: the
// client it hands out and how often guests poll it for requests. A
// server that carries no requests has the digest of its client alone, as
// before requests existed, so that no bootstrap is rendered again for them.
func ClientDigest(server *v1alpha1.BackupStorageLocationServer) string {
	digest := clientdist.Digest(cloudinit.UsableClient(server.Status.Client))
	if poll := requestPoll(server); poll > 0 {
		digest += " requests every " + poll.String()
	}
	return digest
}
