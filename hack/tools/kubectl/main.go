// Command kubectl is the Kubernetes CLI, built from the k8s.io/kubectl
// module at the version our client libraries use: the chart's test runs the
// README's quick start with it, as a user would. kubectl's own main lives
// in k8s.io/kubernetes, whose staging replaces a dependent module cannot
// use; this is the same two calls.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err)
	}
}
