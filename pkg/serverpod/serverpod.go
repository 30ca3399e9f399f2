// Package serverpod is what runs beside Kopia in a BackupStorageLocationServer's
// pod (cmd/server), and only there: it is the one process that opens the
// repository, so it alone links Kopia's repository and storage code.
//
// `guestbackup-server init` (Init) connects to or creates the repository on
// its storage, makes its access rules guestbackup's and writes the TLS chain
// the server presents; `guestbackup-server sync-users` (package usersync)
// keeps the repository's users equal to the users Secrets, publishes guest
// activity (package activityscan) and, on an append-only server, applies
// retention on the server's clock (package retention). ControlClient is how
// user sync reaches the Kopia server beside it.
//
// The controller writes the pod's spec; what both sides must agree on
// lives in small shared packages (storagecreds, userset, activity, identity).
package serverpod
