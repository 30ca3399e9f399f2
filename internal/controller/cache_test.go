package controller_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	toolscache "k8s.io/client-go/tools/cache"
	kubevirtv1 "kubevirt.io/api/core/v1"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/controller"
	"github.com/guestbackup/guestbackup/pkg/audit"
	"github.com/guestbackup/guestbackup/pkg/credentials"
	"github.com/guestbackup/guestbackup/pkg/identity"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
	"github.com/guestbackup/guestbackup/pkg/mutate"
	"github.com/guestbackup/guestbackup/pkg/userset"
	"github.com/guestbackup/guestbackup/pkg/vmsecret"
)

var (
	server  = types.NamespacedName{Namespace: "backup", Name: "main"}
	created = metav1.NewTime(time.Date(2026, 11, 1, 10, 0, 0, 0, time.UTC))
	written = metav1.NewTime(created.Add(time.Hour))
)

// credentialSecret is VM vm's Secret as it is stored once the webhook
// wrote it (mutate.Decide, in mode, its real payload) and the controller
// adopted, hashed, rotated and announced it.
func credentialSecret(t *testing.T, vm, mode string) *corev1.Secret {
	t.Helper()
	ca, err := os.ReadFile(filepath.Join("..", "..", "pkg", "mutate", "testdata", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	obj := fmt.Sprintf(`{"metadata":{"name":%q,"namespace":"team-a","annotations":{%q:%q,%q:%q,%q:"/etc"}},"spec":{"template":{"spec":{"domain":{"devices":{}}}}}}`,
		vm, v1alpha1.AnnotationServer, server.String(), v1alpha1.AnnotationMode, mode, v1alpha1.AnnotationPaths)
	d, err := mutate.Decide(mutate.Input{
		Object: []byte(obj), Namespace: "team-a", NewPassword: mutate.NewPassword, Now: created.Time,
		Server: mutate.Server{NamespaceAllowed: true, BSLS: &v1alpha1.BackupStorageLocationServer{
			ObjectMeta: metav1.ObjectMeta{Namespace: server.Namespace, Name: server.Name},
			Status:     v1alpha1.BackupStorageLocationServerStatus{Endpoint: "https://main.backup.svc:51515", TLSCA: string(ca)},
		}},
	})
	if err != nil || d.Secret == nil {
		t.Fatalf("the webhook wrote no Secret: %v %s", err, d.Denied)
	}
	s := d.Secret
	s.UID, s.ResourceVersion, s.CreationTimestamp = "secret-uid", "42", created
	s.OwnerReferences = []metav1.OwnerReference{vmsecret.OwnerReference(vm, "vm-uid")}
	h, err := identity.NewHash("previous-password", identity.PBKDF2)
	if err != nil {
		t.Fatal(err)
	}
	vmsecret.SetPasswordHash(s, h.String())
	vmsecret.SetPreviousHash(s, &vmsecret.Previous{Hash: h.String(), Generation: "0", Server: server.String(), Since: created.Time})
	vmsecret.SetAnnounced(s, server.String(), "1")
	s.ManagedFields = []metav1.ManagedFieldsEntry{
		{Manager: "guestbackup-webhook", Operation: metav1.ManagedFieldsOperationUpdate, Time: &created, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:userdata":{}}}`)}},
		{Manager: "guestbackup-controller", Operation: metav1.ManagedFieldsOperationUpdate, Time: &written, FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:passwordHash":{}}}`)}},
	}
	return s
}

func trim(t *testing.T, f func(any) (any, error), in any) any {
	t.Helper()
	out, err := f(in)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestTrimSecretKeepsWhatTheReconcilersRead: of a credential Secret in
// either mode, the cache keeps every label, annotation, owner, credential
// and hash, and the times of its writes; the payload is gone. Every
// decision the controller takes from a cached Secret (the Hasher's, the VM
// reconciler's, the BSLS reconciler's users, the audit's) is the same on
// it as on the Secret as stored.
func TestTrimSecretKeepsWhatTheReconcilersRead(t *testing.T) {
	for _, mode := range []string{v1alpha1.ModeCloudInit, v1alpha1.ModeDisk} {
		t.Run(mode, func(t *testing.T) {
			stored := credentialSecret(t, "web", mode)
			cached := trim(t, controller.TrimSecret, stored.DeepCopy()).(*corev1.Secret)

			for k := range stored.Data {
				_, kept := cached.Data[k]
				if kept == vmsecret.IsPayloadKey(k) {
					t.Errorf("key %s: kept %v, payload %v", k, kept, vmsecret.IsPayloadKey(k))
				}
			}
			if len(cached.Data) == len(stored.Data) {
				t.Fatalf("nothing was trimmed of %v", slices.Collect(maps.Keys(stored.Data)))
			}
			for what, same := range map[string]bool{
				"labels":      maps.Equal(cached.Labels, stored.Labels),
				"annotations": maps.Equal(cached.Annotations, stored.Annotations),
				"owners":      equality.Semantic.DeepEqual(cached.OwnerReferences, stored.OwnerReferences),
				"hash":        equality.Semantic.DeepEqual(credentials.HashFor(cached), credentials.HashFor(stored)),
				"password":    vmsecret.Password(cached) == vmsecret.Password(stored) && vmsecret.Password(cached) != "",
				"username":    vmsecret.GuestUsername(cached) == vmsecret.GuestUsername(stored),
				"generation":  vmsecret.Generation(cached) == vmsecret.Generation(stored),
				"grace start": credentials.GraceStart(cached).Equal(credentials.GraceStart(stored)),
				"identity":    vmsecret.Identity(cached) == vmsecret.Identity(stored),
			} {
				if !same {
					t.Errorf("the cached Secret's %s differ from the stored one's", what)
				}
			}
			for i, mf := range cached.ManagedFields {
				if mf.FieldsV1 != nil || !mf.Time.Equal(stored.ManagedFields[i].Time) || mf.Manager != stored.ManagedFields[i].Manager {
					t.Errorf("managed fields entry %d: %+v, want the time and manager of %+v without fields", i, mf, stored.ManagedFields[i])
				}
			}

			vm := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
				Name: "web", Namespace: "team-a", UID: "vm-uid",
				Annotations: map[string]string{v1alpha1.AnnotationServer: server.String()},
			}}
			users := func(s *corev1.Secret) kopiaserver.UserSet {
				return kopiaserver.CollectUsers(kopiaserver.UserInputs{
					Server: server, Secrets: []corev1.Secret{*s},
					VMs:     map[types.NamespacedName]*metav1.PartialObjectMetadata{{Namespace: "team-a", Name: "web"}: vm},
					Allowed: func(string) bool { return true }, HashOf: credentials.HashFor, Now: written.Time,
				})
			}
			if got, want := users(cached), users(stored); !equality.Semantic.DeepEqual(got, want) || want.Count != 1 {
				t.Errorf("users from the cached Secret %+v, from the stored one %+v", got, want)
			}
			decide := func(s *corev1.Secret) audit.Decision {
				return audit.Decide(vm.Annotations, s.Annotations, nil, vmsecret.IssuedAt(s), written.Time, time.Hour)
			}
			if got, want := decide(cached), decide(stored); !equality.Semantic.DeepEqual(got, want) {
				t.Errorf("the audit decides %+v on the cached Secret, %+v on the stored one", got, want)
			}
		})
	}
}

// TestTrimSecretKeepsOtherSecretsData: a users Secret (and every other
// Secret of guestbackup's but the credential Secrets) keeps its data.
func TestTrimSecretKeepsOtherSecretsData(t *testing.T) {
	users := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: userset.SecretName("main", 3), Namespace: "backup", Labels: map[string]string{
			v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue, userset.Label: "main",
		}},
		Data: map[string][]byte{userset.Key: []byte("{}"), userset.GrantsKey: []byte("[]")},
	}
	cached := trim(t, controller.TrimSecret, users.DeepCopy()).(*corev1.Secret)
	if !equality.Semantic.DeepEqual(cached, users) {
		t.Errorf("the users Secret was changed: %+v", cached)
	}
}

// TestTrimVMKeepsGuestbackupsAnnotations: a VM (as the reconcilers watch
// it, metadata only) keeps its identity, generation, deletion and
// guestbackup's annotations; kubectl's copy of the whole VM and the managed
// fields go.
func TestTrimVMKeepsGuestbackupsAnnotations(t *testing.T) {
	now := metav1.Now()
	stored := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{
		Name: "web", Namespace: "team-a", UID: "vm-uid", Generation: 7, DeletionTimestamp: &now,
		Labels: map[string]string{"app": "web"},
		Annotations: map[string]string{
			v1alpha1.AnnotationServer: server.String(), v1alpha1.AnnotationStatus: `{"mode":"cloud-init"}`,
			v1alpha1.AnnotationRestoreFrom: "db", v1alpha1.AnnotationPaths: "/etc", v1alpha1.AnnotationSchedule: "daily",
			"kubectl.kubernetes.io/last-applied-configuration": `{"a whole":"VM"}`,
		},
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{}`)}}},
	}}
	cached := trim(t, controller.TrimVM, stored.DeepCopy()).(*metav1.PartialObjectMetadata)
	want := stored.DeepCopy()
	delete(want.Annotations, "kubectl.kubernetes.io/last-applied-configuration")
	want.ManagedFields = nil
	if !equality.Semantic.DeepEqual(cached, want) {
		t.Errorf("cached VM %+v, want %+v", cached.ObjectMeta, want.ObjectMeta)
	}
	again := trim(t, controller.TrimVM, cached.DeepCopy())
	if !equality.Semantic.DeepEqual(again, cached) {
		t.Error("trimming a trimmed VM changed it")
	}
}

// TestTrimInstanceKeepsWhatTheHasherAndTheAuditRead: a whole instance
// keeps its phase and phase times (so when its launcher started, and
// whether a rotation's previous password is kept), an instance's
// metadata its UID and times; nothing of the spec or the rest of the
// status.
func TestTrimInstanceKeepsWhatTheHasherAndTheAuditRead(t *testing.T) {
	scheduled := metav1.NewTime(created.Add(time.Minute))
	stored := &kubevirtv1.VirtualMachineInstance{
		ObjectMeta: metav1.ObjectMeta{
			Name: "web", Namespace: "team-a", UID: "vmi-uid", CreationTimestamp: created,
			Annotations:   map[string]string{"kubevirt.io/latest-observed-api-version": "v1"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "virt-handler"}},
		},
		Spec: kubevirtv1.VirtualMachineInstanceSpec{Hostname: "web", Domain: kubevirtv1.DomainSpec{Devices: kubevirtv1.Devices{Disks: []kubevirtv1.Disk{{Name: "root"}}}}},
		Status: kubevirtv1.VirtualMachineInstanceStatus{
			Phase: kubevirtv1.Running, NodeName: "node-1",
			PhaseTransitionTimestamps: []kubevirtv1.VirtualMachineInstancePhaseTransitionTimestamp{
				{Phase: kubevirtv1.Scheduled, PhaseTransitionTimestamp: scheduled},
			},
			Interfaces: []kubevirtv1.VirtualMachineInstanceNetworkInterface{{IP: "10.0.0.7"}},
		},
	}
	cached := trim(t, controller.TrimInstance, stored.DeepCopy()).(*kubevirtv1.VirtualMachineInstance)
	if !equality.Semantic.DeepEqual(cached.Spec, kubevirtv1.VirtualMachineInstanceSpec{}) || cached.Status.NodeName != "" || cached.Status.Interfaces != nil {
		t.Errorf("the instance's spec or other status stayed: %+v %+v", cached.Spec, cached.Status)
	}
	if cached.Annotations != nil || cached.ManagedFields != nil || cached.UID != stored.UID {
		t.Errorf("metadata %+v", cached.ObjectMeta)
	}
	gotStart, gotOK := credentials.LauncherStarted(cached)
	wantStart, wantOK := credentials.LauncherStarted(stored)
	if !gotStart.Equal(wantStart) || gotOK != wantOK || !gotOK {
		t.Errorf("launcher started %v %v from the cache, %v %v from the instance", gotStart, gotOK, wantStart, wantOK)
	}
	rotated := scheduled.Add(time.Hour)
	got, want := credentials.KeepPrevious(rotated, cached, rotated, time.Hour), credentials.KeepPrevious(rotated, stored, rotated, time.Hour)
	if got.Keep != want.Keep || got.Forced != want.Forced || !got.Until.Equal(want.Until) || got.Why != want.Why || !want.Keep {
		t.Errorf("a rotation keeps %+v from the cache, %+v from the instance", got, want)
	}

	meta := &metav1.PartialObjectMetadata{ObjectMeta: *stored.ObjectMeta.DeepCopy()}
	cachedMeta := trim(t, controller.TrimInstance, meta).(*metav1.PartialObjectMetadata)
	if cachedMeta.UID != stored.UID || !cachedMeta.CreationTimestamp.Equal(&stored.CreationTimestamp) || cachedMeta.Annotations != nil || cachedMeta.ManagedFields != nil {
		t.Errorf("instance metadata %+v", cachedMeta.ObjectMeta)
	}
	if again := trim(t, controller.TrimInstance, cached.DeepCopy()); !equality.Semantic.DeepEqual(again, cached) {
		t.Error("trimming a trimmed instance changed it")
	}
}

// TestTrimsLeaveOtherTypesAlone: a transform given an object of a type it
// does not trim returns it as it is.
func TestTrimsLeaveOtherTypesAlone(t *testing.T) {
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Annotations: map[string]string{"a": "b"}}}
	for name, f := range map[string]func(any) (any, error){"TrimSecret": controller.TrimSecret, "TrimVM": controller.TrimVM, "TrimInstance": controller.TrimInstance} {
		if out := trim(t, f, cm.DeepCopy()); !equality.Semantic.DeepEqual(out, cm) {
			t.Errorf("%s changed a ConfigMap: %+v", name, out)
		}
	}
}

// pages is a ListerWatcher that serves Secrets in pages, as an API server
// does for Limit and Continue, and records what it was asked.
type pages struct {
	secrets []corev1.Secret
	asked   []metav1.ListOptions
}

func (p *pages) List(opts metav1.ListOptions) (runtime.Object, error) {
	p.asked = append(p.asked, opts)
	from := 0
	if opts.Continue != "" {
		from, _ = strconv.Atoi(opts.Continue)
	}
	to := min(from+int(opts.Limit), len(p.secrets))
	if opts.Limit == 0 {
		to = len(p.secrets)
	}
	list := &corev1.SecretList{ListMeta: metav1.ListMeta{ResourceVersion: "77"}}
	for _, s := range p.secrets[from:to] {
		list.Items = append(list.Items, *s.DeepCopy())
	}
	if to < len(p.secrets) {
		list.Continue = strconv.Itoa(to)
	}
	return list, nil
}

func (p *pages) Watch(metav1.ListOptions) (watch.Interface, error) { return watch.NewFake(), nil }

// TestInformersListInTrimmedPages: an informer's list asks for pages of the
// latest version and keeps each object as its kind's trim does, all of
// them, as one list of the pages' version.
func TestInformersListInTrimmedPages(t *testing.T) {
	payloaded := credentialSecret(t, "web", v1alpha1.ModeCloudInit)
	lw := &pages{}
	for i := range 1234 {
		s := payloaded.DeepCopy()
		s.Name = vmsecret.Name(fmt.Sprintf("vm-%d", i))
		s.Labels[vmsecret.LabelVM] = fmt.Sprintf("vm-%d", i)
		lw.secrets = append(lw.secrets, *s)
	}
	informer := controller.NewInformer(lw, &corev1.Secret{}, 0, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go informer.RunWithContext(ctx)
	if !toolscache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		t.Fatal("the informer did not sync")
	}
	stored := informer.GetStore().List()
	if len(stored) != len(lw.secrets) {
		t.Fatalf("%d Secrets stored of %d", len(stored), len(lw.secrets))
	}
	for _, o := range stored {
		if s := o.(*corev1.Secret); s.Data[vmsecret.KeyUserData] != nil || vmsecret.Password(s) == "" {
			t.Fatalf("Secret %s stored with its payload or without its password", s.Name)
		}
	}
	if len(lw.asked) != 3 {
		t.Errorf("listed in %d pages, want 3 of at most 500", len(lw.asked))
	}
	for i, opts := range lw.asked {
		if opts.Limit != 500 || opts.ResourceVersion != "" || (i > 0) != (opts.Continue != "") {
			t.Errorf("page %d asked with %+v", i, opts)
		}
	}
}
