package kopiaserver

import (
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// RepositoryOpened reports whether a server pod of b ever opened its
// repository: status.repositoryOpened is set, or (for a BSLS whose status
// predates that field) RepositoryReady is True. A repository that was
// opened exists, and only the password it was opened with opens it.
func RepositoryOpened(b *v1alpha1.BackupStorageLocationServer) bool {
	return b.Status.RepositoryOpened != nil || meta.IsStatusConditionTrue(b.Status.Conditions, v1alpha1.ConditionRepositoryReady)
}

// decidePassword decides what the repository password Secret needs, from
// whether it was found and holds its key: nothing (nil, false), a problem
// for the admin, or a generated password (true). A password is generated
// only for a BSLS that names no Secret of its own and never opened its
// repository: once the repository exists, a new password cannot open it,
// and the lost one must be restored.
func decidePassword(b *v1alpha1.BackupStorageLocationServer, found, hasKey bool) (generate bool, p *problem) {
	sel := RepositoryPassword(b)
	switch {
	case found && hasKey:
		return false, nil
	case found:
		return false, &problem{ReasonPasswordSecretInvalid, fmt.Sprintf("Secret %s has no key %s: it must hold the repository password", sel.Name, sel.Key)}
	case b.Spec.Repository.PasswordSecretRef != nil:
		return false, &problem{ReasonPasswordSecretInvalid, fmt.Sprintf("Secret %s not found in namespace %s: create it with the repository password in key %s, or remove repository.passwordSecretRef so that the controller generates one", sel.Name, b.Namespace, sel.Key)}
	case RepositoryOpened(b):
		since := ""
		if t := b.Status.RepositoryOpened; t != nil {
			since = " on " + t.UTC().Format(time.RFC3339)
		}
		return false, &problem{ReasonRepositoryPasswordLost, fmt.Sprintf(
			"Secret %s, the generated password of the repository on %s, is gone, but a server opened that repository with it%s: "+
				"no new password is generated, because only that one decrypts the backups. Restore Secret %s (key %s) in namespace %s "+
				"from your backup of it; running server pods keep serving until they restart. If it is truly lost, so are the backups: "+
				"point the BackupStorageLocationServer at new storage (or a new repository.pathPrefix) and re-create it",
			sel.Name, storageDescription(b), since, sel.Name, sel.Key, b.Namespace)}
	}
	return true, nil
}

// withPasswordHint explains a failure to open the repository that names
// its password, when the controller generated that password for a BSLS
// that never opened its repository: the storage holds a repository made
// with another password, as on a new cluster attached to old storage
// (disaster recovery) whose password Secret was not restored first.
func withPasswordHint(b *v1alpha1.BackupStorageLocationServer, p *problem) *problem {
	if p == nil || b.Spec.Repository.PasswordSecretRef != nil || RepositoryOpened(b) || !strings.Contains(strings.ToLower(p.Message), "password") {
		return p
	}
	sel := RepositoryPassword(b)
	return &problem{p.Reason, p.Message + fmt.Sprintf(
		". The storage already holds a repository, and Secret %s holds a password the controller generated for a new one: "+
			"on a new cluster attached to existing storage, replace Secret %s (key %s) with the one backed up from the old cluster, then delete the server pod",
		sel.Name, sel.Name, sel.Key)}
}
