// Package runner is what a restore Job runs: a GuestRestore into a
// PersistentVolumeClaim (docs/requests.md, "Into a claim"), for a VM that is
// stopped, gone or does not boot. The controller creates the Job in the
// request's namespace (package requeststatus) with the VM's own credentials
// and the claim mounted; the Job does what a running guest does with a
// restore, under the same identity and through the same port of its
// server: it polls for its one request (naming its UID, so that it takes
// no request of the guest's and the guest none of its), answers Running,
// restores the snapshots the server chose into the claim's folder of the
// request, and tells how it ended. Its result reaches the request's status
// as a guest's does. It needs no privilege, no service account token and
// no write outside the claim and its scratch folder.
package runner

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/restorejob"
)

// Config is what Run reads from the Job's environment.
type Config struct {
	ServerURL, ClientURL string
	CA                   []byte
	User, Password       string
	Request              string
	// Claim and Scratch are restorejob.ClaimMount and ScratchMount;
	// Kopia, the client's path.
	Claim, Scratch, Kopia string
	// ListWait bounds how long Run waits for the server to list the
	// request: the controller creates the Job as it hands the request to
	// the server, and the server lists it within seconds.
	ListWait time.Duration
	Log      logr.Logger
}

// FromEnv reads a Config from the Job's environment.
func FromEnv(getenv func(string) string) (Config, error) {
	c := Config{
		ServerURL: getenv(restorejob.EnvServerURL), ClientURL: getenv(restorejob.EnvClientURL), CA: []byte(getenv(restorejob.EnvCA)),
		User: getenv(restorejob.EnvUser), Password: getenv(restorejob.EnvPassword), Request: getenv(restorejob.EnvRequest),
		Claim: restorejob.ClaimMount, Scratch: restorejob.ScratchMount, Kopia: restorejob.Kopia, ListWait: 10 * time.Minute,
	}
	for name, v := range map[string]string{restorejob.EnvServerURL: c.ServerURL, restorejob.EnvClientURL: c.ClientURL, restorejob.EnvCA: string(c.CA), restorejob.EnvUser: c.User, restorejob.EnvPassword: c.Password, restorejob.EnvRequest: c.Request} {
		if v == "" {
			return Config{}, fmt.Errorf("%s is not set: this program runs in a restore Job, whose controller sets it", name)
		}
	}
	if !strings.Contains(c.User, "@") {
		return Config{}, fmt.Errorf("%s=%q is no <vm>@<namespace> identity", restorejob.EnvUser, c.User)
	}
	return c, nil
}

// ErrEnded is Run's error when the request ended before the Job started
// it: another run of the Job carried it out, or it was withdrawn.
var ErrEnded = errors.New("the request has ended already")

