package clientserver

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
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

	mu      sync.Mutex
	listed  map[string][]userset.Request
	changed chan struct{}
}

// list addresses one request to each of users, and wakes the held polls.
func (v *verified) list(users []string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.listed == nil {
		v.listed = map[string][]userset.Request{}
	}
	for i, user := range users {
		v.listed[user] = []userset.Request{{UID: fmt.Sprintf("5d1e0000-0000-4000-8000-%012d", i), User: user, Kind: userset.RequestSnapshot, Name: "now", Paths: []string{"/srv"}}}
	}
	if v.changed != nil {
		close(v.changed)
		v.changed = nil
	}
}

func (v *verified) Authenticate(user, password string) bool {
	h, ok := v.hashes[user]
	if !ok {
		return false
	}
	ok, err := v.verifier.Verify(context.Background(), user, h, password)
	return err == nil && ok
}

func (v *verified) Pending(user string) ([]userset.Request, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.listed[user], nil
}

func (v *verified) Changed(string) <-chan struct{} {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.changed == nil {
		v.changed = make(chan struct{})
	}
	return v.changed
}

func (v *verified) Result(context.Context, string, string, string, string) error {
	return ErrUnknownRequest
}

func (v *verified) Progress(context.Context, string, string, int) error {
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

	// Held polls, as guests make them (clientdist.WaitParam): one per
	// guest at a time, each held until a request is listed for it. What
	// one costs the server, handshake, hold and answer, is what a guest
	// costs per MaxPollWait when no request comes; the time from the
	// listing to each curl's answer is a request's wait for its guest,
	// past the controller and the users Secret's watch.
	const held = 50
	users := make([]string, held)
	for i := range users {
		users[i] = fmt.Sprintf("vm-%d@team-a", i)
	}
	// One shell starts the curls, so that this process's CPU is the
	// server's, not that of starting processes; each curl's answer is
	// stamped by date, in nanoseconds since the epoch.
	script := ""
	for i, user := range users {
		header := filepath.Join(dir, "held-"+user)
		auth := base64.StdEncoding.EncodeToString([]byte(user + ":" + passwords[user]))
		if err := os.WriteFile(header, []byte("Authorization: Basic "+auth+"\n"), 0o600); err != nil {
			b.Fatal(err)
		}
		script += fmt.Sprintf("(curl -fsS --http1.1 --max-time 300 --cacert %s -H @%s -o /dev/null '%s?%s=240' && date +%%s%%N >%s) &\n",
			caFile, header, url, clientdist.WaitParam, filepath.Join(dir, fmt.Sprintf("answered-%d", i)))
	}
	inUse := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse + m.StackInuse
	}
	idle := inUse()
	before := cpu(b)
	shell := exec.Command("sh", "-c", script+"wait")
	if err := shell.Start(); err != nil {
		b.Fatal(err)
	}
	for i := 0; ; i++ {
		srv.mu.Lock()
		n := srv.held
		srv.mu.Unlock()
		if n == held {
			break
		}
		if i == 3000 {
			b.Fatalf("the server holds %d of %d polls after 30 s", n, held)
		}
		time.Sleep(10 * time.Millisecond)
	}
	perConn := float64(inUse()-idle) / held
	listed := time.Now()
	v.list(users)
	if err := shell.Wait(); err != nil {
		b.Fatalf("held polls: %v", err)
	}
	perHeld := (cpu(b) - before) / held
	waits := make([]time.Duration, 0, held)
	for i := range held {
		stamp, err := os.ReadFile(filepath.Join(dir, fmt.Sprintf("answered-%d", i)))
		if err != nil {
			b.Fatalf("held poll of %s: no answer: %v", users[i], err)
		}
		ns, err := strconv.ParseInt(strings.TrimSpace(string(stamp)), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		waits = append(waits, time.Unix(0, ns).Sub(listed))
	}
	slices.Sort(waits)
	b.ReportMetric(float64(perHeld.Microseconds()), "server-cpu-µs/held-poll")
	b.ReportMetric(perConn/1024, "server-KiB/held-poll")
	b.ReportMetric(100*10000/clientdist.MaxPollWait.Seconds()*perHeld.Seconds(), "core-%-10k-guests-held")
	b.ReportMetric(float64(waits[len(waits)/2].Microseconds())/1000, "listed-to-answered-p50-ms")
	b.ReportMetric(float64(waits[len(waits)*95/100].Microseconds())/1000, "listed-to-answered-p95-ms")
}
