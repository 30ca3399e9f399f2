// Command kubectl-guestbackup is the kubectl plugin `kubectl guestbackup`:
// installed on the PATH (or through krew), kubectl runs it for
// `kubectl guestbackup ...`.
package main

import (
	"errors"
	"fmt"
	"os"

	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/guestbackup/guestbackup/internal/plugin"
)

func main() {
	cmd := plugin.NewCommand(genericiooptions.IOStreams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr})
	err := cmd.Execute()
	if err == nil {
		return
	}
	code := plugin.ExitFailed
	var exit *plugin.ExitError
	if errors.As(err, &exit) {
		code = exit.Code
	}
	if msg := err.Error(); msg != "" {
		fmt.Fprintln(os.Stderr, "error:", msg)
	}
	os.Exit(code)
}
