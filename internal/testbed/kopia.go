package testbed

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"

	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/password"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

const (
	// kopiaCommandTimeout bounds one kopia CLI call.
	kopiaCommandTimeout = 2 * time.Minute
	// kopiaStartTimeout bounds a server's start, repository open included.
	kopiaStartTimeout = time.Minute
)

// ControlUsername is the test bed servers' server-control user.
const ControlUsername = "server-control"

// kopiaEnv is the environment every kopia process of the test bed gets: no
// update checks, no lingering, logs beside the process.
func kopiaEnv(extra ...string) []string {
	return append([]string{"KOPIA_CHECK_FOR_UPDATES=false"}, extra...)
}

// KopiaServerOptions adjusts StartKopiaServer.
type KopiaServerOptions struct {
	// RepoPath is a filesystem repository to serve; it is created when it
	// holds none. Default: a new temporary folder.
	RepoPath string
	// RepoPassword is the repository password. Default: a random one.
	RepoPassword string
	// CA signs the server's certificate. Default: a new CA, so servers of one
	// test can share trust by sharing a CA.
	CA *pki.CA
	// AlsoPresent are certificates the server sends after its leaf and CA:
	// a server that impersonates another by carrying its (public) CA.
	AlsoPresent []*x509.Certificate
	// S3 serves a repository in this MinIO bucket instead of RepoPath
	// (created when it holds none): several servers given the same bucket
	// and RepoPassword serve one repository, as a BSLS's replicas do.
	S3 *KopiaS3
	// RefreshInterval is the server's --refresh-interval; zero: Kopia's
	// default (4 h).
	RefreshInterval time.Duration
	// Htpasswd starts the server with --htpasswd-file, as a server pod
	// does: an empty file at KopiaServer.HtpasswdFile, which the test
	// writes (user sync does in a pod) and a refresh reloads.
	Htpasswd bool
}

// refreshArgs is `kopia server start`'s flag for a refresh interval d,
// none for zero.
func refreshArgs(d time.Duration) []string {
	if d == 0 {
		return nil
	}
	return []string{"--refresh-interval=" + d.String()}
}

// KopiaS3 is a bucket of a test bed MinIO.
type KopiaS3 struct {
	MinIO  *MinIO
	Bucket string
}

// KopiaServer is a running `kopia server start` on loopback with TLS: it
// presents a leaf certificate for 127.0.0.1 followed by its CA.
type KopiaServer struct {
	// URL is what clients connect to: https://127.0.0.1:<port>.
	URL string
	// CA signed the server's certificate; clients trust it (CA.CertPEM()).
	// CAPin is its fingerprint.
	CA    *pki.CA
	CAPin string
	// RepoPath and RepoPassword identify the repository.
	RepoPath     string
	RepoPassword string
	// ConfigFile is the server's repository connection.
	ConfigFile string
	Process    *Process
	// ControlPassword is the password of the server's control user (its
	// name is ControlUsername).
	ControlPassword string
	// HtpasswdFile is the server's --htpasswd-file (KopiaServerOptions.
	// Htpasswd); empty without one.
	HtpasswdFile string

	tools       Tools
	dir         string
	alsoPresent []*x509.Certificate
	// env is the storage's credentials, for admin commands.
	env []string
}