// Run carries out the request: it waits until the server lists it,
// connects kopia, starts it and restores what the server chose, then
// tells the server how it ended. An error means the ending was not told
// (the Job's pod fails and the controller fails the request from the Job).
func Run(ctx context.Context, c Config) error {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(c.CA) {
		return fmt.Errorf("%s holds no PEM certificate", restorejob.EnvCA)
	}
	j := &job{c: c, http: &http.Client{
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}},
	}}
	listed, err := j.awaitListing(ctx)
	if err != nil {
		return err
	}
	c.Log.Info("the server lists the request", "name", listed.Name, "paths", len(listed.Paths))
	folder, ok := claimFolder(listed.Target)
	if listed.InPlace || !ok {
		return j.end(ctx, v1alpha1.PhaseFailed, fmt.Sprintf("the server asks the Job to restore into %q, not a folder of the claim named after the request", listed.Target))
	}
	final := filepath.Join(c.Claim, folder)
	staging, receipt := filepath.Join(c.Claim, "."+folder+".incomplete"), filepath.Join(c.Claim, "."+folder+".ended")
	if phase, message, ok := j.endedBefore(receipt); ok {
		// An earlier run of this Job restored, and could not tell it; one
		// that stopped between keeping the ending and naming the folder
		// restores again.
		if _, err := os.Lstat(final); err == nil {
			c.Log.Info("an earlier run ended the request: telling the server again", "phase", phase)
			return j.end(ctx, phase, message)
		}
	}
	if _, err := os.Lstat(final); !errors.Is(err, os.ErrNotExist) {
		return j.end(ctx, v1alpha1.PhaseFailed, fmt.Sprintf("/%s exists already in the claim: restore into a new claim, or remove it", folder))
	}
	if why, err := j.connect(ctx); err != nil {
		return err
	} else if why != "" {
		return j.end(ctx, v1alpha1.PhaseFailed, why)
	}
	plan, err := j.start(ctx)
	if err != nil {
		return err
	}
	if len(plan) == 0 {
		return j.end(ctx, v1alpha1.PhaseFailed, "the server named nothing to restore: ask again, or tell the server's admin")
	}
	// Into a folder of the Job's own, named in the claim only once all
	// of it is there: an earlier run's (a pod evicted, a node lost) is
	// thrown away, and the request's folder holds all or nothing.
	if err := os.RemoveAll(staging); err != nil {
		return fmt.Errorf("remove an earlier run's %s: %w", staging, err)
	}
	if err := os.Mkdir(staging, 0o755); err != nil {
		return j.end(ctx, v1alpha1.PhaseFailed, fmt.Sprintf("cannot create /.%s.incomplete in the claim: %v (the claim's root must be writable by the Job's user or group)", folder, err))
	}
	var restored, failed []string
	for _, step := range plan {
		summary, err := j.restore(ctx, staging, step)
		if err != nil {
			failed = append(failed, step.Path+": "+err.Error())
			continue
		}
		c.Log.Info("restored", "path", step.Path, "summary", summary)
		restored = append(restored, step.Path+": "+summary)
		if len(failed) == 0 && len(restored) < len(plan) {
			j.progress(ctx, len(restored))
		}
	}
	if len(failed) > 0 {
		if err := os.RemoveAll(staging); err != nil {
			c.Log.Error(err, "cannot remove what the failed restore wrote", "folder", staging)
		}
		return j.end(ctx, v1alpha1.PhaseFailed, "the restore failed in the Job: "+strings.Join(failed, "; "))
	}
	message := strings.Join(restored, "; ")
	if err := os.WriteFile(receipt, []byte(c.Request+"\n"+string(v1alpha1.PhaseSucceeded)+"\n"+message), 0o644); err != nil {
		return fmt.Errorf("keep the ending in %s: %w", receipt, err)
	}
	if err := os.Rename(staging, final); err != nil {
		_ = os.Remove(receipt)
		return j.end(ctx, v1alpha1.PhaseFailed, fmt.Sprintf("cannot name the restored folder /%s in the claim: %v", folder, err))
	}
	return j.end(ctx, v1alpha1.PhaseSucceeded, message)
}

// claimFolder is the folder of the claim a target names: one name below
// the claim's root (userset.ClaimFolder), no hidden one.
func claimFolder(target string) (string, bool) {
	name, ok := strings.CutPrefix(target, "/")
	return name, ok && name != "" && !strings.ContainsAny(name, "/\x00") && !strings.HasPrefix(name, ".")
}

// endedBefore reads the ending an earlier run of this Job kept in receipt
// for this request, if it kept one.
func (j *job) endedBefore(receipt string) (v1alpha1.RequestPhase, string, bool) {
	data, err := os.ReadFile(receipt)
	if err != nil {
		return "", "", false
	}
	uid, rest, _ := strings.Cut(string(data), "\n")
	phase, message, _ := strings.Cut(rest, "\n")
	if uid != j.c.Request || v1alpha1.RequestPhase(phase) != v1alpha1.PhaseSucceeded {
		return "", "", false
	}
	return v1alpha1.PhaseSucceeded, message, true
}

// start answers Running and returns what the server chose to restore. A
// replica that has not heard of the request yet (404) is asked again a few
// times; a request that ended is ErrEnded.
func (j *job) start(ctx context.Context) ([]clientdist.Planned, error) {
	q := url.Values{clientdist.UIDParam: {j.c.Request}, clientdist.PhaseParam: {string(v1alpha1.PhaseRunning)}}
	for try := 0; ; try++ {
		data, err := j.call(ctx, http.MethodPost, clientdist.ResultPath, q, nil)
		switch {
		case errors.Is(err, errConflict):
			j.c.Log.Info("the request ended before this Job started it: nothing to do", "why", err.Error())
			return nil, ErrEnded
		case errors.Is(err, errNotFound) && try < 3:
			if !sleep(ctx, 5*time.Second) {
				return nil, ctx.Err()
			}
			continue
		case err != nil:
			return nil, fmt.Errorf("start the restore: %w", err)
		}
		plan, err := clientdist.DecodePlan(data)
		if err != nil {
			return nil, j.end(ctx, v1alpha1.PhaseFailed, "the server's plan cannot be read: "+err.Error())
		}
		return plan, nil
	}
}

// sleep waits for d, or until ctx ends: false then.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// job is one run.
type job struct {
	c    Config
	http *http.Client
}

