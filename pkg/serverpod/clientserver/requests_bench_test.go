package clientserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/serverpod/logins"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// verified authenticates guests as user sync does, by the users' stored
// hashes through a logins.Verifier, which answers a returning guest from
// memory.
type verified struct {
	verifier *logins.Verifier
	hashes   map[string]identity.Hash
}

func (v *verified) Authenticate(user, password string) bool {
	h, ok := v.hashes[user]
	if !ok {
		return false
	}
	ok, err := v.verifier.Verify(context.Background(), user, h, password)
	return err == nil && ok
}

func (v *verified) Pending(user string) ([]userset.Request, error) { return nil, nil }

func (v *verified) Result(context.Context, string, string, string, string) error {
	return ErrUnknownRequest
}

func (v *verified) Plan(context.Context, string, string) ([]clientdist.PlanStep, error) {
	return nil, ErrUnknownRequest
}

// cpu is this process's CPU time so far.
func cpu(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkRequestPolls measures what guests' polls for requests cost the
// server pod: each poll is curl's, as the guest's script makes it (a new
// TLS connection, a GET of the guest's requests), by a returning guest
// whose password the port verified before (no hash). It reports the
// server's CPU per poll (curl runs in processes of its own) and what
// 10,000 guests polling every 30 s (the default interval) would cost, in
// percent of one core. The goal (issue 42) is at most 5 %.
func BenchmarkRequestPolls(b *testing.B) {
	tools := testbed.MustTools(b)
	if _, err := exec.LookPath("curl"); err != nil {
		b.Skip("no curl on this machine: the polls are curl's, as a guest's")
	}
	const guests = 100
	v := &verified{verifier: logins.New(logins.Options{}), hashes: map[string]identity.Hash{}}
	passwords := map[string]string{}
	for i := range guests {
		user := fmt.Sprintf("vm-%d@team-a", i)
		passwords[user] = testbed.RandomPassword()
		h, err := identity.NewHash(passwords[user], identity.PBKDF2)
		if err != nil {
			b.Fatal(err)
		}
		v.hashes[user] = h
	}
	srv, err := Open(Options{Binaries: map[string]string{"amd64": tools.Kopia}, Authenticator: v, Reporter: nil, Requests: v})
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	ca, err := pki.NewCA("bench CA", time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	chain, key, err := testbed.WriteServingCert(b.TempDir(), ca, nil, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, ln, chain, key, srv.Handler()) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	dir := b.TempDir()
	caFile := filepath.Join(dir, "ca.crt")
	if err := os.WriteFile(caFile, ca.CertPEM(), 0o600); err != nil {
		b.Fatal(err)
	}
	url := "https://" + ln.Addr().String() + "/requests"
	// polls are count polls of user's guest, each as its script makes it:
	// curl, a new TLS connection (no session resumed), the password in a
	// header file. One curl process makes them all, so that this process's
	// CPU is the server's, not that of starting processes.
	const count = 50
	polls := func(user string, count int) {
		header := filepath.Join(dir, "header")
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + passwords[user]))
		if err := os.WriteFile(header, []byte("Authorization: Basic "+auth+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		args := []string{"-fsS", "--http1.1", "--no-sessionid", "--cacert", caFile, "-H", "@" + header, "-H", "Connection: close"}
		for range count {
			args = append(args, "-o", "/dev/null", url)
		}
		out, err := exec.Command("curl", args...).CombinedOutput()
		if err != nil {
			b.Fatalf("polls of %s: %v\n%s", user, err, out)
		}
	}
	for user := range passwords {
		polls(user, 1) // the first poll of each guest verifies its password
	}
	start := cpu(b)
	n := 0
	for b.Loop() {
		polls(fmt.Sprintf("vm-%d@team-a", n%guests), count)
		n++
	}
	perPoll := (cpu(b) - start) / time.Duration(n*count)
	b.ReportMetric(float64(perPoll.Microseconds()), "server-cpu-µs/poll")
	b.ReportMetric(100*10000/30*perPoll.Seconds(), "core-%-10k-guests-30s")
}
