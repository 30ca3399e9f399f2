package sessiongate_test

import (
	"context"
	"errors"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod/logins"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// credentialDirectory admits user with password alone, and hands the
// Kopia server the user's credential in its place, as user sync does for
// a password it verified.
type credentialDirectory struct {
	user, password string
	credentials    *logins.Credentials
}

func (d credentialDirectory) Admits(_ context.Context, user, password string) (string, error) {
	if user != d.user || password != d.password {
		return "", errors.New("not admitted")
	}
	return d.credentials.For(user), nil
}

// A Kopia server started with --htpasswd-file checks the credential the
// gate hands it, without a hash: the guest's own password is nowhere in
// that server, so only the credential can open the session.
var _ = Describe("A session whose password the directory verified", Ordered, func() {
	const guest = "handed@team-h"
	var (
		password    = testbed.RandomPassword()
		credentials = logins.NewCredentials()
		kopia       *testbed.KopiaServer
	)
	BeforeAll(func() {
		kopia = testbed.StartKopiaServer(GinkgoT(), testbed.KopiaServerOptions{Htpasswd: true})
		Expect(logins.WriteFile(kopia.HtpasswdFile, credentials.Htpasswd([]string{guest}, 1))).To(Succeed())
		Expect(kopia.Refresh(context.Background())).To(Succeed())
	})

	It("reaches the Kopia server under the credential the directory chose", func() {
		_, url := serveGate(GinkgoT(), kopia, sessiongate.Options{Log: GinkgoLogr,
			Directory: credentialDirectory{user: guest, password: password, credentials: credentials}})
		r, err := testbed.OpenKopiaSession(context.Background(), GinkgoT(), url, kopia.CAPin, guest, password)
		Expect(err).NotTo(HaveOccurred())
		Expect(call(r)).To(Succeed())
	})

	It("is refused there with the guest's own password, which that server does not hold", func() {
		_, url := serveGate(GinkgoT(), kopia, sessiongate.Options{Log: GinkgoLogr,
			Directory: directoryFunc(func(string, string) error { return nil })})
		_, err := testbed.OpenKopiaSession(context.Background(), GinkgoT(), url, kopia.CAPin, guest, password)
		Expect(err).To(MatchError(ContainSubstring("access denied")))
	})
})
