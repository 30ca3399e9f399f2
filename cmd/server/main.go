// Command guestbackup-server runs beside the Kopia server in a
// BackupStorageLocationServer's pod:
//
//	guestbackup-server init        connect to or create the repository, write its access
//	                               rules (ACLs), write the TLS chain
//	guestbackup-server sync-users  keep the repository's users equal to the users Secrets and
//	                               its ACLs guestbackup's; on an append-only server, apply
//	                               retention on the server's clock
//
// Passwords and storage credentials come from the environment (KOPIA_PASSWORD,
// KOPIA_SERVER_CONTROL_PASSWORD, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
// AWS_SESSION_TOKEN), never from flags.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/kopia/kopia/repo"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver/usersync"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/pki"
	"github.com/guestbackup/guestbackup/pkg/retention"
)

func main() {
	const usage = "usage: guestbackup-server init|sync-users [flags]  (-help after a command lists its flags)"
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "-h", "-help", "--help", "help":
		fmt.Println(usage)
		return
	case "init":
		err = runInit(os.Args[2:])
	case "sync-users":
		err = runSyncUsers(os.Args[2:])
	default:
		err = fmt.Errorf("unknown command %q: want init or sync-users", os.Args[1])
	}
	if errors.Is(err, flag.ErrHelp) {
		return // the flag set printed its usage
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "guestbackup-server:", err)
		os.Exit(1)
	}
}

// env returns a required environment variable.
func env(name string) (string, error) {
	v := os.Getenv(name)
	if v == "" {
		return "", fmt.Errorf("environment variable %s is not set", name)
	}
	return v, nil
}

func runInit(args []string) error {
	fs := flag.NewFlagSet("init", flag.ContinueOnError)
	var (
		o             kopiaserver.PrepareOptions
		fsPath        string
		s3            kopiaserver.S3Location
		s3CAFile      string
		defaultPolicy string
		veleroSecret  string
		veleroKey     string
		veleroProfile string
		appendOnly    bool
	)
	fs.StringVar(&o.ConfigFile, "config-file", "", "Where to write the repository connection.")
	fs.StringVar(&o.TLSCertFile, "tls-cert-file", "", "The server's certificate (tls.crt).")
	fs.StringVar(&o.TLSCAFile, "tls-ca-file", "", "The CA that signed it (ca.crt).")
	fs.StringVar(&o.ChainFile, "tls-chain-file", "", "Where to write leaf + CA for the server.")
	fs.StringVar(&fsPath, "filesystem-path", "", "Folder of a filesystem repository.")
	fs.StringVar(&s3.Bucket, "s3-bucket", "", "Bucket of an S3 repository.")
	fs.StringVar(&s3.Endpoint, "s3-endpoint", "", "S3 endpoint (host[:port]).")
	fs.StringVar(&s3.Region, "s3-region", "", "S3 region.")
	fs.StringVar(&s3.Prefix, "s3-prefix", "", "Prefix of the repository's objects.")
	fs.BoolVar(&s3.DisableTLS, "s3-disable-tls", false, "Talk plain HTTP to the S3 endpoint.")
	fs.StringVar(&s3CAFile, "s3-ca-file", "", "PEM bundle of CAs for the S3 endpoint.")
	fs.StringVar(&veleroSecret, "s3-credentials-secret", "", "<namespace>/<name> of a Velero credential Secret to read the S3 credentials from, through the API, instead of the environment.")
	fs.StringVar(&veleroKey, "s3-credentials-key", "cloud", "Key of that Secret holding an AWS shared credentials file.")
	fs.StringVar(&veleroProfile, "s3-credentials-profile", "default", "Profile of that file to use.")
	fs.StringVar(&defaultPolicy, "default-policy", "", "JSON of the BSLS's repository.defaultPolicy, applied when the repository is created.")
	fs.BoolVar(&appendOnly, "append-only", false, "Write the append-only access rules instead of the default ones.")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if o.Password, err = env("KOPIA_PASSWORD"); err != nil {
		return err
	}
	switch {
	case fsPath != "" && s3.Bucket == "":
		o.Storage.Filesystem = &kopiaserver.FilesystemLocation{Path: fsPath}
	case s3.Bucket != "" && fsPath == "":
		if veleroSecret != "" {
			if s3.AccessKeyID, s3.SecretAccessKey, s3.SessionToken, err = veleroCredentials(veleroSecret, veleroKey, veleroProfile); err != nil {
				return err
			}
		} else {
			if s3.AccessKeyID, err = env(kopiaserver.AWSAccessKeyID); err != nil {
				return err
			}
			if s3.SecretAccessKey, err = env(kopiaserver.AWSSecretAccessKey); err != nil {
				return err
			}
			s3.SessionToken = os.Getenv("AWS_SESSION_TOKEN")
		}
		if s3CAFile != "" {
			if s3.CABundle, err = os.ReadFile(s3CAFile); err != nil {
				return fmt.Errorf("read S3 CA bundle: %w", err)
			}
		}
		o.Storage.S3 = &s3
	default:
		return errors.New("set exactly one of --filesystem-path and --s3-bucket")
	}
	if defaultPolicy != "" {
		o.Defaults = &v1alpha1.PolicySpec{}
		if err := json.Unmarshal([]byte(defaultPolicy), o.Defaults); err != nil {
			return fmt.Errorf("--default-policy: %w", err)
		}
	}
	created, err := kopiaserver.Prepare(context.Background(), o)
	if err != nil {
		return err
	}
	if created {
		fmt.Println("created a new repository")
	} else {
		fmt.Println("connected to the existing repository")
	}
	return writeACLs(o.ConfigFile, o.Password, appendOnly)
}

