// Package deps holds each process to the code it may link: the webhook and
// the controller never open a Kopia repository, so they link none of
// Kopia's code; the server pod runs beside Kopia and links no cert-manager;
// the test bed stands apart from the code its tests prove. It also holds
// docs/architecture.md's package map to what `go list` says, and every
// tracked file to citing nothing a reader of the repository does not have.
package deps

import (
	"bufio"
	"bytes"
	"cmp"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

const module = "github.com/guestbackup/guestbackup"

// binaries are the programs guestbackup ships, by the name the package map
// gives the process each one is.
var binaries = map[string]string{
	"controller": module + "/cmd/controller",
	"webhook":    module + "/cmd/webhook",
	"server pod": module + "/cmd/server",
	// A restore Job (package restorejob) runs in the VM's namespace.
	"restore job": module + "/cmd/restore",
	// The kubectl plugin runs on the owner's or admin's machine.
	"kubectl plugin": module + "/cmd/kubectl-guestbackup",
}

// sourcesTracked makes go test's cache key this package's results on the
// module's Go sources: the cache sees only the files a test opens itself,
// not what `go list` read, so without it a cached pass would outlive a
// change that makes a binary link what it must not.
var sourcesTracked sync.Once

// goList runs `go list` with args and returns its fields.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	return strings.Fields(goListIn(t, "", nil, args...))
}

// goListIn runs `go list` with args in folder dir ("" for this one), with
// env added to this process's environment, and returns its output.
func goListIn(t *testing.T, dir string, env []string, args ...string) string {
	t.Helper()
	sourcesTracked.Do(func() { trackSources(t) })
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	cmd.Dir = dir
	if env != nil {
		cmd.Env = append(os.Environ(), env...)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list %s in %s: %v\n%s", strings.Join(args, " "), cmp.Or(dir, "."), err, stderr.String())
	}
	return string(out)
}

// trackSources stats every Go source and module file of the module, which
// go test records as inputs of the run.
func trackSources(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			_, err := os.ReadDir(path) // a package added or removed
			return err
		}
		if strings.HasSuffix(path, ".go") || d.Name() == "go.mod" || d.Name() == "go.sum" {
			_, err = os.Stat(path)
		}
		return err
	})
	if err != nil {
		t.Fatalf("track the module's sources: %v", err)
	}
}

// deps lists pkg and every package it links.
func deps(t *testing.T, pkg string) []string {
	return goList(t, "-deps", pkg)
}

func TestNoProcessLinksAnothersCode(t *testing.T) {
	for _, tt := range []struct {
		pkg string
		// forbidden are import path prefixes none of pkg's dependencies
		// may have.
		forbidden []string
	}{
		{binaries["webhook"], []string{"github.com/kopia/kopia/", module + "/pkg/kopiaserver", module + "/pkg/kopiauser", module + "/pkg/serverpod", module + "/pkg/credentials"}},
		{binaries["controller"], []string{"github.com/kopia/kopia/", module + "/pkg/kopiauser", module + "/pkg/serverpod", module + "/pkg/mutate"}},
		{binaries["restore job"], []string{"github.com/kopia/kopia/", "sigs.k8s.io/controller-runtime/pkg/client", "sigs.k8s.io/controller-runtime/pkg/manager", "k8s.io/client-go", module + "/pkg/kopiaserver", module + "/pkg/serverpod", module + "/pkg/credentials",
			module + "/pkg/mutate", module + "/pkg/audit", module + "/pkg/requests", module + "/pkg/requeststatus", module + "/internal/"}},
		{binaries["server pod"], []string{"github.com/cert-manager/", module + "/pkg/kopiaserver", module + "/pkg/mutate", module + "/pkg/credentials", module + "/pkg/audit", module + "/pkg/requeststatus"}},
		// The plugin only reads the API: none of the product's processes.
		{binaries["kubectl plugin"], []string{"github.com/kopia/kopia/", "github.com/cert-manager/", "kubevirt.io/", module + "/pkg/kopiaserver", module + "/pkg/serverpod", module + "/pkg/credentials",
			module + "/pkg/mutate", module + "/pkg/audit", module + "/pkg/requests", module + "/pkg/requeststatus", module + "/internal/controller", module + "/internal/webhook", module + "/internal/manager"}},
		// The harness proves the product: none of the code it proves may
		// be its own foundation (identity and pki are leaves it shares).
		{module + "/internal/testbed", []string{module + "/pkg/serverpod", module + "/pkg/kopiauser", module + "/pkg/kopiaserver", module + "/pkg/mutate", module + "/pkg/credentials", module + "/pkg/audit", module + "/pkg/cloudinit", module + "/internal/local", module + "/internal/controller", module + "/internal/webhook"}},
	} {
		t.Run(strings.TrimPrefix(tt.pkg, module+"/"), func(t *testing.T) {
			for _, dep := range deps(t, tt.pkg) {
				for _, f := range tt.forbidden {
					if dep == f || strings.HasPrefix(dep, strings.TrimSuffix(f, "/")+"/") {
						t.Errorf("%s links %s", tt.pkg, dep)
					}
				}
			}
		})
	}
}

