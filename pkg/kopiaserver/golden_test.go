package kopiaserver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/golden"
)

// goldenDir holds one directory per case: input.yaml, and a golden file
// per object the reconciler writes for it.
var goldenDir = filepath.Join("testdata", "golden")

// goldenInput is a case's input.yaml: a BSLS and what the reconciler
// would find besides it.
type goldenInput struct {
	// BSLS is the BackupStorageLocationServer.
	BSLS v1alpha1.BackupStorageLocationServer `json:"bsls"`
	// VeleroBSL is the Velero BackupStorageLocation the BSLS reuses.
	VeleroBSL map[string]any `json:"veleroBSL,omitempty"`
	// CertManagerCA is the reconciler's CertManagerCA; cert-manager is
	// served in every case.
	CertManagerCA bool `json:"certManagerCA,omitempty"`
	// Namespace is the BSLS's namespace as the reconciler finds it (its
	// annotations tell an OpenShift one); a plain one when absent.
	Namespace *corev1.Namespace `json:"namespace,omitempty"`
}

// renderServer is what the reconciler writes for in's BSLS, as desire
// decides it for a pass that found storage and certificate in place
// (Service, NetworkPolicy, Deployment; the server's identity has no golden
// file), and the cert-manager objects its certificate is issued with.
// Ownership and the API server's defaults are left to the envtest suite.
func renderServer(in goldenInput) ([]client.Object, error) {
	b := &in.BSLS
	var vs *VeleroStorage
	if in.VeleroBSL != nil {
		var err error
		if vs, err = ParseVeleroBSL(&unstructured.Unstructured{Object: in.VeleroBSL}); err != nil {
			return nil, err
		}
	}
	obs := observations{
		BSLS: b, ControllerNamespace: "guestbackup-system",
		Workload:    WorkloadInputs{Image: "guestbackup:golden", ActivityInterval: time.Minute, PlatformAssignsIDs: AssignsPodIDs(in.Namespace)},
		Certificate: &certificateResult{material: &tlsMaterial{Checksum: "golden-tls-checksum"}},
	}
	obs.Workload.setStorage(b, vs)
	want, err := desire(obs)
	if err != nil {
		return nil, err
	}
	var objs []client.Object
	for _, obj := range want.Objects {
		switch obj.(type) {
		case *corev1.Service, *networkingv1.NetworkPolicy, *appsv1.Deployment:
			objs = append(objs, obj)
		}
	}
	// cert-manager is served in every case; no CA Secret exists yet.
	return append(objs, certManagerObjects(b, chooseTLS(b, in.CertManagerCA, true), false)...), nil
}

// goldenYAML renders obj without the fields a builder never sets.
func goldenYAML(obj client.Object) ([]byte, error) {
	data, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	if md, ok := m["metadata"].(map[string]any); ok && md["creationTimestamp"] == nil {
		delete(md, "creationTimestamp")
	}
	delete(m, "status") // the API server's
	return yaml.Marshal(m)
}

// TestServerObjectsGolden compares what the reconciler's builders write
// for each case under testdata/golden with its golden files. A missing,
// different or orphaned golden fails; go test ./pkg/kopiaserver -run
// TestServerObjectsGolden -update rewrites them and removes orphans.
func TestServerObjectsGolden(t *testing.T) {
	for _, name := range golden.Cases(t, goldenDir) {
		t.Run(name, func(t *testing.T) {
			caseDir := filepath.Join(goldenDir, name)
			data, err := os.ReadFile(filepath.Join(caseDir, "input.yaml"))
			if err != nil {
				t.Fatalf("%v: a case directory without input.yaml is an orphan; remove it", err)
			}
			var in goldenInput
			if err := yaml.UnmarshalStrict(data, &in); err != nil {
				t.Fatalf("input.yaml: %v", err)
			}
			objs, err := renderServer(in)
			if err != nil {
				t.Fatal(err)
			}
			got := map[string][]byte{}
			for _, obj := range objs {
				if d, ok := obj.(*appsv1.Deployment); ok {
					checkServerPod(t, d, in.VeleroBSL != nil, AssignsPodIDs(in.Namespace))
				}
				rendered, err := goldenYAML(obj)
				if err != nil {
					t.Fatal(err)
				}
				kind := obj.GetObjectKind().GroupVersionKind().Kind
				if kind == "" {
					t.Fatalf("%T %s has no kind: a builder sets TypeMeta for server-side apply", obj, obj.GetName())
				}
				got[strings.ToLower(kind)+"-"+obj.GetName()+".yaml"] = rendered
			}
			golden.Check(t, caseDir, got, "input.yaml")
		})
	}
}