// StartKopiaServer creates (when needed) a filesystem repository and serves
// it with a real kopia server on a free loopback port. It returns once the
// server answers its control API. The test's cleanup stops it.
func StartKopiaServer(tb TB, opts KopiaServerOptions) *KopiaServer {
	tb.Helper()
	tools := MustTools(tb)
	dir := tb.TempDir()
	s := &KopiaServer{
		RepoPath:        opts.RepoPath,
		RepoPassword:    opts.RepoPassword,
		CA:              opts.CA,
		ConfigFile:      filepath.Join(dir, "repository.config"),
		ControlPassword: RandomPassword(),
		tools:           tools,
		dir:             dir,
		alsoPresent:     opts.AlsoPresent,
	}
	if s.RepoPath == "" {
		s.RepoPath = filepath.Join(dir, "repository")
	}
	if s.RepoPassword == "" {
		s.RepoPassword = RandomPassword()
	}
	if s.CA == nil {
		ca, err := pki.NewCA("guestbackup test bed CA", 24*time.Hour)
		if err != nil {
			tb.Fatalf("%v", err)
		}
		s.CA = ca
	}
	s.CAPin = pki.Fingerprint(s.CA.Cert)

	ctx := context.Background()
	if opts.S3 != nil {
		// Credentials through the environment (kopia's s3 flags read it).
		m := opts.S3.MinIO
		s.env = []string{"AWS_ACCESS_KEY_ID=" + m.AccessKeyID, "AWS_SECRET_ACCESS_KEY=" + m.SecretAccessKey}
		storage := []string{"s3", "--bucket=" + opts.S3.Bucket, "--endpoint=" + m.Endpoint, "--region=" + MinIORegion, "--disable-tls"}
		if _, err := s.admin(ctx, append([]string{"repository", "connect"}, storage...)...); err != nil {
			if out, err := s.admin(ctx, append([]string{"repository", "create"}, storage...)...); err != nil {
				tb.Fatalf("kopia repository create s3: %v\n%s", err, out)
			}
		}
	} else {
		verb := "connect"
		if _, err := os.Stat(filepath.Join(s.RepoPath, "kopia.repository.f")); os.IsNotExist(err) {
			verb = "create"
		}
		if out, err := s.admin(ctx, "repository", verb, "filesystem", "--path="+s.RepoPath); err != nil {
			tb.Fatalf("kopia repository %s: %v\n%s", verb, err, out)
		}
	}

	certFile, keyFile, err := s.writeServingCert()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	port, err := FreePort()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	s.URL = "https://127.0.0.1:" + strconv.Itoa(port)
	var htpasswd []string
	if opts.Htpasswd {
		s.HtpasswdFile = filepath.Join(s.dir, "htpasswd")
		if err := os.WriteFile(s.HtpasswdFile, nil, 0o600); err != nil {
			tb.Fatalf("%v", err)
		}
		htpasswd = []string{"--htpasswd-file=" + s.HtpasswdFile}
	}
	s.Process = StartProcess(tb, ProcessSpec{
		Name: "kopia-server-" + strconv.Itoa(port),
		Path: tools.Kopia,
		Args: append([]string{
			"server", "start",
			"--config-file=" + s.ConfigFile,
			"--address=127.0.0.1:" + strconv.Itoa(port),
			"--tls-cert-file=" + certFile,
			"--tls-key-file=" + keyFile,
			"--server-control-username=" + ControlUsername,
			"--no-ui",
		}, append(refreshArgs(opts.RefreshInterval), htpasswd...)...),
		Env: kopiaEnv(
			"KOPIA_PASSWORD="+s.RepoPassword,
			"KOPIA_SERVER_CONTROL_PASSWORD="+s.ControlPassword,
		),
		Dir: filepath.Join(dir, "server"),
	})
	err = WaitFor(kopiaStartTimeout, 200*time.Millisecond, func() (bool, error) {
		if exited, err := s.Process.Exited(); exited {
			return false, fmt.Errorf("kopia server exited: %v", err)
		}
		// The control API answers a refresh once the repository is open.
		return s.Refresh(ctx) == nil, nil
	})
	if err != nil {
		tb.Fatalf("kopia server at %s: %v\n%s", s.URL, err, tail(s.Process.LogPath, 40))
	}
	return s
}

// writeServingCert issues a certificate for 127.0.0.1 and writes the chain
// (leaf, then CA) and key, readable by the owner only.
func (s *KopiaServer) writeServingCert() (certFile, keyFile string, err error) {
	kp, err := s.CA.IssueServing([]string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1)}, 24*time.Hour)
	if err != nil {
		return "", "", err
	}
	keyPEM, err := kp.KeyPEM()
	if err != nil {
		return "", "", err
	}
	certFile = filepath.Join(s.dir, "tls.crt")
	keyFile = filepath.Join(s.dir, "tls.key")
	chain := append(kp.ChainPEM(s.CA.Cert), pki.EncodeCerts(s.alsoPresent...)...)
	if err := os.WriteFile(certFile, chain, 0o600); err != nil {
		return "", "", err
	}
	if err := os.WriteFile(keyFile, keyPEM, 0o600); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// admin runs a kopia command as the repository owner, with the server's
