package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/units"
)

// ExitRequestFailed: the request ended Failed, or did not end within
// --timeout.
const ExitRequestFailed = 4

// backupOptions are `backup`'s own flags.
type backupOptions struct {
	paths       []string
	tags        []string
	description string
	wait        bool
	timeout     time.Duration
	output      string
	// poll is how often --wait reads the request; tests shorten it.
	poll time.Duration
}

func newBackupCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	o := backupOptions{poll: 2 * time.Second}
	cmd := &cobra.Command{
		Use:   "backup VM",
		Short: "Back a VM up now: its guest snapshots its paths",
		Long: `Ask the guest of a VirtualMachine to snapshot now, under its own identity:
this creates a GuestSnapshot (alpha: your admin enables requests) in the VM's
namespace, which needs the namespace's edit role. The running guest takes it
at its next poll of its server (every 30 seconds by default); a stopped VM's
request waits until it runs. The paths are the VM's guestbackup.io/paths
unless you name others.

With --wait, it follows the request until it ends and prints what was taken.

Exit codes: 0 the request was created (and, with --wait, succeeded);
1 the command failed (flags, the API server, RBAC, the request refused at
admission: its message says what to fix); 4 the request failed, or did not
end within --timeout.`,
		Example: `  # Back up web now, and wait for the snapshots
  kubectl guestbackup backup web -n apps --wait

  # Only /etc, tagged, as JSON once it ends
  kubectl guestbackup backup vm/web --path /etc --tag reason=upgrade --wait -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), flags, streams, args[0])
		},
	}
	cmd.Flags().StringArrayVar(&o.paths, "path", nil, "An absolute guest path to snapshot (repeatable); default: the VM's guestbackup.io/paths.")
	cmd.Flags().StringArrayVar(&o.tags, "tag", nil, "A Kopia tag KEY=VALUE for each snapshot (repeatable).")
	cmd.Flags().StringVar(&o.description, "description", "", "The snapshots' description.")
	cmd.Flags().BoolVar(&o.wait, "wait", false, "Wait until the request ends, printing its progress.")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 30*time.Minute, "With --wait, how long to wait before giving up (the request goes on).")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "Output format of the request: json or yaml (default: a summary).")
	return cmd
}

// vmName is the VM an argument names: NAME or vm/NAME.
func vmName(arg string) (string, error) {
	kind, name, ok := strings.Cut(arg, "/")
	if !ok {
		return arg, nil
	}
	switch strings.ToLower(kind) {
	case "vm", "vms", "virtualmachine", "virtualmachines", "virtualmachine.kubevirt.io":
		if name != "" && !strings.Contains(name, "/") {
			return name, nil
		}
	}
	return "", fmt.Errorf("%q names no VirtualMachine: give NAME or vm/NAME", arg)
}

func (o backupOptions) run(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, arg string) error {
	printer, err := printerFor(o.output)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	vm, err := vmName(arg)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	tags := map[string]string{}
	for _, t := range o.tags {
		k, v, ok := strings.Cut(t, "=")
		if !ok || k == "" {
			return &ExitError{ExitFailed, fmt.Errorf("--tag %q: want KEY=VALUE", t)}
		}
		tags[k] = v
	}
	if len(tags) == 0 {
		tags = nil
	}
	c, namespace, err := newClient(flags)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	s := &v1alpha1.GuestSnapshot{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, GenerateName: vm + "-"},
		Spec:       v1alpha1.GuestSnapshotSpec{VM: vm, Paths: o.paths, Tags: tags, Description: o.description},
	}
	if err := c.Create(ctx, s); err != nil {
		return &ExitError{ExitFailed, fmt.Errorf("create a GuestSnapshot of VirtualMachine %s/%s: %w", namespace, vm, err)}
	}
	fmt.Fprintf(streams.ErrOut, "guestsnapshot/%s created: the guest of VirtualMachine %s takes it at its next poll of its server\n", s.Name, vm)
	if o.wait {
		if err := o.follow(ctx, c, s, streams.ErrOut); err != nil {
			return err
		}
	}
	if printer != nil {
		s.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("GuestSnapshot"))
		if err := printer.PrintObj(s, streams.Out); err != nil {
			return &ExitError{ExitFailed, err}
		}
	} else if o.wait {
		printSnapshotOutcome(streams.Out, s)
	}
	if o.wait && s.Status.Phase != v1alpha1.PhaseSucceeded {
		return &ExitError{ExitRequestFailed, errSaid}
	}
	return nil
}

// follow reads s until it ends or --timeout passes, saying each new phase.
func (o backupOptions) follow(ctx context.Context, c client.Client, s *v1alpha1.GuestSnapshot, progress io.Writer) error {
	said := v1alpha1.RequestPhase("")
	err := wait.PollUntilContextTimeout(ctx, o.poll, o.timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(s), s); err != nil {
			return false, err
		}
		if s.Status.Phase != said {
			said = s.Status.Phase
			fmt.Fprintf(progress, "%s: %s\n", said, s.Status.Message)
		}
		return s.Status.Phase == v1alpha1.PhaseSucceeded || s.Status.Phase == v1alpha1.PhaseFailed, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		return &ExitError{ExitRequestFailed, fmt.Errorf("guestsnapshot/%s has not ended within %s (it is %s); it goes on: kubectl get guestsnapshot %s -n %s",
			s.Name, o.timeout, phaseOrNew(s.Status.Phase), s.Name, s.Namespace)}
	}
	return &ExitError{ExitFailed, fmt.Errorf("follow guestsnapshot/%s: %w", s.Name, err)}
}

// printSnapshotOutcome says what an ended request did.
func printSnapshotOutcome(w io.Writer, s *v1alpha1.GuestSnapshot) {
	if s.Status.Phase != v1alpha1.PhaseSucceeded {
		fmt.Fprintf(w, "guestsnapshot/%s failed: %s\n", s.Name, s.Status.Message)
		return
	}
	fmt.Fprintf(w, "guestsnapshot/%s succeeded: %d files, %s\n", s.Name, s.Status.Files, units.Bytes(uint64(max(s.Status.Bytes, 0))))
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, "PATH\tSNAPSHOT")
	for _, p := range s.Status.Snapshots {
		fmt.Fprintf(tw, "%s\t%s\n", p.Path, p.ID)
	}
	_ = tw.Flush()
}

// phaseOrNew is phase, or "not picked up yet" while it is empty.
func phaseOrNew(phase v1alpha1.RequestPhase) string {
	if phase == "" {
		return "not picked up yet"
	}
	return string(phase)
}

// printerFor is the printer of -o output; nil for the default.
func printerFor(output string) (printers.ResourcePrinter, error) {
	switch output {
	case "":
		return nil, nil
	case "json":
		return &printers.JSONPrinter{}, nil
	case "yaml":
		return &printers.YAMLPrinter{}, nil
	}
	return nil, fmt.Errorf("--output %q: want json or yaml", output)
}
