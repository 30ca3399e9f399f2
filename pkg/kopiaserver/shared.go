package kopiaserver

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// ServedNamespaces are the namespaces of the users in set, sorted: a
// user is <vm>@<namespace>, so the part after the last @ is its
// namespace.
func ServedNamespaces(set UserSet) []string {
	seen := map[string]bool{}
	for _, shard := range set.Shards {
		for username := range shard {
			if i := strings.LastIndexByte(username, '@'); i >= 0 {
				seen[username[i+1:]] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

// sharedMessage says what sharing one repository across namespaces means,
// for the BSLS's UsersSynced condition and its Event.
func sharedMessage(namespaces []string) string {
	return fmt.Sprintf("VMs of %d namespaces (%s) share this repository's deduplication: a guest can learn whether content exists in another namespace's backups; "+
		"use one BackupStorageLocationServer per trust domain (docs/security.md)", len(namespaces), abbreviate(namespaces))
}
