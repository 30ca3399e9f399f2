// Package restorejob is the contract of a restore Job (a GuestRestore into
// a PersistentVolumeClaim, docs/requests.md "Into a claim"): the
// environment variables and mounts the controller's Job gives the program
// it runs (package runner), declared once for both.
package restorejob

// The contract between the Job the controller writes and package runner:
// the environment variables the Job's container sets, and where its
// volumes are mounted.
const (
	// EnvServerURL is the Kopia server's URL (the BSLS's status.endpoint).
	EnvServerURL = "GUESTBACKUP_SERVER_URL"
	// EnvClientURL is the URL of the server's client port, where requests
	// are polled and answered (the BSLS's status.client.url).
	EnvClientURL = "GUESTBACKUP_CLIENT_URL"
	// EnvCA is the PEM of the CA the server's certificate chains to
	// (status.tlsCA): the only one the Job trusts.
	EnvCA = "GUESTBACKUP_CA"
	// EnvUser is the VM's Kopia identity, <vm>@<namespace>.
	EnvUser = "GUESTBACKUP_USER"
	// EnvPassword is the VM's password, from its Secret (never an
	// argument).
	EnvPassword = "GUESTBACKUP_PASSWORD"
	// EnvRequest is the GuestRestore's UID.
	EnvRequest = "GUESTBACKUP_REQUEST"

	// ClaimMount is where the claim is mounted.
	ClaimMount = "/restore"
	// ScratchMount is a folder of the Job's own (an emptyDir) for kopia's
	// configuration, cache and logs: the image's filesystem is read-only.
	ScratchMount = "/scratch"
	// Kopia is the kopia client of the image.
	Kopia = "/usr/local/bin/kopia"
)