// errConflict is the server's 409: the request has ended; errNotFound its
// 404: it lists no such request for the VM (no longer, or not yet).
var (
	errConflict = errors.New("conflict")
	errNotFound = errors.New("not found")
)

// pollWait is how long each poll asks the server to hold it.
const pollWait = 60 * time.Second

// awaitListing polls, naming the request, until the server lists it, for
// at most c.ListWait. A server that cannot be reached is asked again: it
// may be restarting.
func (j *job) awaitListing(ctx context.Context) (clientdist.Polled, error) {
	ctx, cancel := context.WithTimeout(ctx, j.c.ListWait)
	defer cancel()
	q := url.Values{clientdist.UIDParam: {j.c.Request}, clientdist.WaitParam: {strconv.Itoa(int(pollWait / time.Second))}}
	var last error
	for {
		asked := time.Now()
		data, err := j.call(ctx, http.MethodGet, clientdist.RequestsPath, q, nil)
		if err == nil {
			polled, err := clientdist.DecodeRequests(data)
			if err != nil {
				return clientdist.Polled{}, fmt.Errorf("read the server's answer: %w", err)
			}
			for _, p := range polled {
				if p.UID == j.c.Request {
					return p, nil
				}
			}
			last = fmt.Errorf("the server does not list request %s (yet)", j.c.Request)
			// A server that held the poll as asked may be asked again at
			// once; one that could not hold it (it holds as many of the
			// VM's polls as it may) is not asked in a tight loop.
			if time.Since(asked) < time.Second {
				sleep(ctx, 5*time.Second)
			}
		} else {
			last = err
			j.c.Log.Info("cannot poll the server; trying again", "error", err.Error())
			sleep(ctx, 5*time.Second)
		}
		if ctx.Err() != nil {
			return clientdist.Polled{}, fmt.Errorf("waited %s for the server to list request %s: %w (is the GuestRestore still Pending or Running?)", j.c.ListWait, j.c.Request, last)
		}
	}
}

// call makes one call to the client port as the VM's user; a non-2xx
// answer is an error with the server's words.
func (j *job) call(ctx context.Context, method, p string, q url.Values, body []byte) ([]byte, error) {
	u := strings.TrimSuffix(j.c.ClientURL, "/") + p + "?" + q.Encode()
	timeout := 60 * time.Second
	if q.Has(clientdist.WaitParam) {
		timeout += pollWait
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(j.c.User, j.c.Password)
	resp, err := j.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, p, err)
	}
	switch {
	case resp.StatusCode == http.StatusConflict:
		return nil, fmt.Errorf("%w: %s", errConflict, strings.TrimSpace(string(data)))
	case resp.StatusCode == http.StatusNotFound:
		return nil, fmt.Errorf("%w: %s", errNotFound, strings.TrimSpace(string(data)))
	case resp.StatusCode/100 != 2:
		return nil, fmt.Errorf("%s %s: %s: %s", method, p, resp.Status, strings.TrimSpace(string(data)))
	}
	return data, nil
}

// progress tells the server that the plan's first restored steps are
// restored, for the request's status while it runs. It is told once, and
// a failure only logged: the ending tells all.
func (j *job) progress(ctx context.Context, restored int) {
	q := url.Values{clientdist.UIDParam: {j.c.Request}, clientdist.PhaseParam: {string(v1alpha1.PhaseRunning)}, clientdist.RestoredParam: {strconv.Itoa(restored)}}
	if _, err := j.call(ctx, http.MethodPost, clientdist.ResultPath, q, nil); err != nil {
		j.c.Log.Info("cannot tell the server how far the restore got; going on", "restored", restored, "why", err.Error())
	}
}

// end tells the server how the request ended, trying a few times: the
// server may be restarting. Its error means it could not.
func (j *job) end(ctx context.Context, phase v1alpha1.RequestPhase, message string) error {
	q := url.Values{clientdist.UIDParam: {j.c.Request}, clientdist.PhaseParam: {string(phase)}}
	var err error
	for try := range 5 {
		if try > 0 && !sleep(ctx, time.Duration(try)*5*time.Second) {
			return fmt.Errorf("tell the server the request %s: %w", phase, ctx.Err())
		}
		_, err = j.call(ctx, http.MethodPost, clientdist.ResultPath, q, []byte(message))
		switch {
		case err == nil:
			j.c.Log.Info("told the server how the request ended", "phase", phase, "message", message)
			return nil
		case errors.Is(err, errNotFound):
			// Withdrawn (deleted, or failed by the controller) meanwhile:
			// nobody waits for this ending.
			j.c.Log.Info("the server no longer lists the request: its ending is not told", "phase", phase, "why", err.Error())
			return ErrEnded
		}
	}
	return fmt.Errorf("tell the server the request %s (%s): %w", phase, message, err)
}