// packageMap reads the package map of docs/architecture.md: each row's
// package and the processes it says run it.
func packageMap(t *testing.T) map[string][]string {
	t.Helper()
	root := goList(t, "-m", "-f", "{{.Dir}}")[0]
	data, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	in := false
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Package map"
		case in && strings.HasPrefix(line, "| `"):
			cells := strings.Split(line, "|")
			if len(cells) < 4 {
				t.Fatalf("package map row %q: want | package | runs in | what |", line)
			}
			pkg := strings.Trim(strings.TrimSpace(cells[1]), "`")
			var procs []string
			for p := range strings.SplitSeq(cells[2], ",") {
				procs = append(procs, strings.TrimSpace(p))
			}
			slices.Sort(procs)
			if _, dup := rows[pkg]; dup {
				t.Errorf("package map lists %s twice", pkg)
			}
			rows[pkg] = procs
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/architecture.md has no \"## Package map\" table")
	}
	return rows
}

// TestPackageMapMatchesGoList: every package of api/, cmd/, pkg/ and
// internal/ is in the map, and the map says which binaries link it; a
// package no binary links is the test bed's.
func TestPackageMapMatchesGoList(t *testing.T) {
	linkedBy := map[string][]string{}
	for name, bin := range binaries {
		for _, dep := range deps(t, bin) {
			linkedBy[dep] = append(linkedBy[dep], name)
		}
	}
	rows := packageMap(t)
	for _, pkg := range goList(t, module+"/api/...", module+"/cmd/...", module+"/pkg/...", module+"/internal/...") {
		name := strings.TrimPrefix(pkg, module+"/")
		got, ok := rows[name]
		if !ok {
			t.Errorf("the package map does not list %s", name)
			continue
		}
		delete(rows, name)
		want := linkedBy[pkg]
		if len(want) == 0 {
			want = []string{"test bed"}
		}
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("the package map says %s runs in %s; go list says %s", name, strings.Join(got, ", "), strings.Join(want, ", "))
		}
	}
	for name := range rows {
		t.Errorf("the package map lists %s, which go list does not know", name)
	}
}

// testToolsFile is where `make test WHAT=...` reads the tools each test
// package needs (hack/test.sh); hack/test-exec.sh grants each package only
// those, so a line that misses a tool fails in make test.
const testToolsFile = "hack/test-tools.txt"

