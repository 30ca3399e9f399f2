package audit_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
)

func TestAudit(t *testing.T) {
	RegisterFailHandler(Fail)
	// controller-runtime's informers log through its global logger.
	ctrl.SetLogger(GinkgoLogr)
	RunSpecs(t, "Guest activity audit, from a real Kopia server to Events on VMs")
}
