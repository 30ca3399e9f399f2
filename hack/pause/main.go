// Command pause is the test bed's pod sandbox image: the process that holds
// a pod's namespaces while its containers come and go, as Kubernetes' own
// pause image does. The real node of the test bed (internal/testbed.StartNode)
// uses it as containerd's sandbox_image, so no registry is ever contacted.
//
// It sleeps until SIGTERM or SIGINT, then exits 0. As the sandbox's first
// process it also reaps children re-parented to it, so a pod sharing its
// process namespace leaves no zombies behind.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			return
		}
		for {
			var status syscall.WaitStatus
			if pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil); pid <= 0 || err != nil {
				break
			}
		}
	}
}