// kopiaEnv is kopia's environment: its configuration, cache and logs in
// the scratch folder, the server's CA alone trusted, the password from the
// environment, never an argument.
func (j *job) kopiaEnv() []string {
	dir := filepath.Join(j.c.Scratch, "kopia")
	return []string{
		"HOME=" + j.c.Scratch,
		"KOPIA_CONFIG_PATH=" + filepath.Join(dir, "repository.config"),
		"KOPIA_CACHE_DIRECTORY=" + filepath.Join(dir, "cache"),
		"KOPIA_LOG_DIR=" + filepath.Join(dir, "logs"),
		"KOPIA_CHECK_FOR_UPDATES=false",
		"KOPIA_PASSWORD=" + j.c.Password,
		"SSL_CERT_FILE=" + filepath.Join(j.c.Scratch, "ca.crt"),
		"SSL_CERT_DIR=" + filepath.Join(j.c.Scratch, "no-ca-dir"),
	}
}

// connect connects kopia to the server as the VM's user; why says, for
// the request's status, why it could not.
func (j *job) connect(ctx context.Context) (why string, err error) {
	if err := os.WriteFile(filepath.Join(j.c.Scratch, "ca.crt"), j.c.CA, 0o600); err != nil {
		return "", fmt.Errorf("write the server's CA: %w", err)
	}
	vm, ns, _ := strings.Cut(j.c.User, "@")
	// Read-only: the Job only restores. Its caches are bounded well
	// within its scratch folder's size limit, which the kubelet enforces
	// by evicting the pod.
	out, err := j.kopia(ctx, "repository", "connect", "server", "--url="+j.c.ServerURL, "--override-username="+vm, "--override-hostname="+ns,
		"--readonly", "--content-cache-size-limit-mb=512", "--metadata-cache-size-limit-mb=512")
	if err != nil {
		return "cannot connect to the repository server " + j.c.ServerURL + ": " + lastLine(out, err), nil
	}
	return "", nil
}

// restore restores one step of the plan below folder, at <folder><path>,
// where nothing may be yet (fresh); it returns kopia's summary.
func (j *job) restore(ctx context.Context, folder string, step clientdist.Planned) (string, error) {
	dest, err := fresh(folder, step.Path)
	if err != nil {
		return "", err
	}
	// Owners are skipped: an unprivileged Job cannot give files away, so
	// they are the Job's user's and the claim's group (docs/requests.md).
	out, err := j.kopia(ctx, "restore", "--skip-owners", "--", step.Source, dest)
	if err != nil {
		return "", fmt.Errorf("kopia restore: %s", lastLine(out, err))
	}
	summary := "restored"
	for line := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(line, "Restored") {
			summary = strings.TrimSpace(line)
		}
	}
	return summary, nil
}

// kopia runs the client with args and returns what it printed.
func (j *job) kopia(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, j.c.Kopia, args...)
	cmd.Env = j.kopiaEnv()
	cmd.Dir = j.c.Scratch
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// lastLine is the last line kopia printed, or err.
func lastLine(out string, err error) string {
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if l := strings.TrimSpace(lines[len(lines)-1]); l != "" {
		return l
	}
	return err.Error()
}

// fresh makes the folders of root/rel above it and returns root/rel, or
// says why not: no folder on the way below root may be a symbolic link or
// anything but a folder, and root/rel must not exist, so that a restore
// into a claim that holds data overwrites none of it and nothing leads it
// out of the claim.
func fresh(root, rel string) (string, error) {
	parts := strings.Split(strings.Trim(path.Clean("/"+rel), "/"), "/")
	at := root
	for _, part := range parts[:len(parts)-1] {
		at = filepath.Join(at, part)
		fi, err := os.Lstat(at)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if err := os.Mkdir(at, 0o755); err != nil {
				return "", fmt.Errorf("cannot create %s in the claim: %w", strings.TrimPrefix(at, root), err)
			}
		case err != nil:
			return "", err
		case fi.Mode()&os.ModeSymlink != 0:
			return "", fmt.Errorf("%s is a symbolic link in the claim, which a restore does not follow", strings.TrimPrefix(at, root))
		case !fi.IsDir():
			return "", fmt.Errorf("%s is no folder in the claim", strings.TrimPrefix(at, root))
		}
	}
	at = filepath.Join(at, parts[len(parts)-1])
	if _, err := os.Lstat(at); !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s exists already: name it once", strings.TrimPrefix(at, root))
	}
	return at, nil
}
