package usersync

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/healthz"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/eventrecord"
	"github.com/guestbackup/guestbackup/pkg/serverpod"
	"github.com/guestbackup/guestbackup/pkg/serverpod/clientserver"
	"github.com/guestbackup/guestbackup/pkg/serverpod/integrity"
	"github.com/guestbackup/guestbackup/pkg/serverpod/logins"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
	"github.com/guestbackup/guestbackup/pkg/serverpod/readkeeper"
	"github.com/guestbackup/guestbackup/pkg/serverpod/sessiongate"
)

// healthReadHeaderTimeout bounds a probe's request headers.
const healthReadHeaderTimeout = 5 * time.Second

// serverProbeTimeout bounds the readiness probe's question to the Kopia
// server (the kubelet's own timeout is a second by default).
const serverProbeTimeout = 900 * time.Millisecond

// ServeOptions is what the user-sync container runs with.
type ServeOptions struct {
	// Options are the Syncer's; Serve sets Repository, Server, Events and
	// RemovedBefore.
	Options
	// ConfigFile is the repository connection init wrote; Password the
	// repository's.
	ConfigFile, Password string
	// ServerURL is the Kopia server in this pod; ControlUsername and
	// ControlPassword its server-control user; CAFile the CA its
	// certificate verifies against.
	ServerURL, ControlUsername, ControlPassword, CAFile string
	// HealthAddr serves Handler.
	HealthAddr string
	// GateAddr is the port guests' Kopia clients connect to: the session
	// gate (package sessiongate) in front of the Kopia server at
	// ServerURL, which listens on the pod's loopback only.
	GateAddr string
	// ChainFile and KeyFile are the certificate chain and key the Kopia
	// server presents: guests trust the same CA on the gate's port and the
	// client port.
	ChainFile, KeyFile string
	// Maintenance runs the repository's maintenance as the owner init
	// connected (package maintenance).
	Maintenance bool
	// Verify configures the repository's verification beside
	// maintenance (package integrity); Verify.Server is set by Serve.
	Verify maintenance.VerifyConfig
	// MaintenanceLease, when set, names the Lease that elects the one pod
	// of several that runs maintenance (maintenance.Election); this pod's
	// identity there is Options.Pod.
	MaintenanceLease string
	// ClientPort, when set, serves the kopia client to guests and takes their
	// reports (package clientserver).
	ClientPort *ClientOptions
}

// ClientOptions configure the client port.
type ClientOptions struct {
	// Addr is the client port's address.
	Addr string
	// Binaries maps each architecture to the kopia binary served for it.
	Binaries map[string]string
}

// Serve runs the user-sync container until ctx ends: it opens the
// repository, reports the ACLs init removed, records Events on the BSLS,
// serves guests' sessions through the gate on GateAddr, serves Handler on
// HealthAddr and keeps the users in sync.
func Serve(ctx context.Context, o ServeOptions) error {
	var err error
	if o.RemovedBefore, err = serverpod.TakeForeignACLs(o.ConfigFile); err != nil {
		return err
	}
	caPEM, err := os.ReadFile(o.CAFile)
	if err != nil {
		return fmt.Errorf("read CA: %w", err)
	}
	cas, err := certutil.ParseCertsPEM(caPEM)
	if err != nil {
		return fmt.Errorf("CA %s: %w", o.CAFile, err)
	}
	// Events on the BSLS (create and patch in its namespace, as the Role allows).
	broadcaster := eventrecord.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.Client.CoreV1().Events(o.Namespace)})
	defer broadcaster.Shutdown()
	o.Events = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "guestbackup-server"})
	control := serverpod.NewControlClient(o.ServerURL, o.ControlUsername, o.ControlPassword, cas)
	defer control.Close()
	o.Verify.Server = control
	// Shared by user sync and maintenance, whose refused writes the
	// storage check publishes.
	o.space = &spaceState{}
	stopMaintenance, err := startMaintenance(ctx, o)
	if err != nil {
		return err
	}
	defer stopMaintenance()

	r, err := repo.Open(ctx, o.ConfigFile, o.Password, &repo.Options{})
	if err != nil {
		return fmt.Errorf("open repository: %w", err)
	}
	defer r.Close(context.Background()) //nolint:errcheck // nothing left to flush at exit
	o.Repository = r
	o.Server = control
	defer readkeeper.Start(ctx, &readkeeper.Keeper{Repository: r, Server: control, Log: o.Log.WithName("readkeeper")})()
	// The gate asks the syncer whom the users Secrets list; the syncer
	// ends sessions at the gate.
	syncer := New(o.Options)
	gate, err := sessiongate.New(sessiongate.Options{Upstream: o.ServerURL, TLS: serverpod.TrustChain(cas), Directory: syncer, Writes: syncer, Log: o.Log.WithName("gate")})
	if err != nil {
		return err
	}
	syncer.opts.Sessions = gate
	stopGate, err := serveGate(ctx, o, gate)
	if err != nil {
		return err
	}
	defer stopGate()
	if o.ClientPort != nil {
		stopClient, err := serveClient(ctx, o, syncer)
		if err != nil {
			return err
		}
		defer stopClient()
	}

	health := &http.Server{Addr: o.HealthAddr, Handler: syncer.Handler(), ReadHeaderTimeout: healthReadHeaderTimeout}
	go func() {
		if err := health.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.Log.Error(err, "health endpoint stopped")
		}
	}()
	defer health.Close()
	return syncer.Run(ctx)
}

