package serverargs

import (
	"flag"
	"io"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// command is what the tests need of Init and SyncUsers.
type command[T any] struct {
	name    string
	zero    func() T
	args    func(T) []string
	declare func(*T, *flags)
}

var (
	initCommand = command[Init]{CommandInit, NewInit, Init.Args, (*Init).declare}
	syncCommand = command[SyncUsers]{CommandSyncUsers, NewSyncUsers, SyncUsers.Args, (*SyncUsers).declare}
)

// parse is what the server binds from args, a command line from Args.
func parse[T any](t *testing.T, c command[T], args []string) T {
	t.Helper()
	if len(args) == 0 || args[0] != c.name {
		t.Fatalf("args %q: want the command %s first", args, c.name)
	}
	var got T
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.declare(&got, &flags{fs: fs})
	if err := fs.Parse(args[1:]); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	if fs.NArg() != 0 {
		t.Fatalf("parse %q: left %q", args, fs.Args())
	}
	return got
}

// allSet is every field of Init set away from its default.
var allSet = Init{
	ConfigFile: "/config/repository.config", TLSCertFile: "/tls/tls.crt", TLSCAFile: "/tls/ca.crt", ChainFile: "/config/tls-chain.pem",
	AppendOnly: true, FilesystemPath: "/repository/guests",
	S3Bucket: "b", S3Prefix: "p/", S3Endpoint: "s3:9000", S3Region: "eu", S3DisableTLS: true, S3CAFile: "/s3-ca/ca.crt",
	GCSBucket: "g", GCSPrefix: "gp/",
	AzureContainer: "c", AzureStorageAccount: "acct", AzurePrefix: "ap/", AzureStorageDomain: "blob.core.usgovcloudapi.net", AzureDisableTLS: true,
	WorkloadIdentity: true, CredentialsSecret: "velero/creds", CredentialsKey: "aws", CredentialsProfile: "backup", AzureStorageKeyVariable: "KEY",
	DefaultPolicy: `{"compression":"zstd"}`, Namespace: "backup", BSLS: "main", Maintenance: true,
	MaintenanceQuickInterval: 30 * time.Minute, MaintenanceFullInterval: 12 * time.Hour,
}

// TestInitRoundTrip: what the server binds from Args is what the
// controller wrote, and Args writes what the pod spec shows.
func TestInitRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Init
		want []string
	}{
		{
			name: "zero: every non-empty default written as zero",
			in:   Init{},
			want: []string{"init", "--append-only=false", "--credentials-key=", "--credentials-profile=", "--maintenance=false", "--maintenance-quick-interval=0s", "--maintenance-full-interval=0s"},
		},
		{
			name: "defaults: only what the pod spec always states",
			in:   NewInit(),
			want: []string{"init", "--append-only=false", "--maintenance=false"},
		},
		{
			name: "switches on are bare, the always written ones state their value",
			in:   func() Init { o := NewInit(); o.S3DisableTLS, o.AppendOnly, o.Maintenance = true, true, true; return o }(),
			want: []string{"init", "--append-only=true", "--s3-disable-tls", "--maintenance=true"},
		},
		{
			name: "a credential Secret's key is written at its default",
			in:   func() Init { o := NewInit(); o.CredentialsSecret = "velero/cloud-credentials"; return o }(),
			want: []string{"init", "--append-only=false", "--credentials-secret=velero/cloud-credentials", "--credentials-key=cloud", "--maintenance=false"},
		},
		{
			name: "every field set",
			in:   allSet,
			want: []string{"init",
				"--config-file=/config/repository.config", "--tls-cert-file=/tls/tls.crt", "--tls-ca-file=/tls/ca.crt", "--tls-chain-file=/config/tls-chain.pem",
				"--append-only=true", "--filesystem-path=/repository/guests",
				"--s3-bucket=b", "--s3-prefix=p/", "--s3-endpoint=s3:9000", "--s3-region=eu", "--s3-disable-tls", "--s3-ca-file=/s3-ca/ca.crt",
				"--gcs-bucket=g", "--gcs-prefix=gp/",
				"--azure-container=c", "--azure-storage-account=acct", "--azure-prefix=ap/", "--azure-storage-domain=blob.core.usgovcloudapi.net", "--azure-disable-tls",
				"--workload-identity", "--credentials-secret=velero/creds", "--credentials-key=aws", "--credentials-profile=backup", "--azure-storage-key-variable=KEY",
				`--default-policy={"compression":"zstd"}`, "--namespace=backup", "--bsls=main", "--maintenance=true",
				"--maintenance-quick-interval=30m0s", "--maintenance-full-interval=12h0m0s"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, initCommand, tc.in, tc.want) })
	}
}

