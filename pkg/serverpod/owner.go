package serverpod

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"

	"github.com/kopia/kopia/repo"
	"github.com/kopia/kopia/snapshot/policy"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/serverpod/maintenance"
)

// MaintenanceOptions make init claim the repository's maintenance for the
// BSLS's owner identity.
type MaintenanceOptions struct {
	// Namespace and BSLS name the owner (maintenance.Owner).
	Namespace, BSLS string
	Schedule        maintenance.Schedule
}

// MaintenanceConfigFile is where init writes the connection of the
// maintenance owner, beside the server's configFile. The Kopia server keeps
// the pod's identity, so it never runs maintenance itself; the user-sync
// container opens this one to run it.
func MaintenanceConfigFile(configFile string) string { return configFile + ".maintenance" }

// ClaimMaintenance connects MaintenanceConfigFile(configFile) to the
// repository in storage as the BSLS's maintenance owner and claims the
// repository's maintenance for it (maintenance.Claim). It returns what it
// did and the owner before.
func ClaimMaintenance(ctx context.Context, s Storage, configFile, password string, o MaintenanceOptions) (maintenance.Action, string, error) {
	st, err := s.open(ctx, false)
	if err != nil {
		return "", "", err
	}
	defer st.Close(ctx) //nolint:errcheck // read-mostly handle; errors surface on use
	user, host := maintenance.Owner(o.Namespace, o.BSLS)
	name := MaintenanceConfigFile(configFile)
	// A restarted init container finds the file of its previous run.
	if err := os.Remove(name); err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", "", fmt.Errorf("remove %s: %w", name, err)
	}
	err = repo.Connect(ctx, name, st, password, &repo.ConnectOptions{ClientOptions: repo.ClientOptions{Username: user, Hostname: host}})
	if err != nil {
		return "", "", fmt.Errorf("connect as the maintenance owner %s@%s: %w", user, host, err)
	}
	r, err := repo.Open(ctx, name, password, &repo.Options{})
	if err != nil {
		return "", "", fmt.Errorf("open repository as the maintenance owner: %w", err)
	}
	defer r.Close(ctx) //nolint:errcheck // the write session flushed what matters
	return maintenance.Claim(ctx, r, o.Schedule)
}

// ApplyPolicy makes the repository's global policy say what the admin's
// spec sets (retention, compression), leaving everything else as it is.
// On an append-only server the global retention stays guestbackup's "keep
// all" (package retention applies the admin's on the server's clock), so
// only compression is applied. It reports whether it changed the policy.
func ApplyPolicy(ctx context.Context, r repo.Repository, spec *v1alpha1.PolicySpec, appendOnly bool) (bool, error) {
	if spec == nil {
		return false, nil
	}
	current, err := policy.GetDefinedPolicy(ctx, r, policy.GlobalPolicySourceInfo)
	if errors.Is(err, policy.ErrPolicyNotFound) {
		current = policy.DefaultPolicy
	} else if err != nil {
		return false, fmt.Errorf("read the global policy: %w", err)
	}
	want := *current
	before := want.RetentionPolicy
	applyDefaults(&want, spec)
	if appendOnly || spec.Retention == nil {
		want.RetentionPolicy = before
	}
	if reflect.DeepEqual(want, *current) {
		return false, nil
	}
	err = repo.WriteSession(ctx, r, repo.WriteSessionOptions{Purpose: "guestbackup admin policy"},
		func(ctx context.Context, w repo.RepositoryWriter) error {
			return policy.SetPolicy(ctx, w, policy.GlobalPolicySourceInfo, &want)
		})
	if err != nil {
		return false, fmt.Errorf("set the global policy: %w", err)
	}
	return true, nil
}

// InitReport is what init did that the user-sync container reports as
// Events, through a file in the config folder they share.
type InitReport struct {
	// PolicyApplied: the global policy was changed to the admin's spec.
	PolicyApplied bool `json:"policyApplied,omitempty"`
	// MaintenanceAction and PreviousOwner: what init did with the
	// repository's maintenance owner, and the owner before.
	MaintenanceAction maintenance.Action `json:"maintenanceAction,omitempty"`
	PreviousOwner     string             `json:"previousOwner,omitempty"`
}

// ReasonPolicyApplied is the reason of the Normal Event on the BSLS when
// init changed the repository's global policy to the BSLS's defaultPolicy.
const ReasonPolicyApplied = "PolicyApplied"

// Events are the Events that tell the admin what init did.
func (rep InitReport) Events(owner string) []maintenance.Event {
	var events []maintenance.Event
	if rep.PolicyApplied {
		events = append(events, maintenance.Event{Reason: ReasonPolicyApplied,
			Message: "The repository's global policy now has the retention and compression of spec.repository.defaultPolicy"})
	}
	switch rep.MaintenanceAction {
	case maintenance.ActionClaim:
		was := "had none"
		if rep.PreviousOwner != "" {
			was = "was " + rep.PreviousOwner
		}
		events = append(events, maintenance.Event{Reason: maintenance.ReasonMaintenanceOwnerClaimed,
			Message: fmt.Sprintf("Repository maintenance is now owned and run by %s (it %s)", owner, was)})
	case maintenance.ActionLeave:
		events = append(events, maintenance.Event{Warning: true, Reason: maintenance.ReasonMaintenanceFailing,
			Message: fmt.Sprintf("Repository maintenance is owned by %s, not guestbackup: guestbackup does not take it, and storage grows unless they run it. Set the owner to %s (kopia maintenance set --owner) to let guestbackup run it, or set spec.repository.maintenance.disabled", rep.PreviousOwner, owner)})
	}
	return events
}

func initReportFile(configFile string) string { return configFile + ".init-report.json" }

func writeInitReport(configFile string, rep InitReport) error {
	return writeJSON(initReportFile(configFile), rep)
}

// TakeInitReport returns what init reported and forgets it, so that a
// restarted user-sync container does not report it again.
func TakeInitReport(configFile string) (InitReport, error) {
	var rep InitReport
	err := takeJSON(initReportFile(configFile), &rep)
	return rep, err
}