// configuration.
func (s *KopiaServer) admin(ctx context.Context, args ...string) (string, error) {
	args = append(args, "--config-file="+s.ConfigFile)
	return Run(ctx, kopiaCommandTimeout, s.dir, kopiaEnv(append([]string{"KOPIA_PASSWORD=" + s.RepoPassword}, s.env...)...), s.tools.Kopia, args...)
}

// Refresh makes the running server re-read the repository's manifests, so
// users written by another process authenticate at once: `kopia server
// refresh` as the control user, trusting the server's CA by its pin.
func (s *KopiaServer) Refresh(ctx context.Context) error {
	out, err := Run(ctx, kopiaCommandTimeout, s.dir, kopiaEnv("KOPIA_SERVER_PASSWORD="+s.ControlPassword), s.tools.Kopia,
		"server", "refresh", "--address="+s.URL, "--server-control-username="+ControlUsername, "--server-cert-fingerprint="+s.CAPin)
	if err != nil {
		return fmt.Errorf("kopia server refresh: %w: %s", err, out)
	}
	return nil
}

// SetUsers opens the repository in this process, as another writer beside
// the server, puts (or replaces) the given users and deletes the listed
// ones, then refreshes the server. It writes identity's profile format
// itself, as any other writer of the repository could: the test bed stands
// apart from the server pod's code (package kopiauser) that its tests
// prove.
func (s *KopiaServer) SetUsers(ctx context.Context, put map[string]identity.Hash, del ...string) error {
	r, err := repo.Open(ctx, s.ConfigFile, s.RepoPassword, &repo.Options{})
	if err != nil {
		return fmt.Errorf("open repository %s: %w", s.RepoPath, err)
	}
	defer r.Close(ctx)
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup test bed users"},
		func(ctx context.Context, w repo.RepositoryWriter) error {
			for name, h := range put {
				p, err := identity.NewProfile(name, h)
				if err != nil {
					return err
				}
				if _, err := w.ReplaceManifests(ctx, identity.ProfileLabels(name), p); err != nil {
					return fmt.Errorf("write profile of %s: %w", name, err)
				}
			}
			for _, name := range del {
				entries, err := w.FindManifests(ctx, identity.ProfileLabels(name))
				if err != nil {
					return fmt.Errorf("find profile of %s: %w", name, err)
				}
				for _, e := range entries {
					if err := w.DeleteManifest(ctx, e.ID); err != nil {
						return fmt.Errorf("delete profile of %s: %w", name, err)
					}
				}
			}
			return nil
		})
	if err != nil {
		return err
	}
	return s.Refresh(ctx)
}

// AddUser hashes password and adds username to the repository (see SetUsers).
func (s *KopiaServer) AddUser(tb TB, username, password string) {
	tb.Helper()
	h, err := identity.NewHash(password, identity.Scrypt)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	if err := s.SetUsers(context.Background(), map[string]identity.Hash{username: h}); err != nil {
		tb.Fatalf("add kopia user %s: %v", username, err)
	}
}

// KopiaClient is a kopia CLI with its own configuration and cache, as a guest
// would have, trusting what a guest trusts: the CA it was given, no other.
type KopiaClient struct {
	ConfigFile string
	tools      Tools
	dir        string
	trustDir   string
}

// NewKopiaClient prepares a client with a fresh configuration.
func NewKopiaClient(tb TB) *KopiaClient {
	tb.Helper()
	dir := tb.TempDir()
	return &KopiaClient{ConfigFile: filepath.Join(dir, "repository.config"), tools: MustTools(tb), dir: dir, trustDir: filepath.Join(dir, "trust")}
}

// Connect runs `kopia repository connect server` as user@host the way a
// guest's bootstrap does: no fingerprint pin, Go's verification of the
// server's chain and host name, with caPEM as the only roots (for this and
// every later command of the client).
func (c *KopiaClient) Connect(ctx context.Context, url string, caPEM []byte, username, password string) (string, error) {
	if err := os.MkdirAll(c.trustDir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(c.trustDir, "ca.crt"), caPEM, 0o644); err != nil { //nolint:gosec // a CA certificate is public
		return "", err
	}
	return c.connect(ctx, url, username, password)
}

