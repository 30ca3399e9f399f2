package plugin

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/cli-runtime/pkg/genericiooptions"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
)

// TestVMName holds every request command to the ways kubectl names a VM.
func TestVMName(t *testing.T) {
	for arg, want := range map[string]string{
		"web":                            "web",
		"vm/web":                         "web",
		"VirtualMachine/web":             "web",
		"virtualmachines/web":            "web",
		"virtualmachine.kubevirt.io/web": "web",
		"pod/web":                        "",
		"vm/":                            "",
		"vm/team-a/web":                  "",
		"":                               "",
	} {
		got, err := vmName(arg)
		if got != want || (want == "") != (err != nil) {
			t.Errorf("vmName(%q) = %q, %v; want %q", arg, got, err, want)
		}
	}
}

// fakeAPI is an API server holding requests whose status moves, at each
// read, to the next of statuses, then stays at the last: the controller,
// as --wait sees it.
func fakeAPI(t *testing.T, statuses ...func(client.Object)) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	reads := 0
	return fake.NewClientBuilder().WithScheme(scheme).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if err := c.Get(ctx, key, obj, opts...); err != nil {
				return err
			}
			if len(statuses) > 0 {
				statuses[min(reads, len(statuses)-1)](obj)
				reads++
			}
			return nil
		},
	}).Build()
}

// restoreStatus sets a GuestRestore's status.
func restoreStatus(s v1alpha1.GuestRestoreStatus) func(client.Object) {
	return func(o client.Object) { o.(*v1alpha1.GuestRestore).Status = s }
}

