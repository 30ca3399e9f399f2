// Command guestbackup-server runs beside the Kopia server in a
// BackupStorageLocationServer's pod:
//
//	guestbackup-server init        connect to or create the repository, write its access
//	                               rules (ACLs), write the TLS chain
//	guestbackup-server sync-users  keep the repository's users equal to the users Secrets and
//	                               its ACLs guestbackup's; on an append-only server, apply
//	                               retention on the server's clock; run maintenance; serve
//	                               the kopia client to guests and take their reports
//
// Passwords and storage credentials come from the environment (KOPIA_PASSWORD,
// KOPIA_SERVER_CONTROL_PASSWORD, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN), from a Velero credential Secret read through the API,
// or from the pod's cloud identity, never from flags. The flags are package
// serverargs', which the controller writes them from.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"k8s.io/client-go/kubernetes"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/guestbackup/guestbackup/pkg/kopiaenv"
	"github.com/guestbackup/guestbackup/pkg/serverargs"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/usersync"
)

func main() {
	const usage = "usage: guestbackup-server init|sync-users [flags]  (-help after a command lists its flags)"
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "-h", "-help", "--help", "help":
		fmt.Println(usage)
		return
	case serverargs.CommandInit:
		err = runInit(os.Args[2:])
	case serverargs.CommandSyncUsers:
		err = runSyncUsers(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want init or sync-users", os.Args[1])
	}
	if errors.Is(err, flag.ErrHelp) {
		return // the flag set printed its usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestbackup-server:", err)
		os.Exit(1)
	}
}

// env returns a required environment variable.
func env(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("environment variable %s is not set", name)
	}
	return v, nil
}

// kubeClient is a client of the API server the pod runs in.
func kubeClient() (kubernetes.Interface, error) {
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("load kubeconfig: %w", err)
	}
	return kubernetes.NewForConfig(cfg)
}

func runInit(args []string) error {
	var a serverargs.Init
	fs := flag.NewFlagSet(serverargs.CommandInit, flag.ContinueOnError)
	a.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	o, err := serverpod.InitOptionsFrom(a)
	if err != nil {
		return err
	}
	o.Out = os.Stdout
	if o.Password, err = env(kopiaenv.RepositoryPassword); err != nil {
		return err
	}
	if o.Velero != nil {
		if o.Velero.Client, err = kubeClient(); err != nil {
			return err
		}
	}
	return serverpod.Init(context.Background(), o)
}

func runSyncUsers(args []string) error {
	var (
		a       serverargs.SyncUsers
		logOpts zap.Options
	)
	fs := flag.NewFlagSet(serverargs.CommandSyncUsers, flag.ContinueOnError)
	a.AddFlags(fs)
	logOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	// The pod's name (downward API): its identity in the Lease, and the
	// key of its storage state.
	o, err := usersync.ServeOptionsFrom(a, os.Getenv("POD_NAME"))
	if err != nil {
		return err
	}
	o.Log = zap.New(zap.UseFlagOptions(&logOpts))
	if o.Password, err = env(kopiaenv.RepositoryPassword); err != nil {
		return err
	}
	if o.ControlPassword, err = env(kopiaenv.ControlPassword); err != nil {
		return err
	}
	if o.Client, err = kubeClient(); err != nil {
		return err
	}
	return usersync.Serve(ctrl.SetupSignalHandler(), o)
}
