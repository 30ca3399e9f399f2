package v1alpha1_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/guestbackup/guestbackup/internal/testbed"
)

// apiServer is a real kube-apiserver with the CRDs as the chart ships them.
var apiServer *testbed.APIServer

func TestCRD(t *testing.T) {
	RegisterFailHandler(Fail)
	SetDefaultEventuallyTimeout(testbed.EventuallyTimeout)
	RunSpecs(t, "guestbackup.io CRDs")
}

var _ = BeforeSuite(func() {
	apiServer = testbed.StartAPIServer(GinkgoT(), testbed.APIServerOptions{})
})
