package chart

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// permission is one verb on one resource granted to one subject in one
// scope: the unit in which docs/security.md ("Permissions") is compared
// with what the ServiceAccounts are actually granted.
type permission struct {
	subject, group, resource, verb, scope string
}

func (p permission) String() string {
	group := p.group
	if group == "" {
		group = "core"
	}
	return fmt.Sprintf("%s: %s %s/%s (%s)", p.subject, p.verb, group, p.resource, p.scope)
}

// Scopes, as the table writes them.
const (
	scopeCluster          = "cluster"
	scopeReleaseNamespace = "release namespace"
	scopeBSLSNamespace    = "BSLS namespace"
	scopeBSLSByName       = "BSLS namespace, by name"
	scopeVeleroByName     = "Velero namespace, by name"
	scopeBoundNamespace   = "each namespace where the built-in role is bound"
)

// documentedPermissions parses the table under "## Permissions" of
// docs/security.md: | subject | API group | resources | verbs | scope | code path |.
// Resources and verbs may list several, comma separated; "core" is the
// core API group; backticks are ignored. A row without a code path is an
// error: the table says why each permission exists.
func documentedPermissions(path string) ([]permission, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var perms []permission
	in, rows := false, 0
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		if strings.HasPrefix(line, "## ") {
			in = line == "## Permissions"
			continue
		}
		if !in || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "`", ""))
		}
		rows++
		if rows <= 2 { // the header and its separator
			continue
		}
		if len(cells) != 6 {
			return nil, fmt.Errorf("%s: a Permissions row has %d cells, not 6: %s", path, len(cells), line)
		}
		if cells[5] == "" {
			return nil, fmt.Errorf("%s: a Permissions row names no code path: %s", path, line)
		}
		group := cells[1]
		if group == "core" {
			group = ""
		}
		for _, resource := range splitList(cells[2]) {
			for _, verb := range splitList(cells[3]) {
				perms = append(perms, permission{subject: cells[0], group: group, resource: resource, verb: verb, scope: cells[4]})
			}
		}
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if rows == 0 {
		return nil, fmt.Errorf("%s has no table under \"## Permissions\"", path)
	}
	return perms, nil
}

func splitList(cell string) []string {
	var out []string
	for _, v := range strings.Split(cell, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// granted expands RBAC rules into permissions of subject in scope; rules
// with resource names take byName as their scope.
func granted(subject, scope, byName string, rules []rbacv1.PolicyRule) []permission {
	var perms []permission
	for _, r := range rules {
		sc := scope
		if len(r.ResourceNames) > 0 {
			sc = byName
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					perms = append(perms, permission{subject: subject, group: g, resource: res, verb: v, scope: sc})
				}
			}
		}
	}
	return perms
}

// aggregatePrefix is the label prefix by which a ClusterRole's rules are
// added to a built-in role (rbac.authorization.k8s.io/aggregate-to-edit).
const aggregatePrefix = "rbac.authorization.k8s.io/aggregate-to-"

// chartPermissions are the permissions the rendered chart binds to its
// ServiceAccounts, named by their component ("controller", "webhook"), and
// those it adds to the built-in roles (admin, edit, view) by aggregation,
// named "aggregated to <roles>": whoever a namespace binds those roles to
// holds them there.
func chartPermissions(r rendered) []permission {
	GinkgoHelper()
	var perms []permission
	for _, o := range r.ofKind("ClusterRole") {
		var to []string
		for k, v := range o.GetLabels() {
			if role, ok := strings.CutPrefix(k, aggregatePrefix); ok && v == "true" {
				to = append(to, role)
			}
		}
		if len(to) > 0 {
			slices.Sort(to)
			// "admin, edit and view", as the table writes it.
			subject := "aggregated to " + to[len(to)-1]
			if len(to) > 1 {
				subject = "aggregated to " + strings.Join(to[:len(to)-1], ", ") + " and " + to[len(to)-1]
			}
			perms = append(perms, granted(subject, scopeBoundNamespace, scopeBoundNamespace+", by name", as[rbacv1.ClusterRole](o).Rules)...)
		}
	}
	component := func(s rbacv1.Subject) string {
		Expect(s.Kind).To(Equal(rbacv1.ServiceAccountKind), "the chart binds only its ServiceAccounts")
		for _, c := range []string{"controller", "webhook"} {
			if strings.HasSuffix(s.Name, "-"+c) {
				return c
			}
		}
		Fail("the chart binds an unknown ServiceAccount " + s.Name)
		return ""
	}
	for _, o := range r.ofKind("ClusterRoleBinding") {
		b := as[rbacv1.ClusterRoleBinding](o)
		Expect(b.RoleRef.Kind).To(Equal("ClusterRole"))
		role := as[rbacv1.ClusterRole](r.find("ClusterRole", b.RoleRef.Name))
		for _, s := range b.Subjects {
			perms = append(perms, granted(component(s), scopeCluster, scopeCluster+", by name", role.Rules)...)
		}
	}
	for _, o := range r.ofKind("RoleBinding") {
		b := as[rbacv1.RoleBinding](o)
		var rules []rbacv1.PolicyRule
		switch b.RoleRef.Kind {
		case "Role":
			rules = as[rbacv1.Role](r.find("Role", b.RoleRef.Name)).Rules
		case "ClusterRole":
			rules = as[rbacv1.ClusterRole](r.find("ClusterRole", b.RoleRef.Name)).Rules
		}
		for _, s := range b.Subjects {
			perms = append(perms, granted(component(s), scopeReleaseNamespace, scopeReleaseNamespace+", by name", rules)...)
		}
	}
	return perms
}

