// Package plugin is `kubectl guestbackup`, the kubectl plugin owners and
// admins use to see, from the cluster, how their VMs are backed up, and to
// ask for a backup or a restore. It needs no rights beyond those of what it
// does: reading GuestProtections (status, snapshots), which the chart
// aggregates into the built-in view role, and creating and reading the GuestSnapshot
// (backup) or GuestRestore (restore) it makes, which it aggregates into
// edit.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// ExitError is an error that sets the process's exit code.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// errSaid ends a command whose output already said why it did not exit 0.
var errSaid = errors.New("")

// NewCommand is `kubectl guestbackup` with its subcommands, reading and
// writing through streams.
func NewCommand(streams genericiooptions.IOStreams) *cobra.Command {
	flags := genericclioptions.NewConfigFlags(true)
	root := &cobra.Command{
		Use: "guestbackup",
		// kubectl runs the plugin as `kubectl guestbackup`: its help says so.
		Annotations: map[string]string{cobra.CommandDisplayNameAnnotation: "kubectl guestbackup"},
		Short:       "See how guestbackup backs up your VirtualMachines, back them up now, restore their files",
		Long: `kubectl guestbackup shows, from the cluster, how guestbackup backs up the
VirtualMachines of a namespace: their snapshots, their newest backup, and
whether their guests connect (status), and lists a VM's newest snapshots
(snapshots). It reads the GuestProtection guestbackup keeps
for every VM that opts in (annotation guestbackup.io/server), so the
namespace's view role is enough. With the edit role, it backs a VM up now
(backup) and restores files and folders from its snapshots (restore), into
its guest or into a PersistentVolumeClaim: the guest, or a Job, does it
under the VM's own identity. It also lists a file's versions across the
snapshots (history), which the VM's server reads under the same identity.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	flags.AddFlags(root.PersistentFlags())
	root.SetIn(streams.In)
	root.SetOut(streams.Out)
	root.SetErr(streams.ErrOut)
	root.AddCommand(newStatusCommand(flags, streams), newSnapshotsCommand(flags, streams), newBackupCommand(flags, streams), newRestoreCommand(flags, streams), newHistoryCommand(flags, streams))
	return root
}

// statusOptions are `status`'s own flags.
type statusOptions struct {
	allNamespaces bool
	output        string
}

func newStatusCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status [VM]",
		Short: "Show each VM's snapshots, newest backup and connection",
		Long: `Show how the VMs of the namespace are backed up: how many snapshots each
has on its server, when the newest was taken and how big it is, whether its
guest connected (CONNECTED) and whether its newest backup is as recent as its
schedule asks (FRESH). Name a VM for its details, with what to look at next.

Exit codes: 0 every VM shown is fresh and connected; 1 the command failed;
2 the named VM does not opt in, or guestbackup has not seen it yet;
3 a VM shown has no fresh backup, or its guest does not connect.`,
		Example: `  # Every VM of the current namespace
  kubectl guestbackup status

  # One VM, in detail; the exit code says whether it is protected
  kubectl guestbackup status web -n apps

  # Every namespace you may read, as JSON
  kubectl guestbackup status -A -o json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), flags, streams, args)
		},
	}
	cmd.Flags().BoolVarP(&o.allNamespaces, "all-namespaces", "A", false, "Show the VMs of every namespace you may read.")
	cmd.Flags().StringVarP(&o.output, "output", "o", "", "Output format: json or yaml (default: a table, or a VM's details).")
	return cmd
}

func (o statusOptions) run(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, args []string) error {
	printer, err := printerFor(o.output)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	if len(args) == 1 && o.allNamespaces {
		return &ExitError{ExitFailed, errors.New("name a VM or use --all-namespaces, not both")}
	}
	c, namespace, err := newClient(flags)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	now := time.Now()

	if len(args) == 1 {
		vm, err := vmName(args[0])
		if err != nil {
			return &ExitError{ExitFailed, err}
		}
		p, err := getProtection(ctx, c, namespace, vm)
		if err != nil {
			return err
		}
		if printer != nil {
			err = printer.PrintObj(typed(p), streams.Out)
		} else {
			err = printDetail(streams.Out, p, now)
		}
		if err != nil {
			return &ExitError{ExitFailed, err}
		}
		return exitFor(statusExit([]v1alpha1.GuestProtection{*p}))
	}

	list := &v1alpha1.GuestProtectionList{}
	var opts []client.ListOption
	if !o.allNamespaces {
		opts = append(opts, client.InNamespace(namespace))
	}
	if err := c.List(ctx, list, opts...); err != nil {
		return &ExitError{ExitFailed, fmt.Errorf("list GuestProtections: %w", err)}
	}
	switch {
	case printer != nil:
		for i := range list.Items {
			typed(&list.Items[i])
		}
		list.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("GuestProtectionList"))
		err = printer.PrintObj(list, streams.Out)
	case len(list.Items) == 0 && o.allNamespaces:
		_, err = fmt.Fprintln(streams.ErrOut, "No VirtualMachine you may read opts in to guestbackup.")
	case len(list.Items) == 0:
		_, err = fmt.Fprintf(streams.ErrOut, "No VirtualMachine of namespace %s opts in to guestbackup.\n", namespace)
	default:
		err = printTable(streams.Out, list.Items, o.allNamespaces, now)
	}
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	return exitFor(statusExit(list.Items))
}

// getProtection reads the GuestProtection of VM namespace/vm; its error
// carries the exit code: ExitNotProtected when the VM has none.
func getProtection(ctx context.Context, c client.Client, namespace, vm string) (*v1alpha1.GuestProtection, error) {
	p := &v1alpha1.GuestProtection{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: vm}, p); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &ExitError{ExitNotProtected, fmt.Errorf("VirtualMachine %s/%s is not protected by guestbackup: it has no GuestProtection. Annotate it guestbackup.io/server=<namespace>/<server> to opt it in (kubectl describe vm %s says why if it was refused), or wait a minute after doing so", namespace, vm, vm)}
		}
		return nil, &ExitError{ExitFailed, fmt.Errorf("read the GuestProtection of %s/%s: %w", namespace, vm, err)}
	}
	return p, nil
}

// exitFor is nil for ExitOK, else an ExitError that prints nothing.
func exitFor(code int) error {
	if code == ExitOK {
		return nil
	}
	return &ExitError{code, errSaid}
}

// typed sets p's kind, which a typed client leaves empty, for printers.
func typed(p *v1alpha1.GuestProtection) runtime.Object {
	p.SetGroupVersionKind(v1alpha1.GroupVersion.WithKind("GuestProtection"))
	return p
}

// newClient is a client of the cluster the kubeconfig flags name, and the
// namespace they select.
func newClient(flags *genericclioptions.ConfigFlags) (client.Client, string, error) {
	cfg, err := flags.ToRESTConfig()
	if err != nil {
		return nil, "", fmt.Errorf("kubeconfig: %w", err)
	}
	namespace, _, err := flags.ToRawKubeConfigLoader().Namespace()
	if err != nil {
		return nil, "", fmt.Errorf("namespace: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, "", err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("connect to the cluster: %w", err)
	}
	return c, namespace, nil
}