// TestSyncUsersRoundTrip: the same for sync-users.
func TestSyncUsersRoundTrip(t *testing.T) {
	allSet := SyncUsers{
		Namespace: "$(POD_NAMESPACE)", BSLS: "main", BSLSUID: "0b5e5a1e", ConfigFile: "/config/repository.config",
		ServerURL: "https://127.0.0.1:51517", GateAddr: "0.0.0.0:51515", CAFile: "/tls/ca.crt", HealthAddr: "0.0.0.0:8082",
		AppendOnly: true, ActivityInterval: 2 * time.Minute, Maintenance: true, ClientAddr: "0.0.0.0:51516",
		ClientBinaries: map[string]string{"arm64": "/arm", "amd64": "/amd"}, ChainFile: "/config/tls-chain.pem", KeyFile: "/tls/tls.key",
		MaintenanceLease: "main-maintenance", VerifyInterval: time.Hour, VerifyReadBytes: 1 << 30, QuotaInterval: 30 * time.Second,
		DefaultPolicy: `{"retention":{"keepLatest":3}}`, RetentionInterval: 2 * time.Hour, StorageCheckInterval: 5 * time.Second,
		StatsInterval: time.Hour, Resync: time.Minute, ControlUsername: "control",
	}
	for _, tc := range []struct {
		name string
		in   SyncUsers
		want []string
	}{
		{
			name: "zero: every non-empty default written as zero, which disables what it paces",
			in:   SyncUsers{},
			want: []string{"sync-users", "--health-addr=", "--append-only=false", "--activity-interval=0s", "--maintenance=false",
				"--verify-interval=0s", "--verify-read-bytes=0", "--quota-interval=0s", "--retention-interval=0s",
				"--storage-check-interval=0s", "--repository-stats-interval=0s", "--resync=0s", "--server-control-username="},
		},
		{
			name: "defaults: only what the pod spec always states",
			in:   NewSyncUsers(),
			want: []string{"sync-users", "--append-only=false", "--activity-interval=1m0s", "--maintenance=false"},
		},
		{
			name: "one client binary",
			in:   func() SyncUsers { o := NewSyncUsers(); o.ClientBinaries = map[string]string{"amd64": "/k"}; return o }(),
			want: []string{"sync-users", "--append-only=false", "--activity-interval=1m0s", "--maintenance=false", "--client-binary=amd64=/k"},
		},
		{
			name: "every field set; client binaries by architecture",
			in:   allSet,
			want: []string{"sync-users", "--namespace=$(POD_NAMESPACE)", "--bsls=main", "--bsls-uid=0b5e5a1e", "--config-file=/config/repository.config",
				"--server-url=https://127.0.0.1:51517", "--gate-addr=0.0.0.0:51515", "--tls-ca-file=/tls/ca.crt", "--health-addr=0.0.0.0:8082",
				"--append-only=true", "--activity-interval=2m0s", "--maintenance=true", "--client-addr=0.0.0.0:51516",
				"--client-binary=amd64=/amd", "--client-binary=arm64=/arm", "--tls-chain-file=/config/tls-chain.pem", "--tls-key-file=/tls/tls.key",
				"--maintenance-lease=main-maintenance", "--verify-interval=1h0m0s", "--verify-read-bytes=1073741824", "--quota-interval=30s",
				`--default-policy={"retention":{"keepLatest":3}}`, "--retention-interval=2h0m0s", "--storage-check-interval=5s",
				"--repository-stats-interval=1h0m0s", "--resync=1m0s", "--server-control-username=control"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) { roundTrip(t, syncCommand, tc.in, tc.want) })
	}
}