// ConnectPinned connects like Connect, but trusts any chain that contains a
// certificate with the fingerprint pin, whatever host it names: Kopia's own
// pin, which guests never use (it authenticates nothing: docs/security.md).
// It is for host-side checks of a server pod that the test reaches through a
// host port on 127.0.0.1, an address its certificate does not carry, where
// the subject is what the server lets a user do, not how a guest trusts it.
func (c *KopiaClient) ConnectPinned(ctx context.Context, url, pin, username, password string) (string, error) {
	return c.connect(ctx, url, username, password, "--server-cert-fingerprint="+pin)
}

// connect runs `kopia repository connect server` as username (user@host).
func (c *KopiaClient) connect(ctx context.Context, url, username, password string, extra ...string) (string, error) {
	user, host, ok := strings.Cut(username, "@")
	if !ok || user == "" || host == "" {
		return "", fmt.Errorf("%q is not user@host", username)
	}
	args := append([]string{
		"repository", "connect", "server",
		"--config-file=" + c.ConfigFile,
		"--url=" + url,
		"--override-username=" + user,
		"--override-hostname=" + host,
	}, extra...)
	return Run(ctx, kopiaCommandTimeout, c.dir, c.env("KOPIA_PASSWORD="+password), c.tools.Kopia, args...)
}

// ConnectLine runs line, a `kopia repository connect server ...` command as
// a BackupClient's Secret hands it to a workload, through /bin/sh the way a
// pod's script runs it: the test bed's kopia first on PATH, the password in
// KOPIA_PASSWORD and caPEM, the only trust, in SSL_CERT_FILE, so that the
// line itself carries neither. Later commands of the client trust caPEM
// alone too.
func (c *KopiaClient) ConnectLine(ctx context.Context, line string, caPEM []byte, password string) (string, error) {
	if err := os.MkdirAll(c.trustDir, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(c.trustDir, "ca.crt"), caPEM, 0o644); err != nil { //nolint:gosec // a CA certificate is public
		return "", err
	}
	mustBeGranted(c.tools.Kopia)
	env := c.env("KOPIA_PASSWORD="+password, "KOPIA_CONFIG_PATH="+c.ConfigFile,
		"PATH="+filepath.Dir(c.tools.Kopia)+string(os.PathListSeparator)+os.Getenv("PATH"))
	return Run(ctx, kopiaCommandTimeout, c.dir, env, "/bin/sh", "-c", line)
}

// Run runs a kopia command with the client's configuration.
func (c *KopiaClient) Run(ctx context.Context, args ...string) (string, error) {
	args = append(args, "--config-file="+c.ConfigFile)
	return Run(ctx, kopiaCommandTimeout, c.dir, c.env(), c.tools.Kopia, args...)
}

// RunWithPassword runs a kopia command with the client's configuration and
// password in KOPIA_PASSWORD, never in its arguments.
func (c *KopiaClient) RunWithPassword(ctx context.Context, password string, args ...string) (string, error) {
	return c.RunWithEnv(ctx, []string{"KOPIA_PASSWORD=" + password}, args...)
}

// RunWithEnv runs a kopia command with the client's configuration and env
// added to its environment: the repository password and a storage's
// credentials (a client that connects to the storage itself), never in
// its arguments.
func (c *KopiaClient) RunWithEnv(ctx context.Context, env []string, args ...string) (string, error) {
	args = append(args, "--config-file="+c.ConfigFile)
	return Run(ctx, kopiaCommandTimeout, c.dir, c.env(env...), c.tools.Kopia, args...)
}

// env is kopiaEnv with the client's trust: Go reads its roots from these
// variables, and naming the trust folder in both keeps the host's CAs out.
func (c *KopiaClient) env(extra ...string) []string {
	return kopiaEnv(append([]string{"SSL_CERT_FILE=" + filepath.Join(c.trustDir, "ca.crt"), "SSL_CERT_DIR=" + c.trustDir}, extra...)...)
}

// SnapshotIDs lists the manifest IDs of the snapshots of path the client's
// user can see, oldest first.
func (c *KopiaClient) SnapshotIDs(ctx context.Context, path string) ([]string, error) {
	out, err := c.Run(ctx, "snapshot", "list", "--json", path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, out)
	}
	var snapshots []struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal([]byte(out), &snapshots); err != nil {
		return nil, fmt.Errorf("snapshot list is not JSON: %w: %s", err, out)
	}
	ids := make([]string, len(snapshots))
	for i, s := range snapshots {
		ids[i] = s.ID
	}
	return ids, nil
}

