package serverpod

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kopia/kopia/repo"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiauser"
	"github.com/guestbackup/guestbackup/pkg/serverpod/retention"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
)

// veleroReadTimeout bounds the read of Velero's credential Secret.
const veleroReadTimeout = time.Minute

// InitOptions is what the init container does, from its flags.
type InitOptions struct {
	PrepareOptions
	// Velero, when set, names the Velero credential Secret the storage's
	// credentials are read from, through the API; otherwise S3 credentials
	// come from the environment (storagecreds' variables).
	Velero *VeleroCredentials
	// WorkloadIdentity says the storage has no static keys: Kopia reaches
	// it as the pod's cloud identity (S3: IRSA's web identity token; GCS:
	// the metadata server's token; Azure: Azure Workload Identity's
	// federated token, named by the environment its webhook sets).
	WorkloadIdentity bool
	// AppendOnly writes the append-only access rules instead of the
	// default ones.
	AppendOnly bool
	// Maintenance, when set, claims the repository's maintenance for the
	// BSLS's owner identity (ClaimMaintenance).
	Maintenance *MaintenanceOptions
	// Out receives what Init did, for the container's log.
	Out io.Writer
}

// VeleroCredentials names the credentials file in a Velero credential
// Secret, in the format of the storage's provider: an AWS shared
// credentials file, a GCP service account's JSON key, or an Azure
// KEY=VALUE file.
type VeleroCredentials struct {
	Namespace, Name, Key string
	// Profile is the AWS credentials file's profile (S3).
	Profile string
	// AzureStorageKeyVariable names the storage account key in an Azure
	// credentials file (the BSL's config.storageAccountKeyEnvVar); empty
	// means a service principal.
	AzureStorageKeyVariable string
	// Client reads the Secret; the pod's service account may get that
	// one Secret.
	Client kubernetes.Interface
}

// Init gets a server pod ready to serve: it completes the storage's
// credentials, connects to (or creates) the repository, writes the TLS chain, and makes
// the repository's access rules guestbackup's before the server starts, so
// that it never serves under Kopia's legacy rules (no ACLs) or under rules
// someone else wrote. The ACL manifests it removes are left for user sync
// to report (TakeForeignACLs).
func Init(ctx context.Context, o InitOptions) error {
	if o.Out == nil {
		o.Out = io.Discard
	}
	if err := o.credentials(ctx); err != nil {
		return err
	}
	created, err := Prepare(ctx, o.PrepareOptions)
	if err != nil {
		return err
	}
	if created {
		fmt.Fprintln(o.Out, "created a new repository")
	} else {
		fmt.Fprintln(o.Out, "connected to the existing repository")
	}
	var report InitReport
	if !created {
		// The admin's edits of the BSLS's policy roll the pod (they are
		// in its arguments): they reach the repository here.
		if report.PolicyApplied, err = applyPolicyFile(ctx, o.ConfigFile, o.Password, o.Defaults, o.AppendOnly); err != nil {
			return err
		}
		if report.PolicyApplied {
			fmt.Fprintln(o.Out, "global policy set to the BSLS's defaultPolicy")
		}
	}
	if m := o.Maintenance; m != nil {
		if report.MaintenanceAction, report.PreviousOwner, err = ClaimMaintenance(ctx, o.Storage, o.ConfigFile, o.Password, *m); err != nil {
			return err
		}
		fmt.Fprintf(o.Out, "maintenance owner: %s (was %q)\n", report.MaintenanceAction, report.PreviousOwner)
	}
	if err := writeInitReport(o.ConfigFile, report); err != nil {
		return err
	}
	return writeACLs(ctx, o.Out, o.ConfigFile, o.Password, o.AppendOnly)
}

// applyPolicyFile opens the repository configFile connects to and applies
// the admin's policy (ApplyPolicy).
func applyPolicyFile(ctx context.Context, configFile, password string, spec *v1alpha1.PolicySpec, appendOnly bool) (bool, error) {
	if spec == nil {
		return false, nil
	}
	r, err := repo.Open(ctx, configFile, password, &repo.Options{})
	if err != nil {
		return false, fmt.Errorf("open repository: %w", err)
	}
	defer r.Close(ctx) //nolint:errcheck // the write session flushed what matters
	return ApplyPolicy(ctx, r, spec, appendOnly)
}

// credentials completes o.Storage with its credentials: none for a
// filesystem, the pod's identity with WorkloadIdentity, else Velero's
// Secret, else (S3 only) the environment.
func (o *InitOptions) credentials(ctx context.Context) error {
	st := o.Storage
	switch {
	case st.Filesystem != nil:
		return nil
	case o.WorkloadIdentity:
		if st.Azure != nil {
			return st.Azure.readWorkloadIdentity()
		}
		return nil // Kopia's S3 and GCS storage find the identity themselves
	case o.Velero != nil:
		return o.Velero.read(ctx, st)
	case st.S3 != nil:
		return st.S3.readEnv()
	}
	return errors.New("Google Cloud Storage and Azure Blob Storage need Velero's credentials (--credentials-secret) or --workload-identity")
}

