package plugin

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// snapshotsOptions are `snapshots`'s own flags.
type snapshotsOptions struct {
	output string
}

func newSnapshotsCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	var o snapshotsOptions
	cmd := &cobra.Command{
		Use:   "snapshots VM",
		Short: "List a VM's newest snapshots, to choose one to restore from",
		Long: fmt.Sprintf(`List the snapshots of a VirtualMachine, newest first: the catalogue
guestbackup keeps in the VM's GuestProtection (at most the newest %d), so
the namespace's view role is enough. Name the VM as NAME or vm/NAME.

Each line is one snapshot of one of the VM's paths: its ID (for
'restore --from ID'), when the guest started it (STARTED, in UTC, and its
AGE), the path, and how many files and bytes it holds. 'restore --before
TIME' restores from the newest snapshot started before TIME, among all the
VM's snapshots on its server: when the server holds more than the list
shows, a line on standard error says how many, and that --before reaches
the older ones.

-o json or -o yaml prints an object a script can read:
  namespace, vm  the VM;
  total          how many snapshots its server holds (status.snapshots);
  snapshots      the listed ones, newest first, each with id, path,
                 startTime, endTime, bytes and files ([] when none).

Exit codes: 0 the snapshots were listed, even none (then a line on
standard error says why); 1 the command failed (flags, the API server,
RBAC); 2 the VM does not opt in, or guestbackup has not seen it yet.`, v1alpha1.MaxRecentSnapshots),
		Example: `  # web's newest snapshots
  kubectl guestbackup snapshots web -n apps

  # Restore /etc/nginx from one of them, by the ID the list shows
  kubectl guestbackup restore vm/web /etc/nginx -n apps --from k7b3f2c1a9e8d7c6b5a4f3e2d1c0b9a8f --wait

  # The newest snapshot of /etc, with jq
  kubectl guestbackup snapshots vm/web -o json | jq -r '[.snapshots[] | select(.path == "/etc")][0].id'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), flags, streams, args[0])
		},
	}
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (default: a table).")
	return cmd
}

func (o snapshotsOptions) run(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, arg string) error {
	// -o takes what every command's does; the catalogue, not being an API
	// object, is printed below rather than by the printer.
	if _, err := printerFor(o.output); err != nil {
		return &ExitError{ExitFailed, err}
	}
	vm, err := vmName(arg)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	c, namespace, err := newClient(flags)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	return o.show(ctx, c, streams, namespace, vm, time.Now())
}

// show reads the GuestProtection of namespace/vm with c and prints its
// catalogue as -o asks; its error carries the exit code.
func (o snapshotsOptions) show(ctx context.Context, c client.Client, streams genericiooptions.IOStreams, namespace, vm string, now time.Time) error {
	p, err := getProtection(ctx, c, namespace, vm)
	if err != nil {
		return err
	}
	l := catalogueOf(p)
	switch o.output {
	case "json":
		err = printJSON(streams.Out, l)
	case "yaml":
		err = printYAML(streams.Out, l)
	default:
		err = printCatalogue(streams.Out, streams.ErrOut, l, p.Status.Server, now)
	}
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	// Listing none is an answer, as `kubectl get` exits 0 with "No
	// resources found": a script that asks whether the VM is backed up
	// asks `status`, whose exit code says so.
	return nil
}

// snapshotCatalogue is a VM's snapshots as `snapshots -o json|yaml` prints
// them; its fields are documented in the command's help.
type snapshotCatalogue struct {
	Namespace string                          `json:"namespace"`
	VM        string                          `json:"vm"`
	Total     int32                           `json:"total"`
	Snapshots []v1alpha1.GuestSnapshotSummary `json:"snapshots"`
}

// catalogueOf is p's catalogue, newest first. A GuestProtection whose
// server has not published a catalogue yet still names its newest
// snapshot (lastSnapshot): that one is listed rather than none.
func catalogueOf(p *v1alpha1.GuestProtection) snapshotCatalogue {
	l := snapshotCatalogue{Namespace: p.Namespace, VM: p.Name, Total: p.Status.Snapshots,
		Snapshots: slices.Clone(p.Status.RecentSnapshots)}
	if len(l.Snapshots) == 0 && p.Status.LastSnapshot != nil {
		l.Snapshots = []v1alpha1.GuestSnapshotSummary{*p.Status.LastSnapshot}
	}
	if l.Snapshots == nil {
		// A script reads [] rather than null.
		l.Snapshots = []v1alpha1.GuestSnapshotSummary{}
	}
	// The server publishes them newest first; a server of another version
	// than the plugin need not, and a person reads the list top down.
	slices.SortStableFunc(l.Snapshots, func(a, b v1alpha1.GuestSnapshotSummary) int {
		return cmp.Or(b.StartTime.Compare(a.StartTime.Time), b.EndTime.Compare(a.EndTime.Time))
	})
	return l
}

// printCatalogue prints l as a table on out, newest first, and on errOut
// what the table does not show: that it lists only the newest of the VM's
// snapshots, or why it lists none. Keeping those lines off out leaves out
// a table a script can cut.
func printCatalogue(out, errOut io.Writer, l snapshotCatalogue, server string, now time.Time) error {
	vm := l.Namespace + "/" + l.VM
	// --before reaches the snapshots the catalogue does not hold.
	before := fmt.Sprintf("kubectl guestbackup restore vm/%s PATH -n %s --before TIME restores from the newest snapshot started before TIME, among all %d", l.VM, l.Namespace, l.Total)
	switch {
	case len(l.Snapshots) == 0 && l.Total == 0:
		_, err := fmt.Fprintf(errOut, "No snapshot of VirtualMachine %s has reached its server yet: kubectl guestbackup status %s -n %s says whether its guest connects.\n", vm, l.VM, l.Namespace)
		return err
	case len(l.Snapshots) == 0:
		_, err := fmt.Fprintf(errOut, "%s holds %d snapshots of VirtualMachine %s but has not listed them in its GuestProtection yet. To restore from one: %s.\n", cmp.Or(server, "Its server"), l.Total, vm, before)
		return err
	}
	tw := printers.GetNewTabWriter(out)
	fmt.Fprintln(tw, "ID\tSTARTED\tAGE\tPATH\tFILES\tSIZE")
	for _, s := range l.Snapshots {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\n", s.ID, s.StartTime.UTC().Format(time.RFC3339), age(&s.StartTime, now), s.Path, s.Files, size(s.Bytes))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if int(l.Total) > len(l.Snapshots) {
		_, err := fmt.Fprintf(errOut, "Listed: the newest %d of the %d snapshots of VirtualMachine %s. For an older one: %s.\n", len(l.Snapshots), l.Total, vm, before)
		return err
	}
	return nil
}

// printJSON prints v as kubectl's -o json does: indented by four spaces.
func printJSON(w io.Writer, v any) error {
	data, err := json.MarshalIndent(v, "", "    ")
	if err != nil {
		return fmt.Errorf("print JSON: %w", err)
	}
	_, err = fmt.Fprintf(w, "%s\n", data)
	return err
}

// printYAML prints v as kubectl's -o yaml does.
func printYAML(w io.Writer, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("print YAML: %w", err)
	}
	_, err = w.Write(data)
	return err
}