// RandomPassword returns a new password, as the product generates them.
func RandomPassword() string { return password.New() }

// FreePort returns a TCP port free on 127.0.0.1 at the time of the call
// (FreePorts).
func FreePort() (int, error) { return FreePorts(1) }

// FreePorts returns the first of n consecutive TCP ports free on 127.0.0.1
// at the time of the call: a BSLS's server takes two, its client port being
// the next one (clientdist.Port). They are chosen below the kernel's
// ephemeral range, where no outgoing connection's local port can take one
// between this call and the server's bind: on a busy machine one did
// ("listen tcp 127.0.0.1:45072: bind: address already in use").
func FreePorts(n int) (int, error) {
	const low = 10000
	high := ephemeralLow() - n
	if high <= low {
		return 0, fmt.Errorf("no room for %d ports below the ephemeral range", n)
	}
	for range 200 {
		first := low + rand.IntN(high-low)
		if portsFree(first, n) {
			return first, nil
		}
	}
	return 0, fmt.Errorf("find %d free consecutive loopback ports below %d: none in 200 tries", n, high+n)
}

// portsFree tells whether ports first to first+n-1 can all be listened on.
func portsFree(first, n int) bool {
	for i := range n {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(first+i)))
		if err != nil {
			return false
		}
		defer l.Close()
	}
	return true
}

// ephemeralLow is the first port of the kernel's ephemeral range.
func ephemeralLow() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err == nil {
		if f := strings.Fields(string(data)); len(f) == 2 {
			if low, err := strconv.Atoi(f[0]); err == nil {
				return low
			}
		}
	}
	return 32768 // Linux's default
}

// OpenKopiaSession connects Kopia's own API client (the code behind its
// CLI) to the server at url, whose certificate has fingerprint pin, as
// username (user@host), and opens a session: what a guest's kopia command
// holds, for specs that speak Kopia's protocol beyond what the CLI says.
// tb's cleanup closes it.
func OpenKopiaSession(ctx context.Context, tb TB, url, pin, username, password string) (repo.Repository, error) {
	tb.Helper()
	user, host, _ := strings.Cut(username, "@")
	config := filepath.Join(tb.TempDir(), "repository.config")
	err := repo.ConnectAPIServer(ctx, config, &repo.APIServerInfo{BaseURL: url, TrustedServerCertificateFingerprint: pin}, password,
		&repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: user, Hostname: host}})
	if err != nil {
		return nil, fmt.Errorf("connect to %s as %s: %w", url, username, err)
	}
	r, err := repo.Open(ctx, config, password, &repo.Options{})
	if err != nil {
		return nil, fmt.Errorf("open a session at %s as %s: %w", url, username, err)
	}
	tb.Cleanup(func() { _ = r.Close(context.Background()) })
	return r, nil
}

// HTTP2Transport is an HTTP/2 transport over TLS that trusts ca alone and
// dials from loopback address ip (nil: any; 127.0.0.2 and up are the
// host's too, and a gate tells sources apart by them): how tests reach a
// server pod's port by hand, with NewKopiaSessionRequest.
func HTTP2Transport(ca *x509.Certificate, ip net.IP) *http.Transport {
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	protocols := new(http.Protocols)
	protocols.SetHTTP2(true)
	dialer := &net.Dialer{}
	if ip != nil {
		dialer.LocalAddr = &net.TCPAddr{IP: ip}
	}
	return &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
		Protocols:       protocols,
		DialContext:     dialer.DialContext,
	}
}

// NewKopiaSessionRequest is the request that opens a Kopia session at
// baseURL (a server or a server pod's gate) by hand, as Kopia's client
// would: its one gRPC method, with the credentials of username (user@host)
// in the metadata and body as its messages. Tests send it over HTTP/2 to
// do what anyone who reaches the port can, without a Kopia client.
func NewKopiaSessionRequest(ctx context.Context, baseURL, username, password string, body io.Reader) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/kopia_repository.KopiaRepository/Session", body)
	if err != nil {
		return nil, err
	}
	user, host, _ := strings.Cut(username, "@")
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	req.Header.Set("Kopia-Username", user)
	req.Header.Set("Kopia-Hostname", host)
	req.Header.Set("Kopia-Password", password)
	return req, nil
}