// Handler serves /healthz (the process is up), /readyz (Ready: the users
// are applied and enforced, and the Kopia server answers with the
// repository open; when not, the body says why, so that the kubelet's probe Event
// tells an admin) and /metrics (user sync's counters, the guests' open
// sessions, the repository's measurement, its storage's space,
// maintenance).
func (s *Syncer) Handler() http.Handler {
	metrics := prometheus.NewRegistry()
	metrics.MustRegister(ForeignACLsRemoved, SnapshotsExpired, RetentionFailures, SnapshotsCreated, SessionsEnded, s.stats, s.space)
	metrics.MustRegister(UserQuotaBytes, UsersOverQuota, s.usage)
	metrics.MustRegister(sessiongate.Collectors()...)
	metrics.MustRegister(logins.Verifications, logins.HashSeconds, GateCredentialsLoaded)
	metrics.MustRegister(maintenance.Collectors()...)
	metrics.MustRegister(integrity.Collectors()...)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	mux.Handle("/healthz", healthz.CheckHandler{Checker: healthz.Ping})
	mux.Handle("/readyz", healthz.CheckHandler{Checker: func(r *http.Request) error {
		if err := s.Ready(); err != nil {
			return err
		}
		return s.serverAnswers(r.Context())
	}})
	return mux
}

// serverAnswers is nil when the Kopia server answers with its repository
// open: the pod serves guests only then (the server's own port is on
// loopback, out of the kubelet's reach).
func (s *Syncer) serverAnswers(ctx context.Context) error {
	if s.opts.Server == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, serverProbeTimeout)
	defer cancel()
	connected, err := s.opts.Server.Connected(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("the Kopia server does not answer: %w", err)
	case !connected:
		return errors.New("the Kopia server has not opened its repository yet")
	}
	return nil
}

// serveGate serves the gate on GateAddr until ctx ends or stop is called.
func serveGate(ctx context.Context, o ServeOptions, gate *sessiongate.Gate) (stop func(), err error) {
	ln, err := net.Listen("tcp", o.GateAddr)
	if err != nil {
		return nil, fmt.Errorf("gate: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := serverpod.ServeTLS(ctx, ln, o.ChainFile, o.KeyFile, gate.Server()); err != nil {
			o.Log.Error(err, "gate stopped: guests cannot reach the Kopia server")
		}
	}()
	return func() { cancel(); <-done }, nil
}

// startMaintenance reports what init did (policy, maintenance owner) and
// runs maintenance until ctx ends or stop is called.
func startMaintenance(ctx context.Context, o ServeOptions) (stop func(), err error) {
	reports := maintenance.EventReporter{Recorder: o.Events, Object: &corev1.ObjectReference{
		APIVersion: v1alpha1.GroupVersion.String(), Kind: "BackupStorageLocationServer",
		Namespace: o.Namespace, Name: o.BSLS, UID: o.BSLSUID,
	}}
	report, err := serverpod.TakeInitReport(o.ConfigFile)
	if err != nil {
		return nil, err
	}
	for _, e := range report.Events(maintenance.OwnerName(o.Namespace, o.BSLS)) {
		reports.Report(e.Warning, e.Reason, e.Message)
	}
	if !o.Maintenance {
		return func() {}, nil
	}
	log := o.Log.WithName("maintenance")
	c := maintenance.Config{
		ConfigFile: serverpod.MaintenanceConfigFile(o.ConfigFile), Password: o.Password,
		Reports: reports, Publish: maintenancePublisher{
			ConfigMapPublisher: maintenance.ConfigMapPublisher{ConfigMaps: o.Client.CoreV1().ConfigMaps(o.Namespace), BSLS: o.BSLS},
			space:              o.space,
		},
		Verify: o.Verify, Log: log,
	}
	if o.MaintenanceLease != "" {
		election := maintenance.Election{
			Leases: o.Client.CoordinationV1(), Namespace: o.Namespace, Lease: o.MaintenanceLease,
			Identity: o.Pod, Log: log,
		}
		return maintenance.StartElected(ctx, election, c), nil
	}
	return maintenance.Start(ctx, c)
}

// serveClient opens the client binaries, serves them (and the guests'
// reports, authenticated and kept by syncer) on the client port, and
// publishes what it serves for the BSLS's status until that succeeds.
func serveClient(ctx context.Context, o ServeOptions, syncer *Syncer) (stop func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	srv, err := clientserver.Open(clientserver.Options{
		Binaries: o.ClientPort.Binaries, Authenticator: syncer, Reporter: syncer, Requests: syncer, Log: o.Log.WithName("client"),
		Done: ctx.Done(),
	})
	if err != nil {
		cancel()
		return nil, err
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := clientserver.ListenAndServe(ctx, o.ClientPort.Addr, o.ChainFile, o.KeyFile, srv.Handler()); err != nil {
			o.Log.Error(err, "client port stopped")
		}
	}()
	go func() {
		defer wg.Done()
		configMaps := o.Client.CoreV1().ConfigMaps(o.Namespace)
		status := srv.Status()
		// The controller creates the ConfigMap with the Deployment; until
		// then, and on API errors, try again.
		_ = wait.PollUntilContextCancel(ctx, 2*time.Second, true, func(ctx context.Context) (bool, error) {
			if err := clientserver.Publish(ctx, configMaps, o.BSLS, status); err != nil {
				o.Log.Error(err, "client not published yet")
				return false, nil
			}
			o.Log.Info("client published", "version", status.Version, "sha256", status.SHA256)
			return true, nil
		})
	}()
	return func() { cancel(); wg.Wait(); srv.Close() }, nil
}