// foreignACLsFile is where init leaves the foreign ACLs it removed, for the
// user-sync container (which shares the config folder) to report.
func foreignACLsFile(configFile string) string { return configFile + ".foreign-acls.json" }

// writeACLs makes the repository's access rules guestbackup's before the
// server starts, so that it never serves under Kopia's legacy rules (no
// ACLs) or under rules someone else wrote; on an append-only server it
// also makes the retention guests can trigger keep everything.
func writeACLs(configFile, password string, appendOnly bool) error {
	ctx := context.Background()
	r, err := repo.Open(ctx, configFile, password, &repo.Options{})
	if err != nil {
		return fmt.Errorf("open repository: %w", err)
	}
	defer r.Close(ctx) //nolint:errcheck // the write session flushed what matters
	res, err := kopiauser.SyncACLs(ctx, r, kopiauser.ACLsFor(appendOnly))
	if err != nil {
		return err
	}
	if appendOnly {
		// Before the server starts, too: a BSLS switched to append-only
		// must not serve a guest's retention request under the old counts.
		fixed, unreadable, err := retention.GuestPolicies(ctx, r)
		if err != nil {
			return err
		}
		if len(fixed) > 0 {
			fmt.Println("retention guests can trigger set to keep everything:", fixed)
		}
		if len(unreadable) > 0 {
			fmt.Println("policy manifests that do not parse were skipped:", unreadable)
		}
	}
	for _, f := range res.Foreign {
		fmt.Println("removed an ACL manifest guestbackup did not write:", f.String())
	}
	data, err := json.Marshal(res.Foreign)
	if err != nil {
		return fmt.Errorf("encode foreign ACLs: %w", err)
	}
	if err := os.WriteFile(foreignACLsFile(configFile), data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", foreignACLsFile(configFile), err)
	}
	return nil
}

