package plugin

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/units"
)

// Exit codes of `kubectl guestbackup status`, so that a script can tell an
// error from a VM that is not protected.
const (
	// ExitOK: every VM shown has a fresh backup and a connected guest.
	ExitOK = 0
	// ExitFailed: the command failed (flags, the API server, RBAC).
	ExitFailed = 1
	// ExitNotProtected: the named VM has no GuestProtection: it does not
	// opt in (guestbackup.io/server), or the controller has not seen it yet.
	ExitNotProtected = 2
	// ExitNotFresh: a VM shown has no fresh backup (BackupFresh is not
	// True) or its guest is known not to connect (GuestConnected False).
	ExitNotFresh = 3
)

// healthy reports whether p's VM has a fresh backup and a guest that is
// not known to be disconnected.
func healthy(p *v1alpha1.GuestProtection) bool {
	return meta.IsStatusConditionTrue(p.Status.Conditions, v1alpha1.ConditionBackupFresh) &&
		!meta.IsStatusConditionFalse(p.Status.Conditions, v1alpha1.ConditionGuestConnected)
}

// statusExit is the exit code for the protections shown.
func statusExit(ps []v1alpha1.GuestProtection) int {
	for i := range ps {
		if !healthy(&ps[i]) {
			return ExitNotFresh
		}
	}
	return ExitOK
}

// conditionStatus is a condition's status, "Unknown" when it is missing.
func conditionStatus(p *v1alpha1.GuestProtection, typ string) string {
	if c := meta.FindStatusCondition(p.Status.Conditions, typ); c != nil {
		return string(c.Status)
	}
	return string(metav1.ConditionUnknown)
}

// age is how long ago t was, as kubectl prints ages; "<none>" for none.
func age(t *metav1.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "<none>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

// size prints bytes for a person, as the controller's messages do.
func size(bytes int64) string { return units.Bytes(uint64(max(bytes, 0))) }

// printTable prints one line per VM, sorted by namespace and name; with
// allNamespaces, a NAMESPACE column first.
func printTable(w io.Writer, ps []v1alpha1.GuestProtection, allNamespaces bool, now time.Time) error {
	slices.SortFunc(ps, func(a, b v1alpha1.GuestProtection) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	header := []string{"VM", "SERVER", "SNAPSHOTS", "LAST BACKUP", "SIZE", "CONNECTED", "FRESH"}
	if allNamespaces {
		header = append([]string{"NAMESPACE"}, header...)
	}
	fmt.Fprintln(tw, strings.Join(header, "\t"))
	for i := range ps {
		p := &ps[i]
		var last *metav1.Time
		sz := "<none>"
		if s := p.Status.LastSnapshot; s != nil {
			last, sz = &s.EndTime, size(s.Bytes)
		}
		row := []string{p.Name, cmp.Or(p.Status.Server, "<none>"), fmt.Sprint(p.Status.Snapshots), age(last, now), sz,
			conditionStatus(p, v1alpha1.ConditionGuestConnected), conditionStatus(p, v1alpha1.ConditionBackupFresh)}
		if allNamespaces {
			row = append([]string{p.Namespace}, row...)
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

// printDetail prints one VM's protection, as `kubectl describe` would,
// with the conditions' reasons and messages: what to look at next.
func printDetail(w io.Writer, p *v1alpha1.GuestProtection, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "VM:\t%s/%s\n", p.Namespace, p.Name)
	fmt.Fprintf(tw, "Server:\t%s\n", cmp.Or(p.Status.Server, "<none>"))
	fmt.Fprintf(tw, "Identity:\t%s\n", cmp.Or(p.Status.Identity, "<none>"))
	first := ""
	if t := p.Status.FirstSnapshotTime; t != nil {
		first = fmt.Sprintf(" (the first %s, %s ago)", t.UTC().Format(time.RFC3339), age(t, now))
	}
	fmt.Fprintf(tw, "Snapshots:\t%d%s\n", p.Status.Snapshots, first)
	if s := p.Status.LastSnapshot; s != nil {
		fmt.Fprintf(tw, "Last backup:\t%s (%s ago) of %s: %s in %d files, snapshot %s\n",
			s.EndTime.UTC().Format(time.RFC3339), age(&s.EndTime, now), s.Path, size(s.Bytes), s.Files, s.ID)
	} else {
		fmt.Fprintf(tw, "Last backup:\t<none>\n")
	}
	for _, typ := range []string{v1alpha1.ConditionGuestConnected, v1alpha1.ConditionBackupFresh} {
		c := meta.FindStatusCondition(p.Status.Conditions, typ)
		if c == nil {
			fmt.Fprintf(tw, "%s:\tUnknown\n", typ)
			continue
		}
		fmt.Fprintf(tw, "%s:\t%s (%s) %s\n", typ, c.Status, c.Reason, c.Message)
	}
	return tw.Flush()
}
