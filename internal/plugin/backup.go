package plugin

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// backupOptions are `backup`'s own flags.
type backupOptions struct {
	requestOptions
	paths       []string
	tags        []string
	description string
}

func newBackupCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	o := backupOptions{requestOptions: newRequestOptions()}
	cmd := &cobra.Command{
		Use:   "backup VM",
		Short: "Back a VM up now: its guest snapshots its paths",
		Long: `Ask the guest of a VirtualMachine to snapshot now, under its own identity:
this creates a GuestSnapshot (alpha: your admin enables requests) in the VM's
namespace, which needs the namespace's edit role. The running guest takes it
at its next poll of its server (every 30 seconds by default); a stopped VM's
request waits until it runs. The paths are the VM's guestbackup.io/paths
unless you name others. Name the VM as NAME or vm/NAME.

With --wait, it follows the request until it ends and prints what was taken.

` + requestExitCodes,
		Example: `  # Back up web now, and wait for the snapshots
  kubectl guestbackup backup web -n apps --wait

  # Only /etc, tagged, as JSON once it ends
  kubectl guestbackup backup vm/web --path /etc --tag reason=upgrade --wait -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), flags, streams, args[0])
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// addFlags binds backup's flags to o.
func (o *backupOptions) addFlags(f *pflag.FlagSet) {
	f.StringArrayVar(&o.paths, "path", nil, "An absolute guest path to snapshot (repeatable); default: the VM's guestbackup.io/paths.")
	f.StringArrayVar(&o.tags, "tag", nil, "A Kopia tag KEY=VALUE for each snapshot (repeatable).")
	f.StringVar(&o.description, "description", "", "The snapshots' description.")
	o.requestOptions.addFlags(f)
}

func (o backupOptions) run(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, arg string) error {
	printer, vm, err := o.prepare(arg)
	if err != nil {
		return err
	}
	spec, err := o.spec(vm)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	c, namespace, err := newClient(flags)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	s := &v1alpha1.GuestSnapshot{ObjectMeta: o.objectMeta(namespace, vm), Spec: spec}
	return o.submit(ctx, c, streams, printer, snapshotRequest{s})
}

// spec is the GuestSnapshot the flags ask of vm.
func (o backupOptions) spec(vm string) (v1alpha1.GuestSnapshotSpec, error) {
	tags := map[string]string{}
	for _, t := range o.tags {
		k, v, ok := strings.Cut(t, "=")
		if !ok || k == "" {
			return v1alpha1.GuestSnapshotSpec{}, fmt.Errorf("--tag %q: want KEY=VALUE", t)
		}
		tags[k] = v
	}
	if len(tags) == 0 {
		tags = nil
	}
	return v1alpha1.GuestSnapshotSpec{VM: vm, Paths: o.paths, Tags: tags, Description: o.description}, nil
}

// snapshotRequest is a GuestSnapshot as `backup` makes it.
type snapshotRequest struct{ s *v1alpha1.GuestSnapshot }

func (r snapshotRequest) object() client.Object { return r.s }
func (r snapshotRequest) kind() string          { return "GuestSnapshot" }
func (r snapshotRequest) vm() string            { return r.s.Spec.VM }

func (r snapshotRequest) next() string {
	return fmt.Sprintf("the guest of VirtualMachine %s takes it at its next poll of its server", r.s.Spec.VM)
}

func (r snapshotRequest) state() (v1alpha1.RequestPhase, string) {
	return r.s.Status.Phase, r.s.Status.Message
}

func (r snapshotRequest) printOutcome(w io.Writer) {
	s := r.s
	if s.Status.Phase != v1alpha1.PhaseSucceeded {
		fmt.Fprintf(w, "guestsnapshot/%s failed: %s\n", s.Name, s.Status.Message)
		return
	}
	fmt.Fprintf(w, "guestsnapshot/%s succeeded: %d files, %s\n", s.Name, s.Status.Files, size(s.Status.Bytes))
	printSnapshots(w, s.Status.Snapshots)
}

// printSnapshots tabulates the snapshot of each path of a request.
func printSnapshots(w io.Writer, snapshots []v1alpha1.PathSnapshot) {
	if len(snapshots) == 0 {
		return
	}
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, "PATH\tSNAPSHOT")
	for _, p := range snapshots {
		fmt.Fprintf(tw, "%s\t%s\n", p.Path, p.ID)
	}
	_ = tw.Flush()
}
