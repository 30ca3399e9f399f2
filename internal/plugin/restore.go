package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// maxRestorePaths is how many paths one GuestRestore may name (its CRD's
// spec.paths maxItems).
const maxRestorePaths = 64

// restoreOptions are `restore`'s own flags.
type restoreOptions struct {
	requestOptions
	from         string
	before       string
	sourceVM     string
	to           string
	inPlace      bool
	pvc          string
	pvcSize      string
	storageClass string
	list         bool
}

func newRestoreCommand(flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams) *cobra.Command {
	o := restoreOptions{requestOptions: newRequestOptions()}
	cmd := &cobra.Command{
		Use:   "restore VM PATH...",
		Short: "Restore files or folders of a VM from its snapshots",
		Long: `Restore paths of a VirtualMachine's snapshot, under the VM's own identity:
this creates a GuestRestore (alpha: your admin enables requests) in the VM's
namespace, which needs the namespace's edit role. Name the VM as NAME or
vm/NAME, then the absolute paths to restore, as they were snapshotted
(files or folders, at most 64).

Which snapshot: the latest, unless --from names a snapshot ID (as
'kubectl guestbackup snapshots VM' or 'guestbackup-kopia snapshot list'
print it) or --before a time (RFC 3339): the last snapshot started before
it.
--source-vm restores another VM's snapshots (one deleted, say): the VM must
grant it with its annotation guestbackup.io/restore-from=SOURCE.

Where to: by default into a fresh folder in the running guest,
` + v1alpha1.RestoresFolder + `/<request name>, each path at its full path
below it: nothing in the guest is overwritten. Or at most one of:
  --to DIR         under another folder of the running guest;
  --in-place       over the paths themselves, replacing what is there;
  --pvc NAME       into an existing PersistentVolumeClaim of the namespace,
                   for a VM that is stopped, deleted or does not boot;
  --pvc-size SIZE  into a new claim named after the request (optionally
                   --storage-class); attach it with virtctl addvolume or
                   mount it.
The running guest writes nothing where something already is, and follows
no symbolic link on the way, except --in-place. Into a claim, a short-lived
unprivileged Job of the namespace restores under the VM's identity, into
the claim's folder /<request name>, each path at its full path below it;
the files keep their modes and times and belong to the Job's user (owners
are not kept: an unprivileged Job cannot give files away).

--list restores nothing: the VM's server lists what it would write (paths,
types, sizes, modification times; the first 100) and counts it all, even
for a stopped VM; with --wait it prints that listing.

With --wait, it follows the request until it ends, printing what was
written so far, then what was restored, from which snapshots, and where.

` + requestExitCodes,
		Example: `  # /etc/nginx as in web's latest snapshot, into web's restores folder
  kubectl guestbackup restore web /etc/nginx -n apps --wait

  # What restoring /home/alice as it was yesterday evening would write
  kubectl guestbackup restore vm/web /home/alice --before 2026-12-06T18:00:00Z --list --wait

  # Put one file back in place, from a snapshot ID
  kubectl guestbackup restore vm/web /etc/app.conf --from k3c5a1e2f0d9b8a7c6 --in-place --wait

  # web does not boot: its /srv into a new 20 GiB claim, to attach elsewhere
  kubectl guestbackup restore vm/web /srv --pvc-size 20Gi --wait -o yaml`,
		Args: cobra.RangeArgs(2, 1+maxRestorePaths),
		RunE: func(cmd *cobra.Command, args []string) error {
			return o.run(cmd.Context(), flags, streams, args[0], args[1:])
		},
	}
	o.addFlags(cmd.Flags())
	return cmd
}

// addFlags binds restore's flags to o.
func (o *restoreOptions) addFlags(f *pflag.FlagSet) {
	f.StringVar(&o.from, "from", "", "Restore from the snapshot of this ID (default: the latest).")
	f.StringVar(&o.before, "before", "", "Restore from the last snapshot taken before this time, in RFC 3339 (2026-12-06T18:00:00Z).")
	f.StringVar(&o.sourceVM, "source-vm", "", "Restore the snapshots of this VM of the namespace, which the VM grants with guestbackup.io/restore-from (default: the VM itself).")
	f.StringVar(&o.to, "to", "", "Restore under this absolute folder of the running guest (default: "+v1alpha1.RestoresFolder+"/<request name>).")
	f.BoolVar(&o.inPlace, "in-place", false, "Restore each path over itself in the running guest, replacing what is there.")
	f.StringVar(&o.pvc, "pvc", "", "Restore into this existing PersistentVolumeClaim of the namespace, not the guest.")
	f.StringVar(&o.pvcSize, "pvc-size", "", "Restore into a new PersistentVolumeClaim of this size (20Gi), named after the request.")
	f.StringVar(&o.storageClass, "storage-class", "", "With --pvc-size, the new claim's storage class (default: the cluster's).")
	f.BoolVar(&o.list, "list", false, "Restore nothing: list what would be restored (a dry run of the restore).")
	o.requestOptions.addFlags(f)
}

