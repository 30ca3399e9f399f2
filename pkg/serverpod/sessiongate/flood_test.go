package sessiongate_test

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/kopia/kopia/repo"

	"github.com/guestbackup/guestbackup/internal/testbed"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// serveGate serves a gate of options o (its Upstream and TLS set here) in
// front of Kopia server srv, as a server pod does: on a loopback port,
// with a certificate of the server's CA. It stops when tb ends, and
// returns the gate and its URL.
func serveGate(tb testbed.TB, srv *testbed.KopiaServer, o sessiongate.Options) (*sessiongate.Gate, string) {
	tb.Helper()
	o.Upstream = srv.URL
	o.TLS = serverpod.TrustChain([]*x509.Certificate{srv.CA.Cert})
	g, err := sessiongate.New(o)
	if err != nil {
		tb.Fatalf("gate: %v", err)
	}
	chain, key, err := testbed.WriteServingCert(tb.TempDir(), srv.CA, []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, time.Hour)
	if err != nil {
		tb.Fatalf("serving certificate: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- serverpod.ServeTLS(ctx, ln, chain, key, g.Server()) }()
	tb.Cleanup(func() {
		stop()
		select {
		case err := <-done:
			if err != nil {
				tb.Fatalf("gate: %v", err)
			}
		case <-time.After(30 * time.Second):
			tb.Fatalf("the gate did not stop within 30 s")
		}
	})
	return g, "https://" + ln.Addr().String()
}

// attacker sends Kopia session requests by hand, from one loopback
// address, over one HTTP/2 connection: what anyone who reaches the port
// can do without a password.
type attacker struct {
	url    string
	client *http.Client
}

// newAttacker is an attacker of the gate at url, trusting ca, whose
// connections come from loopback address ip (127.0.0.2 and up are the
// host's too).
func newAttacker(url string, ca *x509.Certificate, ip net.IP) *attacker {
	return &attacker{url: url, client: &http.Client{Transport: testbed.HTTP2Transport(ca, ip)}}
}

// login opens a session as username (user@host) with password and returns
// its gRPC status and message as the gate or Kopia answered; its body
// stays open until ctx ends, as a client's does while it waits.
func (a *attacker) login(ctx context.Context, username, password string) (status, message string, err error) {
	body, hold := io.Pipe()
	defer hold.Close()
	context.AfterFunc(ctx, func() { hold.CloseWithError(ctx.Err()) })
	// A first message, as a client sends at once (an empty one: Kopia
	// verifies the password before it reads any), then nothing more.
	go func() { _, _ = hold.Write(make([]byte, 5)) }()
	req, err := testbed.NewKopiaSessionRequest(ctx, a.url, username, password, body)
	if err != nil {
		return "", "", err
	}
	resp, err := a.client.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	if status := resp.Header.Get("Grpc-Status"); status != "" {
		return status, resp.Header.Get("Grpc-Message"), nil // trailers only
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return "", "", err
	}
	return resp.Trailer.Get("Grpc-Status"), resp.Trailer.Get("Grpc-Message"), nil
}

// close closes the attacker's connections.
func (a *attacker) close() { a.client.CloseIdleConnections() }

// floodResult counts a flood's answers.
type floodResult struct {
	// refused were refused by Kopia (PermissionDenied): each cost a hash.
	refused int
	// throttled were refused by the gate before they reached Kopia.
	throttled int
	// other answers and errors, with one example.
	other   int
	example string
}

func (r floodResult) String() string {
	return fmt.Sprintf("%d refused by Kopia, %d throttled by the gate, %d other (%s)", r.refused, r.throttled, r.other, r.example)
}

// flood sends n concurrent logins as username with a wrong password from
// a, each as soon as the one before it was answered, rounds times per
// sender or until ctx ends, and counts the answers.
func (a *attacker) flood(ctx context.Context, username string, n, rounds int) floodResult {
	var (
		mu  sync.Mutex
		res floodResult
		wg  sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			throttled := false
			for range rounds {
				if ctx.Err() != nil {
					return
				}
				if throttled {
					// As a client told to come back would, and so that the
					// flood does not spin on the test's own cores.
					time.Sleep(10 * time.Millisecond)
				}
				throttled = false
				call, cancel := context.WithTimeout(ctx, time.Minute)
				status, message, err := a.login(call, username, "not-the-password")
				cancel()
				mu.Lock()
				switch {
				case err == nil && status == "7":
					res.refused++
				case err == nil && status == "14" && strings.Contains(message, "too%20many%20logins"):
					res.throttled++
					throttled = true
				default:
					res.other++
					if err != nil && !errors.Is(err, context.Canceled) {
						res.example = err.Error()
					} else if err == nil {
						res.example = "grpc-status " + status + ": " + message
					}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return res
}

// connectClient connects Kopia's own client (the code behind the CLI) to
// the gate at url as username, and returns its configuration file.
func connectClient(ctx context.Context, url, pin, dir, username, password string) (string, error) {
	config := filepath.Join(dir, "repository.config")
	user, host, _ := strings.Cut(username, "@")
	if err := repo.ConnectAPIServer(ctx, config, &repo.APIServerInfo{BaseURL: url, TrustedServerCertificateFingerprint: pin}, password,
		&repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: user, Hostname: host}}); err != nil {
		return "", fmt.Errorf("connect as %s: %w", username, err)
	}
	return config, nil
}

// loginWith opens and closes one session of the client connectClient
// configured: the one login a command such as `kopia repository status`
// makes.
func loginWith(ctx context.Context, config, password string) error {
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		return fmt.Errorf("open the repository: %w", err)
	}
	return r.Close(ctx)
}