// veleroCredentials reads S3 credentials from a Velero credential Secret
// (an AWS shared credentials file) through the API; the pod's service
// account may get that one Secret.
func veleroCredentials(ref, key, profile string) (accessKeyID, secretAccessKey, sessionToken string, err error) {
	namespace, name, ok := strings.Cut(ref, "/")
	if !ok || namespace == "" || name == "" {
		return "", "", "", fmt.Errorf("--s3-credentials-secret %q: want <namespace>/<name>", ref)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return "", "", "", fmt.Errorf("load kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return "", "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secret, err := cs.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", "", fmt.Errorf("read Velero's credentials: %w", err)
	}
	accessKeyID, secretAccessKey, sessionToken, err = kopiaserver.ParseAWSCredentials(secret.Data[key], profile)
	if err != nil {
		return "", "", "", fmt.Errorf("Secret %s, key %s: %w", ref, key, err)
	}
	return accessKeyID, secretAccessKey, sessionToken, nil
}

func runSyncUsers(args []string) error {
	fs := flag.NewFlagSet("sync-users", flag.ContinueOnError)
	var (
		o           usersync.Options
		configFile  string
		serverURL   string
		controlUser string
		caFile      string
		healthAddr  string
		bslsUID     string
		policyJSON  string
		logOpts     zap.Options
	)
	fs.StringVar(&o.Namespace, "namespace", "", "Namespace of the BSLS and its users Secrets.")
	fs.StringVar(&o.BSLS, "bsls", "", "Name of the BSLS.")
	fs.StringVar(&bslsUID, "bsls-uid", "", "UID of the BSLS, which Events name.")
	fs.BoolVar(&o.AppendOnly, "append-only", false, "Let guests create and read their own snapshots, but not delete them (Kopia ACLs), and apply retention on the server's clock.")
	fs.StringVar(&policyJSON, "default-policy", "", "JSON of the BSLS's repository.defaultPolicy: its retention is what an append-only server applies.")
	fs.DurationVar(&o.RetentionInterval, "retention-interval", time.Hour, "How often an append-only server applies retention.")
	fs.DurationVar(&o.ActivityInterval, "activity-interval", time.Minute, "How often to publish the guests' new snapshots for the controller's audit; 0 disables it.")
	fs.DurationVar(&o.Resync, "resync", 5*time.Minute, "How often to compare the repository with the Secrets even when none changed.")
	fs.StringVar(&configFile, "config-file", "", "The repository connection written by init.")
	fs.StringVar(&serverURL, "server-url", "", "The Kopia server in this pod, e.g. https://127.0.0.1:51515.")
	fs.StringVar(&controlUser, "server-control-username", "server-control", "The server's control user.")
	fs.StringVar(&caFile, "tls-ca-file", "", "The CA the server's certificate verifies against.")
	fs.StringVar(&healthAddr, "health-addr", ":8082", "Address of /healthz, /readyz (ready once users are synced) and /metrics.")
	logOpts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Namespace == "" || o.BSLS == "" || configFile == "" || serverURL == "" || caFile == "" {
		return errors.New("--namespace, --bsls, --config-file, --server-url and --tls-ca-file are required")
	}
	o.Log = zap.New(zap.UseFlagOptions(&logOpts))
	o.BSLSUID = types.UID(bslsUID)
	var spec *v1alpha1.PolicySpec
	if policyJSON != "" {
		spec = &v1alpha1.PolicySpec{}
		if err := json.Unmarshal([]byte(policyJSON), spec); err != nil {
			return fmt.Errorf("--default-policy: %w", err)
		}
	}
	o.Retention = retention.FromSpec(spec)
	if data, err := os.ReadFile(foreignACLsFile(configFile)); err == nil {
		if err := json.Unmarshal(data, &o.RemovedBefore); err != nil {
			return fmt.Errorf("%s: %w", foreignACLsFile(configFile), err)
		}
		// Reported once: a restarted container does not report them again.
		if err := os.Remove(foreignACLsFile(configFile)); err != nil {
			return fmt.Errorf("remove %s: %w", foreignACLsFile(configFile), err)
		}
	}
	password, err := env("KOPIA_PASSWORD")
	if err != nil {
		return err
	}
	controlPassword, err := env("KOPIA_SERVER_CONTROL_PASSWORD")
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("read CA: %w", err)
	}
	cas, err := pki.ParseCerts(caPEM)
	if err != nil {
		return fmt.Errorf("CA %s: %w", caFile, err)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	if o.Client, err = kubernetes.NewForConfig(cfg); err != nil {
		return err
	}
	// Events on the BSLS (create and patch in its namespace, as the Role allows).
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: o.Client.CoreV1().Events(o.Namespace)})
	defer broadcaster.Shutdown()
	o.Events = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "guestbackup-server"})

	ctx := ctrl.SetupSignalHandler()
	r, err := repo.Open(ctx, configFile, password, &repo.Options{})
	if err != nil {
		return fmt.Errorf("open repository: %w", err)
	}
	defer r.Close(context.Background()) //nolint:errcheck // nothing left to flush at exit
	o.Repository = r
	control := kopiaserver.NewControlClient(serverURL, controlUser, controlPassword, cas)
	defer control.Close()
	o.Server = control
	syncer := usersync.New(o)

	metrics := prometheus.NewRegistry()
	metrics.MustRegister(usersync.ForeignACLsRemoved, usersync.SnapshotsExpired, usersync.RetentionFailures)
	health := &http.Server{Addr: healthAddr, Handler: healthHandler(syncer, metrics), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := health.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
			o.Log.Error(err, "health endpoint stopped")
		}
	}()
	defer health.Close()
	return syncer.Run(ctx)
}

// healthHandler serves /healthz (the process is up), /readyz (the
// repository holds exactly the desired users; the body says why not) and
// /metrics (user sync's counters).
func healthHandler(s *usersync.Syncer, metrics *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(metrics, promhttp.HandlerOpts{}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if err := s.Ready(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "ok: %d users\n", s.Users())
	})
	return mux
}
