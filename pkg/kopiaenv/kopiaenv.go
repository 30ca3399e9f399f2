// Package kopiaenv names the environment variables through which the
// controller hands the server pod's containers their Kopia secrets and
// settings (pkg/kopiaserver writes them into the Deployment) and which the
// server pod reads (cmd/server). Kopia itself reads them too. The S3
// credentials' variables are pkg/storagecreds's.
package kopiaenv

const (
	// RepositoryPassword holds the repository's password: Kopia's own
	// variable, read by the init container and by user sync.
	RepositoryPassword = "KOPIA_PASSWORD"
	// ControlPassword holds the password of the Kopia server's control
	// user, which user sync logs in as.
	ControlPassword = "KOPIA_SERVER_CONTROL_PASSWORD"
	// CheckForUpdates set to "false" keeps Kopia from looking for a newer
	// release over the network.
	CheckForUpdates = "KOPIA_CHECK_FOR_UPDATES"
)