// checkServerPod asserts what must hold of every server pod, whatever a
// golden file says: containers a restricted Pod Security Standard admits,
// with no fixed UID (OpenShift's restricted SCC picks it); passwords and
// S3 keys by Secret reference only; no "/" as a bucket's prefix; and for a
// Velero BSL, no storage credential in the environment at all (the init
// container reads Velero's Secret through the API, or the pod has a
// workload identity). Volume ownership as a kubelet applies it: an fsGroup
// (the image's group, unless the platform assigns one) with OnRootMismatch,
// and Secret files its group can read.
func checkServerPod(t *testing.T, d *appsv1.Deployment, velero, platformIDs bool) {
	t.Helper()
	spec := d.Spec.Template.Spec
	switch psc := spec.SecurityContext; {
	case psc == nil:
		t.Errorf("the pod has no securityContext")
	case psc.RunAsUser != nil || psc.RunAsGroup != nil:
		t.Errorf("the pod fixes its user or group: the image's user runs, or the one OpenShift assigns")
	case platformIDs && psc.FSGroup != nil:
		t.Errorf("fsGroup %d where OpenShift assigns it from the namespace's range", *psc.FSGroup)
	case !platformIDs && (psc.FSGroup == nil || *psc.FSGroup != ImageGroup):
		t.Errorf("fsGroup %v, want the image's group %d: a fresh claim's root is root-owned", psc.FSGroup, ImageGroup)
	case psc.FSGroupChangePolicy == nil || *psc.FSGroupChangePolicy != corev1.FSGroupChangeOnRootMismatch:
		t.Errorf("fsGroupChangePolicy %v, want OnRootMismatch", psc.FSGroupChangePolicy)
	}
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil {
			// Init writes the claim's path into the repository
			// configuration the other containers open.
			for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
				if !slices.ContainsFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == v.Name }) {
					t.Errorf("container %s does not mount the repository's claim (volume %s)", c.Name, v.Name)
				}
			}
		}
		if v.Secret != nil && (v.Secret.DefaultMode == nil || *v.Secret.DefaultMode&0o040 == 0) {
			t.Errorf("Secret volume %s: mode %v: its files are root's; the fsGroup must read them", v.Name, v.Secret.DefaultMode)
		}
	}
	if c := spec.Containers[0]; c.Name != "kopia" || !slices.Equal(c.Command, []string{KopiaBinary}) {
		t.Errorf("the first container is %s running %v, want kopia running %s", c.Name, c.Command, KopiaBinary)
	}
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		sc := c.SecurityContext
		switch {
		case sc == nil:
			t.Errorf("container %s: no securityContext", c.Name)
			continue
		case sc.RunAsUser != nil:
			t.Errorf("container %s: runAsUser %d: OpenShift assigns the UID", c.Name, *sc.RunAsUser)
		case sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem,
			sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation,
			sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot,
			sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}):
			t.Errorf("container %s: securityContext %+v is not restricted", c.Name, sc)
		}
		for _, e := range c.Env {
			secret := strings.Contains(e.Name, "PASSWORD") || strings.HasPrefix(e.Name, "AWS_")
			if secret && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
				t.Errorf("container %s: %s is not taken from a Secret by reference", c.Name, e.Name)
			}
			if velero && (strings.HasPrefix(e.Name, "AWS_") || strings.HasPrefix(e.Name, "AZURE_") || strings.HasPrefix(e.Name, "GOOGLE_")) {
				t.Errorf("container %s: %s in the environment of a server on a Velero BSL", c.Name, e.Name)
			}
		}
		if slices.Contains(c.Args, "--workload-identity") {
			for _, arg := range c.Args {
				if strings.HasPrefix(arg, "--credentials-") {
					t.Errorf("container %s: %s under workload identity", c.Name, arg)
				}
			}
			for _, e := range c.Env {
				if !strings.Contains(e.Name, "PASSWORD") && e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
					t.Errorf("container %s: %s from Secret %s under workload identity", c.Name, e.Name, e.ValueFrom.SecretKeyRef.Name)
				}
			}
		}
		for _, arg := range c.Args {
			if strings.HasPrefix(arg, "--s3-prefix=/") || strings.HasPrefix(arg, "--gcs-prefix=/") || strings.HasPrefix(arg, "--azure-prefix=/") {
				t.Errorf("container %s: %s: Kopia would write its objects under /", c.Name, arg)
			}
		}
	}
}