// serverPermissions are what the controller grants a BSLS's server pod:
// kopiaserver.ServerRole in the BSLS's namespace; with several replicas,
// the chart's maintenance ClusterRole, which the controller of the
// rendered chart r binds there (kopiaserver.MaintenanceRoleBinding); and,
// for a Velero BSL, kopiaserver.VeleroAccessRole in Velero's.
func serverPermissions(r rendered) []permission {
	GinkgoHelper()
	b := &v1alpha1.BackupStorageLocationServer{
		ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup"},
		Spec: v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{
			BackupStorageLocation: &v1alpha1.BackupStorageLocationRef{Namespace: "velero", Name: "default"},
		}, Replicas: ptr.To[int32](2)},
	}
	sa, role, binding := kopiaserver.ServerRole(b)
	Expect(binding.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: b.Namespace}}))
	Expect(binding.RoleRef.Name).To(Equal(role.Name))
	perms := granted("server", scopeBSLSNamespace, scopeBSLSByName, role.Rules)

	var clusterRole string
	for _, arg := range as[appsv1.Deployment](r.find("Deployment", release+"-controller")).Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(arg, "--server-maintenance-cluster-role="); ok {
			clusterRole = v
		}
	}
	Expect(clusterRole).NotTo(BeEmpty(), "the controller is told which ClusterRole to bind")
	maintenance := kopiaserver.MaintenanceRoleBinding(b, clusterRole)
	Expect(maintenance.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: b.Namespace}}))
	perms = append(perms, granted("server", scopeBSLSNamespace, scopeBSLSByName, as[rbacv1.ClusterRole](r.find("ClusterRole", maintenance.RoleRef.Name)).Rules)...)
	vrole, vbinding := kopiaserver.VeleroAccessRole(b, kopiaserver.VeleroDefaultCredentialsSecret)
	Expect(vbinding.Subjects).To(Equal([]rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: sa.Name, Namespace: b.Namespace}}))
	Expect(vbinding.RoleRef.Name).To(Equal(vrole.Name))
	return append(perms, granted("server", "Velero namespace", scopeVeleroByName, vrole.Rules)...)
}

// difference is what a has and b has not, sorted, without repeats.
func difference(a, b []permission) []string {
	var out []string
	for _, p := range a {
		if !slices.Contains(b, p) {
			out = append(out, p.String())
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

var _ = Describe("docs/security.md's Permissions table", func() {
	It("lists every permission of every ServiceAccount and of every role aggregated to a built-in one, and nothing they are not granted", func() {
		documented, err := documentedPermissions(filepath.Join(repoRoot, "docs", "security.md"))
		Expect(err).NotTo(HaveOccurred())

		var actual []permission
		// RBAC is the same for every value set; render them all anyway, so
		// that a value that adds a rule cannot escape the table.
		for _, set := range valueSets {
			r := renderRelease(release, set.namespace, set.file)
			actual = append(actual, chartPermissions(r)...)
			actual = append(actual, serverPermissions(r)...)
		}
		Expect(actual).NotTo(BeEmpty())

		Expect(difference(actual, documented)).To(BeEmpty(), "granted but not documented in docs/security.md (## Permissions): add a row naming the code that needs it, or remove the rule")
		Expect(difference(documented, actual)).To(BeEmpty(), "documented in docs/security.md (## Permissions) but no longer granted: remove the row")
	})
})