func (o restoreOptions) run(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, arg string, paths []string) error {
	return o.submitRestore(ctx, flags, streams, arg, func(vm string) (v1alpha1.GuestRestoreSpec, error) { return o.spec(vm, paths) })
}

// submitRestore makes, as o says, the GuestRestore that spec asks of the
// VM arg names: restore's, or history's.
func (o requestOptions) submitRestore(ctx context.Context, flags *genericclioptions.ConfigFlags, streams genericiooptions.IOStreams, arg string,
	spec func(vm string) (v1alpha1.GuestRestoreSpec, error),
) error {
	printer, vm, err := o.prepare(arg)
	if err != nil {
		return err
	}
	s, err := spec(vm)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	c, namespace, err := newClient(flags)
	if err != nil {
		return &ExitError{ExitFailed, err}
	}
	r := &v1alpha1.GuestRestore{ObjectMeta: o.objectMeta(namespace, vm), Spec: s}
	return o.submit(ctx, c, streams, printer, restoreRequest{r})
}

// spec is the GuestRestore the flags ask of vm's paths. It refuses what
// no request may combine; admission judges the rest, with the VM at hand.
func (o restoreOptions) spec(vm string, paths []string) (v1alpha1.GuestRestoreSpec, error) {
	spec := v1alpha1.GuestRestoreSpec{
		VM: vm, SourceVM: o.sourceVM, Paths: paths, DryRun: o.list,
		Snapshot: v1alpha1.SnapshotSelector{ID: o.from},
		Target:   v1alpha1.RestoreTarget{Directory: o.to, InPlace: o.inPlace},
	}
	if o.from != "" && o.before != "" {
		return spec, errors.New("--from and --before both choose the snapshot: give one, or neither for the latest")
	}
	if o.before != "" {
		t, err := time.Parse(time.RFC3339, o.before)
		if err != nil {
			return spec, fmt.Errorf("--before %q is not a time: give one in RFC 3339, such as 2026-12-06T18:00:00Z", o.before)
		}
		spec.Snapshot.Before = &metav1.Time{Time: t}
	}

	targets := 0
	for _, set := range []bool{o.to != "", o.inPlace, o.pvc != "" || o.pvcSize != ""} {
		if set {
			targets++
		}
	}
	switch {
	case targets > 1:
		return spec, errors.New("--to, --in-place and --pvc/--pvc-size each choose where to restore: give at most one (none restores into " + v1alpha1.RestoresFolder + "/<request name> in the guest)")
	case o.pvc != "" && o.pvcSize != "":
		return spec, errors.New("--pvc names an existing claim and --pvc-size creates one named after the request: give one of them")
	case o.storageClass != "" && o.pvcSize == "":
		return spec, errors.New("--storage-class applies only to a claim --pvc-size creates")
	case o.pvc != "":
		spec.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{ClaimName: o.pvc}
	case o.pvcSize != "":
		q, err := resource.ParseQuantity(o.pvcSize)
		if err != nil {
			return spec, fmt.Errorf("--pvc-size %q is not a size: give one such as 20Gi", o.pvcSize)
		}
		spec.Target.PersistentVolumeClaim = &v1alpha1.RestoreClaim{Size: &q}
		if o.storageClass != "" {
			spec.Target.PersistentVolumeClaim.StorageClassName = &o.storageClass
		}
	}
	return spec, nil
}

// restoreRequest is a GuestRestore as `restore` makes it.
type restoreRequest struct{ r *v1alpha1.GuestRestore }

func (r restoreRequest) object() client.Object { return r.r }
func (r restoreRequest) kind() string          { return "GuestRestore" }
func (r restoreRequest) vm() string            { return r.r.Spec.VM }

func (r restoreRequest) next() string {
	if r.r.Spec.History {
		return "it lists, writing nothing, " + versionsOf(r.r)
	}
	what := fmt.Sprintf("%s from %s %s", strings.Join(r.r.Spec.Paths, ", "), snapshotOf(r.r), restoredTo(r.r))
	if r.r.Spec.DryRun {
		return "it lists, writing nothing, what restoring " + what + " would write"
	}
	return "it restores " + what
}

func (r restoreRequest) state() (v1alpha1.RequestPhase, string) {
	s := r.r.Status
	var said []string
	if s.Progress.Files != 0 || s.Progress.Bytes != 0 {
		said = append(said, fmt.Sprintf("%d files, %s written", s.Progress.Files, size(s.Progress.Bytes)))
	}
	if s.Message != "" {
		said = append(said, s.Message)
	}
	return s.Phase, strings.Join(said, "; ")
}

