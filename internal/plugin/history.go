package plugin

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// historyOptions are `history`'s own flags.
type historyOptions struct {
	requestOptions
	before   string
	sourceVM string
}

func newHistoryCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	o := historyOptions{requestOptions: newRequestOptions()}
	cmd := &cobra.Command{
		Use:   "history VM PATH",
		Short: "List the versions of a file or folder across a VM's snapshots",
		Long: fmt.Sprintf(`List the versions of one file or folder of a VirtualMachine across its
snapshots, newest first: for each snapshot that holds it, when the snapshot
started, its ID (restore from it with 'restore --from ID'), the path's type,
size and modification time, and whether its content changed since the next
older version listed. At most %d versions; --before lists those of the
snapshots started before a time.

It creates a GuestRestore that restores nothing (a dry run with
spec.history; alpha: your admin enables requests), which needs the
namespace's edit role: the VM's server reads the versions from its
repository under the VM's own identity, even for a stopped VM, and no guest
is involved. It waits for the answer unless --wait=false.
--source-vm lists another VM's versions (one deleted, say): the VM must
grant it with its annotation guestbackup.io/restore-from=SOURCE.

%s`, v1alpha1.MaxHistoryVersions, requestExitCodes),
		Example: `  # When did /etc/nginx/nginx.conf change?
  kubectl guestbackup history vm/web /etc/nginx/nginx.conf -n apps

  # Then restore the version before the last change, next to the current one
  kubectl guestbackup restore vm/web /etc/nginx/nginx.conf --from k3c5a1e2f0d9b8a7c6 --wait

  # The versions of a deleted VM's folder, through web's grant, as JSON
  kubectl guestbackup history vm/web /srv/data --source-vm old -o json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), flags, streams, args[0], args[1])
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// addFlags binds history's flags to o.
func (o *historyOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.before, "before", "", "List the versions in the snapshots started before this time, in RFC 3339 (2026-12-06T18:00:00Z).")
	f.StringVar(&o.sourceVM, "source-vm", "", "List the versions in the snapshots of this VM of the namespace, which the VM grants with guestbackup.io/restore-from (default: the VM itself).")
	o.requestOptions.addFlags(f)
	// A history is asked to be read: it waits for its answer unless told
	// not to.
	o.wait = true
	f.Lookup("wait").DefValue = "true"
	f.Lookup("wait").Usage = "Wait for the versions and print them (--wait=false only creates the request)."
}

func (o historyOptions) run(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, arg, p string) error {
	return o.submitRestore(ctx, flags, streams, arg, func(vm string) (v1alpha1.GuestRestoreSpec, error) { return o.spec(vm, p) })
}

// spec is the GuestRestore that lists the versions of vm's path p.
func (o historyOptions) spec(vm, p string) (v1alpha1.GuestRestoreSpec, error) {
	spec := v1alpha1.GuestRestoreSpec{VM: vm, SourceVM: o.sourceVM, Paths: []string{p}, DryRun: true, History: true}
	if o.before != "" {
		t, err := time.Parse(time.RFC3339, o.before)
		if err != nil {
			return spec, fmt.Errorf("--before %q is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z", o.before)
		}
		spec.Snapshot.Before = &metav1.Time{Time: t}
	}
	return spec, nil
}

// versionsOf says what a history lists.
func versionsOf(r *v1alpha1.GuestRestore) string {
	return fmt.Sprintf("the versions of %s %s", r.Spec.Paths[0], acrossOf(r))
}

// acrossOf says which snapshots a history lists the versions in.
func acrossOf(r *v1alpha1.GuestRestore) string {
	source := r.Spec.SourceVM
	if source == "" {
		source = r.Spec.VM
	}
	across := "across the snapshots of VirtualMachine " + source
	if b := r.Spec.Snapshot.Before; b != nil {
		across += " started before " + b.UTC().Format(time.RFC3339)
	}
	return across
}

// printHistory tabulates a history's versions, newest first.
func printHistory(w io.Writer, versions []v1alpha1.PathVersion) {
	if len(versions) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, "STARTED\tSNAPSHOT\tTYPE\tSIZE\tMODIFIED\tCHANGED")
	for _, v := range versions {
		modified, changed := "-", "no"
		if v.ModTime != nil {
			modified = v.ModTime.UTC().Format(time.RFC3339)
		}
		if v.Changed {
			changed = "yes"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.StartTime.UTC().Format(time.RFC3339), v.SnapshotID, v.Type, size(v.Size), modified, changed)
	}
	_ = tw.Flush()
}