// roundTrip checks that c's Args writes want for in, from which the
// server binds in again.
func roundTrip[T any](t *testing.T, c command[T], in T, want []string) {
	t.Helper()
	got := c.args(in)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Args (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(in, parse(t, c, got)); diff != "" {
		t.Errorf("bound from %q (-wrote +bound):\n%s", got, diff)
	}
}

// TestEveryFieldIsAFlag: each field, moved off its default alone, is
// written by Args and bound back, by a flag of its own; a field added
// without a flag fails here.
func TestEveryFieldIsAFlag(t *testing.T) {
	t.Run(CommandInit, func(t *testing.T) { everyFieldIsAFlag(t, initCommand) })
	t.Run(CommandSyncUsers, func(t *testing.T) { everyFieldIsAFlag(t, syncCommand) })
}

func everyFieldIsAFlag[T any](t *testing.T, c command[T]) {
	var probe T
	f := &flags{fs: flag.NewFlagSet(c.name, flag.ContinueOnError)}
	c.declare(&probe, f)
	typ := reflect.TypeFor[T]()
	if len(f.order) != typ.NumField() {
		t.Errorf("%d flags for %d fields of %s", len(f.order), typ.NumField(), typ)
	}
	defaults := c.zero()
	for i := range typ.NumField() {
		field := typ.Field(i)
		t.Run(field.Name, func(t *testing.T) {
			changed := defaults
			setOffDefault(t, reflect.ValueOf(&changed).Elem().Field(i))
			got := c.args(changed)
			if slices.Equal(got, c.args(defaults)) {
				t.Fatalf("Args does not write %s: %q", field.Name, got)
			}
			if diff := cmp.Diff(changed, parse(t, c, got)); diff != "" {
				t.Errorf("bound from %q (-wrote +bound):\n%s", got, diff)
			}
		})
	}
}

// setOffDefault moves v, a field at its default, to another value.
func setOffDefault(t *testing.T, v reflect.Value) {
	t.Helper()
	switch {
	case v.Type() == reflect.TypeFor[time.Duration]():
		v.SetInt(v.Int() + int64(7*time.Second))
	case v.Kind() == reflect.String:
		v.SetString(v.String() + "-set")
	case v.Kind() == reflect.Bool:
		v.SetBool(!v.Bool())
	case v.Kind() == reflect.Int64:
		v.SetInt(v.Int() + 7)
	case v.Type() == reflect.TypeFor[map[string]string]():
		v.Set(reflect.ValueOf(map[string]string{"riscv64": "/k"}))
	default:
		t.Fatalf("no sample value for a field of type %s: teach setOffDefault and the flags type", v.Type())
	}
}

// TestNoSecretInArguments: no field carries a password, key or token, which
// any user of the node could read in the process's arguments.
func TestNoSecretInArguments(t *testing.T) {
	for _, typ := range []reflect.Type{reflect.TypeFor[Init](), reflect.TypeFor[SyncUsers]()} {
		for field := range typ.Fields() {
			for _, secret := range []string{"Password", "Token", "AccessKeyID", "SecretAccessKey", "StorageKey", "ClientSecret"} {
				if strings.HasSuffix(field.Name, secret) {
					t.Errorf("%s.%s: secrets reach the pod in its environment or through the API, never in its arguments", typ.Name(), field.Name)
				}
			}
		}
	}
}

// TestClientBinaryWantsPairs: a client binary is <arch>=<path>.
func TestClientBinaryWantsPairs(t *testing.T) {
	for _, tc := range []struct {
		arg string
		ok  bool
	}{
		{"--client-binary=amd64=/usr/local/bin/kopia", true},
		{"--client-binary=amd64", false},
		{"--client-binary==/k", false},
		{"--client-binary=amd64=", false},
	} {
		var o SyncUsers
		fs := flag.NewFlagSet(CommandSyncUsers, flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		o.AddFlags(fs)
		if err := fs.Parse([]string{tc.arg}); (err == nil) != tc.ok {
			t.Errorf("%s: error %v, want ok %v", tc.arg, err, tc.ok)
		}
	}
}

// TestNoValueExpandsAPodVariable: the kubelet replaces $(VAR) in a
// container's arguments with the container's variables, the repository's
// password among them. A value from a BSLS or a Velero BSL is written so
// that it reaches the server as it was; only the pod's own namespace is a
// reference to expand.
func TestNoValueExpandsAPodVariable(t *testing.T) {
	in := NewInit()
	in.S3Bucket, in.S3Prefix, in.S3Endpoint = "b", "leak-$(KOPIA_PASSWORD)/", "$(KOPIA_PASSWORD).example:9000"
	in.DefaultPolicy = `{"description":"costs $5, or $$(X)"}`
	sync := NewSyncUsers()
	sync.Namespace = "$(POD_NAMESPACE)"
	sync.ClientBinaries = map[string]string{"amd64": "/clients/$(KOPIA_PASSWORD)"}
	got := slices.Concat(in.Args(), sync.Args())
	for _, want := range []string{
		"--s3-prefix=leak-$$(KOPIA_PASSWORD)/",
		"--s3-endpoint=$$(KOPIA_PASSWORD).example:9000",
		`--default-policy={"description":"costs $$5, or $$$$(X)"}`,
		"--namespace=$(POD_NAMESPACE)",
		"--client-binary=amd64=/clients/$$(KOPIA_PASSWORD)",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("args %q lack %q", got, want)
		}
	}
}