// TestSubmit holds what a request command says, prints and exits with to
// what becomes of its request.
func TestSubmit(t *testing.T) {
	restore := func() request {
		return restoreRequest{&v1alpha1.GuestRestore{
			ObjectMeta: metav1.ObjectMeta{Namespace: "apps", GenerateName: "web-"},
			Spec:       v1alpha1.GuestRestoreSpec{VM: "web", Paths: []string{"/etc/nginx"}},
		}}
	}
	written := func(phase v1alpha1.RequestPhase, files, bytes int64) func(client.Object) {
		return restoreStatus(v1alpha1.GuestRestoreStatus{Phase: phase, Progress: v1alpha1.RestoreProgress{Files: files, Bytes: bytes}})
	}
	succeeded := restoreStatus(v1alpha1.GuestRestoreStatus{
		Phase: v1alpha1.PhaseSucceeded, Progress: v1alpha1.RestoreProgress{Files: 3, Bytes: 3 << 10},
		Snapshots: []v1alpha1.PathSnapshot{{Path: "/etc/nginx", ID: "k1"}},
	})
	const created = "guestrestore/web-1 created: it restores /etc/nginx from the latest snapshot of VirtualMachine web into /var/lib/guestbackup/restores/web-1 in the guest of VirtualMachine web\n"
	tests := []struct {
		name       string
		options    requestOptions
		request    request
		statuses   []func(client.Object)
		refuse     error
		wantErrOut string
		wantOut    string
		wantCode   int
		wantErr    string
	}{
		{
			name:       "created, not followed",
			request:    restore(),
			wantErrOut: created,
		},
		{
			name:    "followed until it succeeds, saying each change once",
			options: requestOptions{wait: true},
			request: restore(),
			statuses: []func(client.Object){
				restoreStatus(v1alpha1.GuestRestoreStatus{}),
				restoreStatus(v1alpha1.GuestRestoreStatus{Phase: v1alpha1.PhasePending, Message: "handed to the guest's server"}),
				written(v1alpha1.PhaseRunning, 0, 0),
				written(v1alpha1.PhaseRunning, 1, 1<<10),
				written(v1alpha1.PhaseRunning, 1, 1<<10),
				written(v1alpha1.PhaseRunning, 2, 2<<10),
				succeeded,
			},
			wantErrOut: created +
				"Pending: handed to the guest's server\n" +
				"Running\n" +
				"Running: 1 files, 1.0 KiB written\n" +
				"Running: 2 files, 2.0 KiB written\n" +
				"Succeeded: 3 files, 3.0 KiB written\n",
			wantOut: "guestrestore/web-1 succeeded: 3 files, 3.0 KiB restored into /var/lib/guestbackup/restores/web-1 in the guest of VirtualMachine web\n" +
				"PATH         SNAPSHOT\n" +
				"/etc/nginx   k1\n",
		},
		{
			name:    "followed until it fails",
			options: requestOptions{wait: true},
			request: restore(),
			statuses: []func(client.Object){restoreStatus(v1alpha1.GuestRestoreStatus{
				Phase: v1alpha1.PhaseFailed, Message: "no snapshot of VirtualMachine web holds /etc/nginx",
			})},
			wantErrOut: created + "Failed: no snapshot of VirtualMachine web holds /etc/nginx\n",
			wantOut:    "guestrestore/web-1 failed: no snapshot of VirtualMachine web holds /etc/nginx\n",
			wantCode:   ExitRequestFailed,
		},
		{
			name:       "followed until --timeout, while it goes on",
			options:    requestOptions{wait: true, timeout: 20 * time.Millisecond},
			request:    restore(),
			statuses:   []func(client.Object){written(v1alpha1.PhaseRunning, 1, 1)},
			wantErrOut: created + "Running: 1 files, 1 B written\n",
			wantCode:   ExitRequestFailed,
			wantErr:    "guestrestore/web-1 has not ended within 20ms (it is Running); it goes on: kubectl get guestrestore web-1 -n apps",
		},
		{
			name:       "printed as JSON once it ends",
			options:    requestOptions{wait: true, output: "json"},
			request:    restore(),
			statuses:   []func(client.Object){succeeded},
			wantErrOut: created + "Succeeded: 3 files, 3.0 KiB written\n",
			wantOut:    `"kind": "GuestRestore"`,
		},
		{
			name:     "refused at admission, saying why",
			options:  requestOptions{wait: true},
			request:  restore(),
			refuse:   errors.New(`admission webhook "requests.guestbackup.io" denied the request: spec.vm: VirtualMachine web is not opted in`),
			wantCode: ExitFailed,
			wantErr:  "create a GuestRestore of VirtualMachine apps/web: admission webhook \"requests.guestbackup.io\" denied the request: spec.vm: VirtualMachine web is not opted in",
		},
		{
			name:    "a backup, followed until it succeeds",
			options: requestOptions{wait: true},
			request: snapshotRequest{&v1alpha1.GuestSnapshot{
				ObjectMeta: metav1.ObjectMeta{Namespace: "apps", GenerateName: "web-"},
				Spec:       v1alpha1.GuestSnapshotSpec{VM: "web"},
			}},
			statuses: []func(client.Object){func(o client.Object) {
				o.(*v1alpha1.GuestSnapshot).Status = v1alpha1.GuestSnapshotStatus{
					Phase: v1alpha1.PhaseSucceeded, Files: 2, Bytes: 2048, Snapshots: []v1alpha1.PathSnapshot{{Path: "/etc", ID: "k2"}},
				}
			}},
			wantErrOut: "guestsnapshot/web-1 created: the guest of VirtualMachine web takes it at its next poll of its server\nSucceeded\n",
			wantOut:    "guestsnapshot/web-1 succeeded: 2 files, 2.0 KiB\nPATH   SNAPSHOT\n/etc   k2\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := fakeAPI(t, tt.statuses...)
			if tt.refuse != nil {
				c = interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
					Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return tt.refuse },
				})
			}
			o := tt.options
			o.poll = time.Millisecond
			if o.timeout == 0 {
				o.timeout = time.Minute
			}
			printer, err := printerFor(o.output)
			if err != nil {
				t.Fatal(err)
			}
			var out, errOut strings.Builder
			err = o.submit(context.Background(), c, genericiooptions.IOStreams{Out: &out, ErrOut: &errOut}, printer, tt.request)

			if code := exitCode(t, err); code != tt.wantCode {
				t.Errorf("exit code %d, want %d (%v)", code, tt.wantCode, err)
			}
			// The API server picks the suffix of the request's name;
			// the expectations call it web-1.
			name := tt.request.object().GetName()
			if want := strings.ReplaceAll(tt.wantErr, "web-1", name); want != "" && fmt.Sprint(err) != want {
				t.Errorf("error %q, want %q", err, want)
			}
			errOutWant := strings.ReplaceAll(tt.wantErrOut, "web-1", name)
			if d := cmp.Diff(errOutWant, errOut.String()); d != "" {
				t.Errorf("standard error (-want +got):\n%s", d)
			}
			if o.output != "" {
				if !strings.Contains(out.String(), tt.wantOut) {
					t.Errorf("standard output %q, want it to hold %q", out.String(), tt.wantOut)
				}
			} else if d := cmp.Diff(strings.ReplaceAll(tt.wantOut, "web-1", name), out.String()); d != "" {
				t.Errorf("standard output (-want +got):\n%s", d)
			}
		})
	}
}

// exitCode is the exit code a command's error sets; it fails t for an
// error that sets none.
func exitCode(t *testing.T, err error) int {
	t.Helper()
	var exit *ExitError
	if errors.As(err, &exit) {
		return exit.Code
	}
	if err != nil {
		t.Fatalf("%v is not an ExitError", err)
	}
	return ExitOK
}

// parseFlags parses args with the flags add binds.
func parseFlags(t *testing.T, add func(*pflag.FlagSet), args []string) *pflag.FlagSet {
	t.Helper()
	fs := pflag.NewFlagSet(t.Name(), pflag.ContinueOnError)
	add(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return fs
}

// checkSpec fails t unless a command's flags made the spec want, or, with
// wantErr, an error saying it.
func checkSpec[S any](t *testing.T, got S, err error, want S, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Fatalf("spec() error = %v, want one saying %q", err, wantErr)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("spec() (-want +got):\n%s", d)
	}
}
