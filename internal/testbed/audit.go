package testbed

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path/filepath"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// auditPolicy has the API server record, in its audit log, every request
// that may create one of KubeVirt's VirtualMachines or
// VirtualMachineInstances (a create, or a server-side apply, which is a
// patch), once, when it completes, and nothing else: the record of what
// KubeVirt's control plane must have seen (KubeVirt.Witnessed).
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: Metadata
  verbs: [create, patch]
  resources:
  - group: kubevirt.io
    resources: [virtualmachines, virtualmachineinstances]
- level: None
`

// configureAudit has env's API server write its audit log (auditPolicy) in
// dir, and returns the log's path.
func configureAudit(env *envtest.Environment, dir string) (string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		return "", err
	}
	log := filepath.Join(dir, "audit.log")
	args := env.ControlPlane.GetAPIServer().Configure()
	args.Set("audit-policy-file", policy)
	args.Set("audit-log-path", log)
	// Each event is written before the request's response completes.
	args.Set("audit-log-mode", "blocking")
	return log, nil
}

// Creation is an object the API server created, as its audit log records
// it.
type Creation struct {
	// Namespace and Name name the object.
	Namespace, Name string
	// User is who created it.
	User string
}

func (c Creation) String() string { return c.Namespace + "/" + c.Name + " (by " + c.User + ")" }

// Created lists, oldest first, every object of resource of the kubevirt.io
// group ("virtualmachines", "virtualmachineinstances") the API server
// created, by any client: each request the audit log records that ended
// in 201 Created, dry runs left out (they store nothing).
func (a *APIServer) Created(resource string) ([]Creation, error) {
	var out []Creation
	err := eachLine(a.AuditLog, func(line []byte) error {
		var e auditv1.Event
		if err := json.Unmarshal(line, &e); err != nil {
			return err
		}
		if e.Stage != auditv1.StageResponseComplete || e.ObjectRef == nil || e.ResponseStatus == nil {
			return nil
		}
		if e.ObjectRef.APIGroup != "kubevirt.io" || e.ObjectRef.Resource != resource || e.ObjectRef.Subresource != "" ||
			e.ResponseStatus.Code != http.StatusCreated || dryRun(e.RequestURI) {
			return nil
		}
		out = append(out, Creation{Namespace: e.ObjectRef.Namespace, Name: e.ObjectRef.Name, User: e.User.Username})
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // nothing audited yet
	}
	return out, err
}

// eachLine calls f with each line of the file at path, up to 1 MiB long,
// until f fails.
func eachLine(path string, f func(line []byte) error) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	s := bufio.NewScanner(file)
	s.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for s.Scan() {
		if err := f(s.Bytes()); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if err := s.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// dryRun reports whether a request's URI asks for a dry run.
func dryRun(requestURI string) bool {
	u, err := url.Parse(requestURI)
	return err == nil && u.Query().Has("dryRun")
}
