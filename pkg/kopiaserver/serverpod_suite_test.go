package kopiaserver_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
)

func TestServerPod(t *testing.T) {
	RegisterFailHandler(Fail)
	// controller-runtime's informers log through its global logger.
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "The server pod, run from the Deployment the controller writes")
}