// readEnv sets the credentials from the environment.
func (s *S3Location) readEnv() error {
	s.AccessKeyID = os.Getenv(storagecreds.AccessKeyID)
	s.SecretAccessKey = os.Getenv(storagecreds.SecretAccessKey)
	s.SessionToken = os.Getenv(storagecreds.SessionToken)
	if s.AccessKeyID == "" || s.SecretAccessKey == "" {
		return fmt.Errorf("environment variables %s and %s must be set for S3 storage", storagecreds.AccessKeyID, storagecreds.SecretAccessKey)
	}
	return nil
}

// readWorkloadIdentity sets the federated credential Azure Workload
// Identity's webhook put in the pod's environment.
func (a *AzureLocation) readWorkloadIdentity() error {
	a.TenantID = os.Getenv(storagecreds.AzureTenantID)
	a.ClientID = os.Getenv(storagecreds.AzureClientID)
	a.FederatedTokenFile = os.Getenv(storagecreds.AzureFederatedTokenFile)
	if a.TenantID == "" || a.ClientID == "" || a.FederatedTokenFile == "" {
		return fmt.Errorf("Azure Workload Identity gave this pod no %s, %s and %s: install its webhook, annotate the BSLS's podConfig.serviceAccount with azure.workload.identity/client-id (the server pod then carries the label azure.workload.identity/use=true), and federate the identity with the ServiceAccount",
			storagecreds.AzureTenantID, storagecreds.AzureClientID, storagecreds.AzureFederatedTokenFile)
	}
	return nil
}

// read sets st's credentials from a Velero credential Secret, in the
// format of st's provider.
func (v VeleroCredentials) read(ctx context.Context, st Storage) error {
	ctx, cancel := context.WithTimeout(ctx, veleroReadTimeout)
	defer cancel()
	secret, err := v.Client.CoreV1().Secrets(v.Namespace).Get(ctx, v.Name, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read Velero's credentials: %w", err)
	}
	data := secret.Data[v.Key]
	switch {
	case st.S3 != nil:
		st.S3.AccessKeyID, st.S3.SecretAccessKey, st.S3.SessionToken, err = storagecreds.ParseAWS(data, v.Profile)
	case st.GCS != nil:
		if err = storagecreds.CheckGCPKey(data); err == nil {
			st.GCS.CredentialsJSON = data
		}
	case st.Azure != nil:
		var c storagecreds.AzureCredentials
		if c, err = storagecreds.ParseAzure(data, v.AzureStorageKeyVariable); err == nil {
			st.Azure.StorageKey, st.Azure.TenantID, st.Azure.ClientID, st.Azure.ClientSecret = c.StorageKey, c.TenantID, c.ClientID, c.ClientSecret
		}
	}
	if err != nil {
		return fmt.Errorf("Secret %s/%s, key %s: %w", v.Namespace, v.Name, v.Key, err)
	}
	return nil
}

// ParsePolicy decodes the JSON of a BSLS's repository.defaultPolicy, as the
// controller passes it in --default-policy; "" is no policy.
func ParsePolicy(data string) (*v1alpha1.PolicySpec, error) {
	if data == "" {
		return nil, nil
	}
	p := &v1alpha1.PolicySpec{}
	if err := json.Unmarshal([]byte(data), p); err != nil {
		return nil, fmt.Errorf("default policy: %w", err)
	}
	return p, nil
}

// foreignACLsFile is where init leaves the foreign ACLs it removed, for the
// user-sync container (which shares the config folder) to report.
func foreignACLsFile(configFile string) string { return configFile + ".foreign-acls.json" }

// writeACLs writes guestbackup's access rules; on an append-only server it
// also makes the retention guests can trigger keep everything.
func writeACLs(ctx context.Context, out io.Writer, configFile, password string, appendOnly bool) error {
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
			fmt.Fprintln(out, "retention guests can trigger set to keep everything:", fixed)
		}
		if len(unreadable) > 0 {
			fmt.Fprintln(out, "policy manifests that do not parse were skipped:", unreadable)
		}
	}
	for _, f := range res.Foreign {
		fmt.Fprintln(out, "removed an ACL manifest guestbackup did not write:", f.String())
	}
	return writeJSON(foreignACLsFile(configFile), res.Foreign)
}

// TakeForeignACLs returns the foreign ACLs the init container removed
// before the server started, and forgets them, so that a restarted
// user-sync container does not report them again.
func TakeForeignACLs(configFile string) ([]kopiauser.ForeignACL, error) {
	var foreign []kopiauser.ForeignACL
	err := takeJSON(foreignACLsFile(configFile), &foreign)
	return foreign, err
}

// writeJSON writes v into the file name, for the user-sync container.
func writeJSON(name string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", name, err)
	}
	if err := os.WriteFile(name, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// takeJSON reads what writeJSON wrote into v and removes the file; a
// missing file leaves v as it is.
func takeJSON(name string, v any) error {
	data, err := os.ReadFile(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read %s: %w", name, err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if err := os.Remove(name); err != nil {
		return fmt.Errorf("remove %s: %w", name, err)
	}
	return nil
}