func (r restoreRequest) printOutcome(w io.Writer) {
	g := r.r
	s := g.Status
	wrote := ""
	if s.Progress.Files != 0 || s.Progress.Bytes != 0 {
		wrote = fmt.Sprintf(" after writing %d files, %s %s", s.Progress.Files, size(s.Progress.Bytes), restoredTo(g))
	}
	switch {
	case s.Phase == v1alpha1.PhaseFailed:
		fmt.Fprintf(w, "guestrestore/%s failed%s: %s\n", g.Name, wrote, s.Message)
	case s.Phase != v1alpha1.PhaseSucceeded && g.Spec.History:
		fmt.Fprintf(w, "guestrestore/%s is %s: it lists %s\n", g.Name, phaseOrNew(s.Phase), versionsOf(g))
	case s.Phase != v1alpha1.PhaseSucceeded:
		fmt.Fprintf(w, "guestrestore/%s is %s: %d files, %s written so far %s\n", g.Name, phaseOrNew(s.Phase), s.Progress.Files, size(s.Progress.Bytes), restoredTo(g))
	case g.Spec.History:
		fmt.Fprintf(w, "guestrestore/%s succeeded: %d versions of %s, newest first, %s\n", g.Name, len(s.History), g.Spec.Paths[0], acrossOf(g))
		printHistory(w, s.History)
		return
	case g.Spec.DryRun && s.DryRun != nil:
		fmt.Fprintf(w, "guestrestore/%s succeeded, a dry run: restoring would write %d files, %s %s\n", g.Name, s.DryRun.Files, size(s.DryRun.Bytes), restoredTo(g))
	case g.Spec.DryRun:
		fmt.Fprintf(w, "guestrestore/%s succeeded, a dry run, but listed nothing\n", g.Name)
	default:
		fmt.Fprintf(w, "guestrestore/%s succeeded: %d files, %s restored %s\n", g.Name, s.Progress.Files, size(s.Progress.Bytes), restoredTo(g))
		if c := g.Spec.Target.PersistentVolumeClaim; c != nil {
			fmt.Fprintf(w, "Attach it to a VM (virtctl addvolume VM --volume-name=%s) or mount it in a pod.\n", claimOf(g))
		}
	}
	if s.Phase == v1alpha1.PhaseSucceeded && s.Message != "" {
		fmt.Fprintln(w, s.Message)
	}
	printSnapshots(w, s.Snapshots)
	if s.Phase == v1alpha1.PhaseSucceeded && s.DryRun != nil {
		printListing(w, s.DryRun)
	}
}

// printListing tabulates what a dry run would write.
func printListing(w io.Writer, l *v1alpha1.DryRunListing) {
	if len(l.Entries) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := printers.GetNewTabWriter(w)
	fmt.Fprintln(tw, "TYPE\tSIZE\tMODIFIED\tPATH")
	for _, e := range l.Entries {
		modified := "-"
		if e.ModTime != nil {
			modified = e.ModTime.UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", e.Type, size(e.Size), modified, e.Path)
	}
	_ = tw.Flush()
	if l.Truncated {
		fmt.Fprintf(w, "(the first %d entries only; the counts above are of all: restore a narrower path to list the rest)\n", len(l.Entries))
	}
}

// snapshotOf says which snapshot r restores from.
func snapshotOf(r *v1alpha1.GuestRestore) string {
	source := r.Spec.SourceVM
	if source == "" {
		source = r.Spec.VM
	}
	switch sel := r.Spec.Snapshot; {
	case sel.ID != "":
		return fmt.Sprintf("snapshot %s of VirtualMachine %s", sel.ID, source)
	case sel.Before != nil:
		return fmt.Sprintf("the last snapshot of VirtualMachine %s before %s", source, sel.Before.UTC().Format(time.RFC3339))
	}
	return "the latest snapshot of VirtualMachine " + source
}

// restoredTo says where r restores, as a phrase that starts with its
// preposition.
func restoredTo(r *v1alpha1.GuestRestore) string {
	t := r.Spec.Target
	switch {
	case t.InPlace:
		return "in place, over what is there, in the guest of VirtualMachine " + r.Spec.VM
	case t.Directory != "":
		return fmt.Sprintf("under %s in the guest of VirtualMachine %s", t.Directory, r.Spec.VM)
	case t.PersistentVolumeClaim != nil && t.PersistentVolumeClaim.ClaimName != "":
		return "into PersistentVolumeClaim " + claimOf(r)
	case t.PersistentVolumeClaim != nil:
		return "into a new PersistentVolumeClaim " + claimOf(r)
	}
	return fmt.Sprintf("into %s/%s in the guest of VirtualMachine %s", v1alpha1.RestoresFolder, r.Name, r.Spec.VM)
}

// claimOf is the claim r restores into: the one it names, else the one
// it creates, named after it.
func claimOf(r *v1alpha1.GuestRestore) string {
	if c := r.Spec.Target.PersistentVolumeClaim; c != nil && c.ClaimName != "" {
		return c.ClaimName
	}
	return r.Name
}