// Every package whose tests link the test bed has its line in
// hack/test-tools.txt, and every line names a package with tests and tools
// hack/tools.sh knows: a package left out would be granted no tool at all.
func TestEveryTestBedPackageListsItsTools(t *testing.T) {
	root := goList(t, "-m", "-f", "{{.Dir}}")[0]
	data, err := os.ReadFile(filepath.Join(root, testToolsFile))
	if err != nil {
		t.Fatal(err)
	}
	listed := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if _, dup := listed[fields[0]]; dup {
			t.Errorf("%s lists %s twice", testToolsFile, fields[0])
		}
		if len(fields) == 1 {
			t.Errorf("%s: %s lists no tool: remove its line", testToolsFile, fields[0])
		}
		listed[fields[0]] = fields[1:]
	}
	// go list -test names each package's test binary <pkg>.test, and its
	// Deps are everything that binary links.
	const testbed = module + "/internal/testbed"
	names := map[string]bool{}
	// Test variants' import paths have a space ("p [p.test]"): one line
	// per package, not one field.
	out := goListIn(t, root, nil, "-test", "-f", `{{.ImportPath}}|{{join .Deps "|"}}`, "./...")
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		deps := strings.Split(line, "|")
		if !strings.HasSuffix(deps[0], ".test") {
			continue
		}
		pkg := strings.TrimPrefix(strings.TrimPrefix(strings.TrimSuffix(deps[0], ".test"), module), "/")
		links := slices.Contains(deps[1:], testbed)
		tools, ok := listed[pkg]
		delete(listed, pkg)
		switch {
		case links && !ok:
			t.Errorf("%s's tests link internal/testbed but %s has no line for it: list the tools they use", pkg, testToolsFile)
		case ok:
			for _, tool := range tools {
				names[tool] = true
			}
		}
	}
	for pkg := range listed {
		t.Errorf("%s lists %s, which has no tests", testToolsFile, pkg)
	}
	// hack/tools.sh refuses a name it does not know, and says which.
	cmd := exec.Command(filepath.Join(root, "hack", "tools.sh"), append([]string{"expand"}, slices.Sorted(maps.Keys(names))...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%s names a tool hack/tools.sh does not know: %v\n%s", testToolsFile, err, out)
	}
}

// sharedBuilds are the tool modules whose commands the test bed builds from
// source beside the main module, with the commands built: Go's build cache
// shares a package between two builds only when it and everything it
// imports are the same version, so a module at another version compiles
// again for every build that links it (minutes of a cold `make test` and
// `make demo` go to Kubernetes' and Kopia's packages). KubeVirt's own
// modules are the exception: the test bed runs KubeVirt's v1.8.1 control
// plane against the product's v1.9.0 API (see the module's go.mod).
var sharedBuilds = map[string][]string{
	"hack/tools/helm":           {"helm.sh/helm/v3/cmd/helm"},
	"hack/tools/kopia":          {"github.com/kopia/kopia"},
	"hack/tools/kube-apiserver": {"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-scheduler", "k8s.io/kubernetes/cmd/kube-controller-manager", "k8s.io/kubernetes/cmd/kubelet"},
	"hack/tools/kubectl":        {"."},
	"hack/tools/kubevirt":       {"kubevirt.io/kubevirt/cmd/virt-api", "kubevirt.io/kubevirt/cmd/virt-controller"},
}

// TestToolsBuildTheMainModulesVersions: every module a tool's build and
// the main module's packages and tests both link is at one version.
func TestToolsBuildTheMainModulesVersions(t *testing.T) {
	if testing.Short() {
		t.Skip("reads the tool modules' dependencies, which only a build of the tools downloads: make test runs it")
	}
	const format = `{{with .Module}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}`
	versions := func(dir string, env []string, args ...string) map[string]string {
		t.Helper()
		m := map[string]string{}
		for line := range strings.Lines(goListIn(t, dir, env, append([]string{"-deps", "-f", format}, args...)...)) {
			if path, version, ok := strings.Cut(strings.TrimSpace(line), " "); ok && version != "" {
				m[path] = version
			}
		}
		return m
	}
	root := goList(t, "-m", "-f", "{{.Dir}}")[0]
	main := versions(root, nil, "-test", "./...")
	for dir, cmds := range sharedBuilds {
		// GOSUMDB=off and -mod=readonly as hack/tools.sh builds them.
		tool := versions(filepath.Join(root, dir), []string{"GOSUMDB=off", "GOFLAGS=-mod=readonly"}, cmds...)
		for _, path := range slices.Sorted(maps.Keys(tool)) {
			want, shared := main[path]
			if !shared || tool[path] == want || strings.HasPrefix(path, "kubevirt.io/") {
				continue
			}
			t.Errorf("%s builds %s %s, the main module %s: require the higher in both (go get %s@<version> in each, then go mod tidy)", dir, path, tool[path], want, path)
		}
	}
}
