package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// ExitRequestFailed: the request ended Failed, or did not end within
// --timeout.
const ExitRequestFailed = 4

// requestExitCodes documents, in each request command's help, what its exit
// code says.
const requestExitCodes = `Exit codes: 0 the request was created (and, with --wait, succeeded);
1 the command failed (flags, the API server, RBAC, the request refused at
admission: its message says what to fix); 4 the request failed, or did not
end within --timeout.`

// request is a GuestSnapshot or a GuestRestore, as the commands that make
// one see it: what they create, say, follow and print is the same for
// both but for these.
type request interface {
	// object is the API object, for the client and the printers.
	object() client.Object
	// kind is the object's kind, which a typed client leaves empty.
	kind() string
	// vm is the VirtualMachine the request is for.
	vm() string
	// next says what the request does once created.
	next() string
	// state is the request's phase and how far it got, which --wait
	// prints on each change.
	state() (v1alpha1.RequestPhase, string)
	// printOutcome says what the ended request did.
	printOutcome(w io.Writer)
}

// requestOptions are the flags every command that makes a request has.
type requestOptions struct {
	name    string
	wait    bool
	timeout time.Duration
	output  string
	// poll is how often --wait reads the request; tests shorten it.
	poll time.Duration
}

func newRequestOptions() requestOptions { return requestOptions{poll: 2 * time.Second} }

func (o *requestOptions) addFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.name, "name", "", "The request's name (default: the VM's name and a random suffix).")
	fs.BoolVar(&o.wait, "wait", false, "Wait until the request ends, printing its progress.")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Minute, "With --wait, how long to wait before giving up (the request goes on).")
	fs.StringVarP(&o.output, "output", "o", "", "Output format of the request: json or yaml (default: a summary).")
}

// objectMeta names a request for vm in namespace: --name, else the VM's
// name and a suffix the API server picks.
func (o requestOptions) objectMeta(namespace, vm string) metav1.ObjectMeta {
	if o.name != "" {
		return metav1.ObjectMeta{Namespace: namespace, Name: o.name}
	}
	return metav1.ObjectMeta{Namespace: namespace, GenerateName: vm + "-"}
}

// submit creates r with c, says so, follows it with --wait, and prints it as
// -o asks; its error carries the exit code.
func (o requestOptions) submit(ctx context.Context, c client.Client, streams genericiooptions.IOStreams, printer printers.ResourcePrinter, r request) error {
	obj := r.object()
	if err := c.Create(ctx, obj); err != nil {
		return &ExitError{ExitFailed, fmt.Errorf("create a %s of VirtualMachine %s/%s: %w", r.kind(), obj.GetNamespace(), r.vm(), err)}
	}
	fmt.Fprintf(streams.ErrOut, "%s/%s created: %s\n", resourceOf(r), obj.GetName(), r.next())
	if o.wait {
		if err := o.follow(ctx, c, r, streams.ErrOut); err != nil {
			return err
		}
	}
	if printer != nil {
		obj.GetObjectKind().SetGroupVersionKind(v1alpha1.GroupVersion.WithKind(r.kind()))
		if err := printer.PrintObj(obj, streams.Out); err != nil {
			return &ExitError{ExitFailed, err}
		}
	} else if o.wait {
		r.printOutcome(streams.Out)
	}
	if phase, _ := r.state(); o.wait && phase != v1alpha1.PhaseSucceeded {
		return &ExitError{ExitRequestFailed, errSaid}
	}
	return nil
}

// follow reads r until it ends or --timeout passes, printing a line to
// progress on each change of its phase or progress.
func (o requestOptions) follow(ctx context.Context, c client.Client, r request, progress io.Writer) error {
	obj := r.object()
	said := ""
	err := wait.PollUntilContextTimeout(ctx, o.poll, o.timeout, true, func(ctx context.Context) (bool, error) {
		if err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj); err != nil {
			return false, err
		}
		if line := stateLine(r); line != said {
			said = line
			fmt.Fprintln(progress, line)
		}
		phase, _ := r.state()
		return phase == v1alpha1.PhaseSucceeded || phase == v1alpha1.PhaseFailed, nil
	})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		phase, _ := r.state()
		return &ExitError{ExitRequestFailed, fmt.Errorf("%s/%s has not ended within %s (it is %s); it goes on: kubectl get %s %s -n %s",
			resourceOf(r), obj.GetName(), o.timeout, phaseOrNew(phase), resourceOf(r), obj.GetName(), obj.GetNamespace())}
	}
	return &ExitError{ExitFailed, fmt.Errorf("follow %s/%s: %w", resourceOf(r), obj.GetName(), err)}
}

// stateLine is the line --wait prints of r's state: its phase, and how far
// it got; empty until it is picked up.
func stateLine(r request) string {
	phase, line := r.state()
	switch {
	case phase == "":
		return ""
	case line == "":
		return string(phase)
	}
	return string(phase) + ": " + line
}

// resourceOf is r's resource, as kubectl names it: guestsnapshot.
func resourceOf(r request) string { return strings.ToLower(r.kind()) }

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

// vmName is the VM an argument names: NAME, vm/NAME or virtualmachine/NAME,
// as kubectl spells a resource.
func vmName(arg string) (string, error) {
	kind, name, ok := strings.Cut(arg, "/")
	if !ok && arg != "" {
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

// prepare checks the flags every request command has, and the VM argument.
func (o requestOptions) prepare(arg string) (printers.ResourcePrinter, string, error) {
	printer, err := printerFor(o.output)
	if err != nil {
		return nil, "", &ExitError{ExitFailed, err}
	}
	vm, err := vmName(arg)
	if err != nil {
		return nil, "", &ExitError{ExitFailed, err}
	}
	return printer, vm, nil
}
