// Command guestbackup-restore is what a restore Job runs: one GuestRestore
// into a PersistentVolumeClaim (package runner), configured by the
// environment the controller gives the Job.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr/funcr"

	"github.com/guestbackup/guestbackup/pkg/restorejob"
	"github.com/guestbackup/guestbackup/pkg/restorejob/runner"
)

func main() {
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "usage: %s (no arguments: a restore Job configures it by its environment, %s and the others of package restorejob)\n", os.Args[0], restorejob.EnvRequest)
		if os.Args[1] == "--help" || os.Args[1] == "-h" {
			os.Exit(0)
		}
		os.Exit(2)
	}
	c, err := runner.FromEnv(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestbackup-restore:", err)
		os.Exit(2)
	}
	c.Log = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, prefix, args) }, funcr.Options{})
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	switch err := runner.Run(ctx, c); {
	case err == nil, errors.Is(err, runner.ErrEnded):
	default:
		fmt.Fprintln(os.Stderr, "guestbackup-restore:", err)
		os.Exit(1)
	}
}
