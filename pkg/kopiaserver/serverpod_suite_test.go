package kopiaserver_test

import (
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

func TestServerPod(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "The server pod, run from the Deployment the controller writes")
}
