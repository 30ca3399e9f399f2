package kopiaserver_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

func TestServerPod(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	// controller-runtime's informers log through its global logger.
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "The server pod, run from the Deployment the controller writes")
}
