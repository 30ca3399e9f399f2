// Package rehash names the repository manifest through which the server
// pod tells a guest's Kopia client to read every file again at its next
// snapshot, rather than trust its previous snapshot.
//
// Kopia's client snapshots incrementally: a file whose size, times and
// owner did not change keeps the content IDs its previous snapshot
// recorded, without being read. When the storage lost a pack, those IDs
// name data that is gone, and every later snapshot of the unchanged file
// is as broken as the first, while reporting success. The server pod drops
// the lost contents from the index (so that writing them again uploads
// them) and writes one Notice per guest whose latest snapshot is damaged;
// the guest's snapshot script reads it, under an ACL that lets a guest
// read its own notices only, and snapshots with --force-hash=100. The
// server pod removes the notice once the guest's latest snapshot is whole.
//
// The package holds only names, so that the webhook, which renders the
// script, links no Kopia.
package rehash

// ManifestType is the value of the manifest's "type" label.
const ManifestType = "guestbackup-rehash"

// Label keys of a notice besides Kopia's "type": the guest's Kopia user
// and host, the same keys and values as on its snapshots, which is what
// the ACL that lets it read the notice matches.
const (
	LabelUsername = "username"
	LabelHostname = "hostname"
)

// Notice is a notice's payload.
type Notice struct {
	// Paths are the guest's sources whose latest snapshot is damaged.
	Paths []string `json:"paths"`
	// Reason says why, for a person who reads the manifest with
	// `kopia manifest show`.
	Reason string `json:"reason"`
}
