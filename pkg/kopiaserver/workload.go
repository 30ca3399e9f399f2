package kopiaserver

import (
	"encoding/json"
	"fmt"
	"maps"
	"path"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/clientdist"
	"github.com/guestbackup/guestbackup/pkg/kopiaenv"
	"github.com/guestbackup/guestbackup/pkg/maintenancestate"
	"github.com/guestbackup/guestbackup/pkg/serverargs"
	"github.com/guestbackup/guestbackup/pkg/storagecreds"
	"github.com/guestbackup/guestbackup/pkg/userset"
)

// Paths and ports inside a server pod. Listeners bind 0.0.0.0; the
// user-sync container reaches its server on 127.0.0.1.
const (
	KopiaBinary  = "/usr/local/bin/kopia"
	ServerBinary = "/usr/local/bin/guestbackup-server"
	// ClientBinaryARM64 is the arm64 kopia client the image carries for
	// guests (KopiaBinary is the amd64 one).
	ClientBinaryARM64 = "/usr/local/share/guestbackup/kopia-linux-arm64"

	configDir     = "/config"
	tlsDir        = "/tls"
	repositoryDir = "/repository"
	s3CADir       = "/s3-ca"

	// configFile is the repository connection init writes for the Kopia
	// server and user sync.
	configFile = configDir + "/repository.config"
	// chainFile is the TLS chain (leaf + CA) init writes, which the Kopia
	// server, the session gate and the client port present.
	chainFile = configDir + "/tls-chain.pem"
	// htpasswdFile is the Kopia server's --htpasswd-file, in the pod's
	// own volume: init creates it, user sync writes the credentials the
	// session gate hands the server for passwords it verified itself
	// (package logins).
	htpasswdFile = configDir + "/gate.htpasswd"
	tlsKeyFile   = tlsDir + "/tls.key"
	tlsCAFile    = tlsDir + "/ca.crt"

	// ControlUsername is the server-control user of every managed server.
	ControlUsername = "server-control"
	// HealthPort serves the user-sync container's /healthz and /readyz.
	HealthPort = 8082
	// KopiaLocalPort is where the Kopia server listens, on the pod's
	// loopback only: guests reach it through the user-sync container's
	// session gate on the server port (package sessiongate), which can end
	// the sessions of a user whose access is revoked.
	KopiaLocalPort = v1alpha1.DefaultServerPort + 2

	// AnnotationTLSChecksum on the pod template changes when the certificate
	// does: Kopia does not reload certificates, so a renewal rolls the pod.
	AnnotationTLSChecksum = "guestbackup.io/tls-checksum"
	// LabelBSLS names the BSLS a server object belongs to.
	LabelBSLS = "guestbackup.io/bsls"
	// LabelBSLSNamespace is the BSLS's namespace, on objects kept in
	// another namespace for it.
	LabelBSLSNamespace = "guestbackup.io/bsls-namespace"
)

// Names of the objects the controller keeps for a BSLS.
func DeploymentName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-server" }

// ServiceAccountName is the identity of the server pod (and of its Role).
func ServiceAccountName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-server" }

// TLSSecretName holds tls.crt, tls.key and ca.crt of the server.
func TLSSecretName(b *v1alpha1.BackupStorageLocationServer) string {
	if b.Spec.TLS.SecretName != "" {
		return b.Spec.TLS.SecretName
	}
	return b.Name + "-tls"
}

// ControlSecretName holds the server-control user's password (key "password").
func ControlSecretName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-control" }

// RepositoryPassword is where the repository password is read from.
func RepositoryPassword(b *v1alpha1.BackupStorageLocationServer) corev1.SecretKeySelector {
	if ref := b.Spec.Repository.PasswordSecretRef; ref != nil {
		sel := *ref
		if sel.Key == "" {
			sel.Key = "password"
		}
		return sel
	}
	return corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: b.Name + "-repository"}, Key: "password"}
}

// ClaimName is the PersistentVolumeClaim of a filesystem repository.
func ClaimName(b *v1alpha1.BackupStorageLocationServer) string {
	if fs := b.Spec.Storage.Filesystem; fs != nil && fs.ClaimName != "" {
		return fs.ClaimName
	}
	return b.Name + "-repository"
}

// Labels are on every object of a BSLS's server; the pod selector uses them.
func Labels(b *v1alpha1.BackupStorageLocationServer) map[string]string {
	return map[string]string{
		"app.kubernetes.io/name":     "guestbackup-server",
		"app.kubernetes.io/instance": b.Name,
		v1alpha1.LabelManagedBy:      v1alpha1.ManagedByValue,
		LabelBSLS:                    b.Name,
	}
}

// WorkloadInputs is what the reconciler resolved for the workload: things
// the BSLS does not say by itself.
type WorkloadInputs struct {
	// Image holds kopia and guestbackup-server.
	Image string
	// TLSChecksum identifies the certificate the pod was started with.
	TLSChecksum string
	// S3CredentialsSecret holds AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
	// (and optionally AWS_SESSION_TOKEN) for S3 storage.
	S3CredentialsSecret string
	// S3 is the bucket to use, from the BSLS or a Velero BSL.
	S3 *v1alpha1.S3Storage
	// S3CABundleConfigMap holds the S3 endpoint's CA bundle (key ca.crt),
	// when the endpoint has a private CA.
	S3CABundleConfigMap string
	// ActivityInterval is how often the server pod publishes its guests'
	// new snapshots (0 disables it).
	ActivityInterval time.Duration
	// GCS and Azure are the Google Cloud Storage bucket or Azure Blob
	// Storage container of a Velero BSL, instead of S3.
	GCS   *GCSBucket
	Azure *AzureContainer
	// VeleroCredentials, instead of S3CredentialsSecret, is a Velero
	// credential Secret the init container reads through the API.
	VeleroCredentials *VeleroCredentials
	// WorkloadIdentity, instead of either, gives the pod no static keys:
	// it reaches the storage as its ServiceAccount's cloud identity.
	WorkloadIdentity bool
	// PlatformAssignsIDs is true when the platform picks the pod's user and
	// fsGroup itself (OpenShift's SCC admission, see AssignsPodIDs): the pod
	// then names no fixed ID, which that admission would refuse.
	PlatformAssignsIDs bool
}

// ImageGroup is the group of the image's user (65532:65532, Dockerfile):
// the server pod's fsGroup where the platform assigns none.
const ImageGroup = 65532

// AnnotationSCCSupplementalGroups is set by OpenShift on every namespace:
// the range its SCC admission takes a pod's fsGroup from.
const AnnotationSCCSupplementalGroups = "openshift.io/sa.scc.supplemental-groups"

// AssignsPodIDs reports whether pods in ns get their user and fsGroup from
// the platform: OpenShift's restricted SCCs assign both from the
// namespace's range and refuse any other fixed value.
func AssignsPodIDs(ns *corev1.Namespace) bool {
	if ns == nil {
		return false
	}
	_, ok := ns.Annotations[AnnotationSCCSupplementalGroups]
	return ok
}

// podSecurityContext is the server pod's: non-root, and an fsGroup that
// the kubelet gives a fresh claim's root directory (usually root-owned
// 0755) and the TLS Secret's files, so that the image's user can write the
// repository and read its key. OnRootMismatch: a large repository is not
// walked again at every start once its root has the group. Where the
// platform assigns the fsGroup (OpenShift), it is left to it.
func podSecurityContext(in WorkloadInputs) *corev1.PodSecurityContext {
	sc := &corev1.PodSecurityContext{
		RunAsNonRoot:        ptr.To(true),
		SeccompProfile:      &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		FSGroupChangePolicy: ptr.To(corev1.FSGroupChangeOnRootMismatch),
	}
	if !in.PlatformAssignsIDs {
		sc.FSGroup = ptr.To[int64](ImageGroup)
	}
	return sc
}

// VeleroCredentials name a provider's credentials file in a Velero Secret.
type VeleroCredentials struct {
	Namespace, Secret, Key string
	// Profile is an AWS credentials file's profile.
	Profile string
	// AzureStorageKeyVariable names an Azure credentials file's storage
	// account key; empty means a service principal.
	AzureStorageKeyVariable string
}

// Azure Workload Identity's names: its webhook gives the federated token
// (and AZURE_CLIENT_ID, AZURE_TENANT_ID) to the pods carrying the label,
// and reads the client ID from their ServiceAccount's annotation.
const (
	AnnotationAzureClientID = "azure.workload.identity/client-id"
	LabelAzureUse           = "azure.workload.identity/use"
)

func secretEnv(name string, sel corev1.SecretKeySelector, optional bool) corev1.EnvVar {
	sel.Optional = ptr.To(optional)
	return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &sel}}
}

func secretKey(secret, key string) corev1.SecretKeySelector {
	return corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key}
}

// restricted is the container security context OpenShift's restricted SCC
// and Kubernetes' restricted Pod Security Standard both admit: no fixed UID.
func restricted() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		AllowPrivilegeEscalation: ptr.To(false),
		ReadOnlyRootFilesystem:   ptr.To(true),
		RunAsNonRoot:             ptr.To(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// Deployment is the server pod: an init container that prepares the
// repository and the TLS chain, the Kopia server as the supervised main
// container, on the pod's loopback, and the user-sync container beside it,
// whose session gate serves guests on the server port.
func Deployment(b *v1alpha1.BackupStorageLocationServer, in WorkloadInputs) (*appsv1.Deployment, error) {
	password := secretEnv(kopiaenv.RepositoryPassword, RepositoryPassword(b), false)
	control := secretEnv(kopiaenv.ControlPassword, secretKey(ControlSecretName(b), "password"), false)
	// Kopia keeps its caches and logs under HOME; the root filesystem is read-only.
	home := corev1.EnvVar{Name: "HOME", Value: configDir}
	noUpdates := corev1.EnvVar{Name: kopiaenv.CheckForUpdates, Value: "false"}

	volumes := []corev1.Volume{
		{Name: "config", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		// Group-readable: the kubelet makes the files root-owned with the
		// pod's fsGroup as group; 0400 would leave the key unreadable to
		// the image's user.
		{Name: "tls", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: TLSSecretName(b), DefaultMode: ptr.To[int32](0o440)}}},
	}
	configMount := corev1.VolumeMount{Name: "config", MountPath: configDir}
	tlsMount := corev1.VolumeMount{Name: "tls", MountPath: tlsDir, ReadOnly: true}
	initMounts := []corev1.VolumeMount{configMount, tlsMount}
	// serverMounts are the Kopia server's and the user sync's: the
	// repository configuration init writes names the storage by its path in
	// the pod, so a filesystem repository is mounted there in every
	// container.
	serverMounts := []corev1.VolumeMount{configMount, tlsMount}
	initEnv := []corev1.EnvVar{password, home, noUpdates}

	switch {
	case b.Spec.Storage.Filesystem != nil:
		volumes = append(volumes, corev1.Volume{Name: "repository", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: ClaimName(b)},
		}})
		repositoryMount := corev1.VolumeMount{Name: "repository", MountPath: repositoryDir}
		initMounts = append(initMounts, repositoryMount)
		serverMounts = append(serverMounts, repositoryMount)
	case in.S3 != nil:
		if in.S3CABundleConfigMap != "" {
			volumes = append(volumes, corev1.Volume{Name: "s3-ca", VolumeSource: corev1.VolumeSource{ConfigMap: &corev1.ConfigMapVolumeSource{
				LocalObjectReference: corev1.LocalObjectReference{Name: in.S3CABundleConfigMap},
				Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
			}}})
			initMounts = append(initMounts, corev1.VolumeMount{Name: "s3-ca", MountPath: s3CADir, ReadOnly: true})
		}
		if in.VeleroCredentials == nil && !in.WorkloadIdentity {
			initEnv = append(initEnv,
				secretEnv(storagecreds.AccessKeyID, secretKey(in.S3CredentialsSecret, storagecreds.AccessKeyID), false),
				secretEnv(storagecreds.SecretAccessKey, secretKey(in.S3CredentialsSecret, storagecreds.SecretAccessKey), false),
				secretEnv(storagecreds.SessionToken, secretKey(in.S3CredentialsSecret, storagecreds.SessionToken), true),
			)
		}
	case in.GCS != nil, in.Azure != nil:
		// Their credentials come from a Velero Secret, through the API,
		// or from the pod's cloud identity (initArgs).
	default:
		return nil, fmt.Errorf("BackupStorageLocationServer %s/%s: no storage to run a server on", b.Namespace, b.Name)
	}
	policy, err := defaultPolicy(b)
	if err != nil {
		return nil, err
	}

	labels := Labels(b)
	podLabels := labels
	if _, ok := b.Spec.PodConfig.ServiceAccount.Annotations[AnnotationAzureClientID]; ok {
		// Azure Workload Identity's webhook projects its token into
		// labelled pods only. Not in the selector: that is immutable.
		podLabels = maps.Clone(labels)
		podLabels[LabelAzureUse] = "true"
	}
	pod := corev1.PodSpec{
		ServiceAccountName: ServiceAccountName(b),
		SecurityContext:    podSecurityContext(in),
		InitContainers: []corev1.Container{{
			Name: "init", Image: in.Image,
			Command: []string{ServerBinary}, Args: initArgs(b, in, policy).Args(),
			Env: initEnv, VolumeMounts: initMounts,
			// Its last log lines say why the repository did not open; the
			// controller puts them in RepositoryReady.
			TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
			SecurityContext:          restricted(),
		}},
		Containers: []corev1.Container{
			{
				Name: "kopia", Image: in.Image,
				Command:      []string{KopiaBinary},
				Args:         kopiaServerArgs(b),
				Env:          []corev1.EnvVar{password, control, home, noUpdates},
				VolumeMounts: serverMounts,
				// No probe: the kubelet's reach the pod's address, not its
				// loopback. The user-sync container's readiness asks the
				// server's control API, and a server that exits is
				// restarted by the kubelet.
				Resources:       b.Spec.PodConfig.Resources,
				SecurityContext: restricted(),
			},
			{
				Name: "user-sync", Image: in.Image,
				Command: []string{ServerBinary},
				Args:    syncUsersArgs(b, in, policy).Args(),
				Env: []corev1.EnvVar{
					{Name: "POD_NAMESPACE", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
					password, control, home, noUpdates,
					// Its identity in the maintenance Lease, and the key
					// of its storage state (maintenancestate.StorageKey).
					{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				},
				Ports: []corev1.ContainerPort{
					{Name: "kopia", ContainerPort: v1alpha1.DefaultServerPort, Protocol: corev1.ProtocolTCP},
					{Name: "health", ContainerPort: HealthPort, Protocol: corev1.ProtocolTCP},
					{Name: clientdist.PortName, ContainerPort: clientdist.DefaultPort, Protocol: corev1.ProtocolTCP},
				},
				VolumeMounts: serverMounts,
				ReadinessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/readyz", Port: intstr.FromString("health")}},
					PeriodSeconds: 5,
				},
				LivenessProbe: &corev1.Probe{
					ProbeHandler:  corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromString("health")}},
					PeriodSeconds: 20, FailureThreshold: 3,
				},
				SecurityContext: restricted(),
			},
		},
		Volumes:           volumes,
		NodeSelector:      b.Spec.PodConfig.NodeSelector,
		Tolerations:       b.Spec.PodConfig.Tolerations,
		Affinity:          b.Spec.PodConfig.Affinity,
		PriorityClassName: b.Spec.PodConfig.PriorityClassName,
	}
	// One generation of server pods at a time, whatever the storage: each
	// pod's user sync rewrites the repository's users and access rules from
	// its own flags, so during a rolling update an old pod would keep
	// rewriting the old ones, for instance ACLs that let guests delete
	// snapshots for minutes after a switch to append-only. (A ReadWriteOnce
	// claim cannot be mounted by two pods at once either.) Guests retry
	// while the new pod starts.
	strategy := appsv1.DeploymentStrategy{Type: appsv1.RecreateDeploymentStrategyType}
	return &appsv1.Deployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{Name: DeploymentName(b), Namespace: b.Namespace, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Replicas: b.Spec.Replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Strategy: strategy,
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: podLabels, Annotations: map[string]string{AnnotationTLSChecksum: in.TLSChecksum}},
				Spec:       pod,
			},
		},
	}, nil
}

// kopiaLocalAddr is where the Kopia server listens: the pod's loopback.
var kopiaLocalAddr = "127.0.0.1:" + strconv.Itoa(KopiaLocalPort)

// defaultPolicy is b's repository.defaultPolicy as init and user sync
// read it: JSON, or empty for none.
func defaultPolicy(b *v1alpha1.BackupStorageLocationServer) (string, error) {
	p := b.Spec.Repository.DefaultPolicy
	if p == nil {
		return "", nil
	}
	data, err := json.Marshal(p)
	if err != nil {
		return "", fmt.Errorf("encode default policy: %w", err)
	}
	return string(data), nil
}

// initArgs is the init container's command line: b's storage as in
// resolved it, how to reach it, and the repository's access rules,
// default policy and maintenance. Deployment has checked that in names a
// storage.
func initArgs(b *v1alpha1.BackupStorageLocationServer, in WorkloadInputs, policy string) serverargs.Init {
	a := serverargs.NewInit()
	a.ConfigFile = configFile
	a.TLSCertFile = path.Join(tlsDir, "tls.crt")
	a.TLSCAFile = tlsCAFile
	a.ChainFile = chainFile
	a.HtpasswdFile = htpasswdFile
	// Access rules are written before the server starts, so that it
	// never serves under Kopia's legacy rules.
	a.AppendOnly = b.Spec.Access.AppendOnly
	switch {
	case b.Spec.Storage.Filesystem != nil:
		a.FilesystemPath = path.Join(repositoryDir, b.Spec.Repository.PathPrefix)
	case in.S3 != nil:
		a.S3Bucket, a.S3Prefix = in.S3.Bucket, repositoryPrefix(in.S3.Prefix, b)
		a.S3Endpoint, a.S3Region, a.S3DisableTLS = in.S3.Endpoint, in.S3.Region, in.S3.DisableTLS
		if in.S3CABundleConfigMap != "" {
			a.S3CAFile = path.Join(s3CADir, "ca.crt")
		}
	case in.GCS != nil:
		a.GCSBucket, a.GCSPrefix = in.GCS.Bucket, repositoryPrefix(in.GCS.Prefix, b)
	case in.Azure != nil:
		az := in.Azure
		a.AzureContainer, a.AzureStorageAccount, a.AzurePrefix = az.Container, az.StorageAccount, repositoryPrefix(az.Prefix, b)
		a.AzureStorageDomain, a.AzureDisableTLS = az.StorageDomain, az.DisableTLS
	}
	switch v := in.VeleroCredentials; {
	case in.WorkloadIdentity:
		a.WorkloadIdentity = true
	case v != nil:
		// A Secret in another namespace cannot be mounted: read it
		// through the API, as the service account's Role allows.
		a.CredentialsSecret, a.CredentialsKey = v.Namespace+"/"+v.Secret, v.Key
		if in.S3 != nil {
			a.CredentialsProfile = v.Profile
		}
		a.AzureStorageKeyVariable = v.AzureStorageKeyVariable
	}
	a.DefaultPolicy = policy
	// Maintenance: init claims the owner and sets the schedule; user sync
	// runs the cycles (package serverpod/maintenance).
	a.Namespace, a.BSLS = b.Namespace, b.Name
	m := b.Spec.Repository.Maintenance
	a.Maintenance = m == nil || !m.Disabled
	if m != nil && m.QuickInterval != nil {
		a.MaintenanceQuickInterval = m.QuickInterval.Duration
	}
	if m != nil && m.FullInterval != nil {
		a.MaintenanceFullInterval = m.FullInterval.Duration
	}
	return a
}

// syncUsersArgs is the user-sync container's command line.
func syncUsersArgs(b *v1alpha1.BackupStorageLocationServer, in WorkloadInputs, policy string) serverargs.SyncUsers {
	a := serverargs.NewSyncUsers()
	a.Namespace = "$(POD_NAMESPACE)"
	a.BSLS, a.BSLSUID = b.Name, string(b.UID)
	a.ConfigFile = configFile
	a.ServerURL = "https://" + kopiaLocalAddr
	a.ControlUsername = ControlUsername
	// Guests' sessions, through the gate (package sessiongate).
	a.GateAddr = "0.0.0.0:" + strconv.Itoa(v1alpha1.DefaultServerPort)
	a.CAFile = tlsCAFile
	a.HealthAddr = "0.0.0.0:" + strconv.Itoa(HealthPort)
	a.AppendOnly = b.Spec.Access.AppendOnly
	a.ActivityInterval = in.ActivityInterval
	m := b.Spec.Repository.Maintenance
	a.Maintenance = m == nil || !m.Disabled
	// The kopia client for guests (package clientserver).
	a.ClientAddr = "0.0.0.0:" + strconv.Itoa(clientdist.DefaultPort)
	a.ClientBinaries = map[string]string{"amd64": KopiaBinary, "arm64": ClientBinaryARM64}
	// Both ports present the server's own certificate.
	a.ChainFile, a.KeyFile = chainFile, tlsKeyFile
	a.HtpasswdFile = htpasswdFile
	// Several pods: the one holding the Lease runs maintenance, the pod's
	// name its identity there.
	if SharesMaintenance(b) {
		a.MaintenanceLease = maintenancestate.LeaseName(b.Name)
	}
	// Verification runs beside maintenance (package
	// serverpod/integrity); the pod's defaults are the API's.
	if m != nil && m.VerifyInterval != nil {
		a.VerifyInterval = m.VerifyInterval.Duration
	}
	if m != nil && m.VerifyReadBytes != nil {
		a.VerifyReadBytes = m.VerifyReadBytes.Value()
	}
	// The quotas themselves reach the pod in the users Secrets, so that
	// setting or changing one restarts nothing; only the cadence is an
	// argument.
	if q := b.Spec.Quota; q != nil && q.MeasureInterval != nil {
		a.QuotaInterval = q.MeasureInterval.Duration
	}
	// An append-only server applies its retention.
	a.DefaultPolicy = policy
	return a
}

// repositoryPrefix is where the repository's objects go in a bucket or
// container: under its prefix, then the BSLS's pathPrefix, as a folder.
func repositoryPrefix(prefix string, b *v1alpha1.BackupStorageLocationServer) string {
	if p := path.Join(prefix, b.Spec.Repository.PathPrefix); p != "" {
		return p + "/"
	}
	return ""
}

// Service is the server's Service; guests reach it by its DNS name unless
// the BSLS advertises a clientURL.
func Service(b *v1alpha1.BackupStorageLocationServer) *corev1.Service {
	port := b.Spec.Service.Port
	if port == 0 {
		port = v1alpha1.DefaultServerPort
	}
	svcType := b.Spec.Service.Type
	if svcType == "" {
		svcType = corev1.ServiceTypeClusterIP
	}
	return &corev1.Service{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{Name: ServiceName(b), Namespace: b.Namespace, Labels: Labels(b), Annotations: b.Spec.Service.Annotations},
		Spec: corev1.ServiceSpec{
			Type:     svcType,
			Selector: Labels(b),
			Ports: []corev1.ServicePort{
				{Name: "kopia", Port: port, TargetPort: intstr.FromString("kopia"), Protocol: corev1.ProtocolTCP},
				// The kopia client for guests, at the next port.
				{Name: clientdist.PortName, Port: clientdist.Port(port), TargetPort: intstr.FromString(clientdist.PortName), Protocol: corev1.ProtocolTCP},
			},
		},
	}
}

// ServerRole lets the server pod's user-sync container read its users
// Secrets, by name, publish its guests' activity and its maintenance runs
// and record Events on its BSLS, and nothing else: no other Secret of the namespace (the CA key, the
// repository password, other BSLSs' storage keys). The pods of a BSLS
// with several replicas also get MaintenanceRoleBinding. Kubernetes authorizes
// list and watch against resourceNames when the request selects
// metadata.name=<name>, which is how user sync watches each users Secret.
func ServerRole(b *v1alpha1.BackupStorageLocationServer) (*corev1.ServiceAccount, *rbacv1.Role, *rbacv1.RoleBinding) {
	name := ServiceAccountName(b)
	meta := metav1.ObjectMeta{Name: name, Namespace: b.Namespace, Labels: Labels(b)}
	sa := &corev1.ServiceAccount{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ServiceAccount"}, ObjectMeta: meta}
	// The admin's cloud identity for the pods (IRSA, GKE or Azure Workload
	// Identity); applied, so one removed from the BSLS goes too.
	sa.Annotations = b.Spec.PodConfig.ServiceAccount.Annotations
	names := make([]string, userset.Shards)
	for i := range names {
		names[i] = userset.SecretName(b.Name, i)
	}
	activityNames := publishedConfigMaps(b)
	// The repository's maintenance, published for the controller's status.
	activityNames = append(activityNames, maintenancestate.ConfigMapName(b.Name))
	role := &rbacv1.Role{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"},
		ObjectMeta: meta,
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch"}, ResourceNames: names},
			// The guests' activity and catalogues, published for the
			// controller's audit, and the repository's maintenance, for
			// the BSLS's status.
			{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "update"}, ResourceNames: activityNames},
			// Warning Events on the BSLS (ForeignACLRemoved). An Event's
			// name is generated, so it cannot be limited by name.
			{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		},
	}
	binding := &rbacv1.RoleBinding{
		TypeMeta:   metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"},
		ObjectMeta: meta,
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: b.Namespace}},
	}
	return sa, role, binding
}

// NetworkPolicy admits traffic to the server (and its client port) only from namespaces the BSLS
// allows (its own when it names none), from the controller's namespace and
// from the address ranges of access.clientIPBlocks: guests outside the pod
// network, which reach the server through a NodePort or LoadBalancer
// Service (clientURL), match no namespace, and an enforcing CNI drops them
// unless their (or their nodes') addresses are admitted.
func NetworkPolicy(b *v1alpha1.BackupStorageLocationServer, controllerNamespace string) *networkingv1.NetworkPolicy {
	allowed := b.Spec.Access.NamespaceSelector
	if allowed == nil {
		allowed = &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: b.Namespace}}
	}
	peers := []networkingv1.NetworkPolicyPeer{
		{NamespaceSelector: allowed},
		{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: controllerNamespace}}},
	}
	for _, block := range b.Spec.Access.ClientIPBlocks {
		peers = append(peers, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: block.CIDR, Except: block.Except}})
	}
	return &networkingv1.NetworkPolicy{
		TypeMeta:   metav1.TypeMeta{APIVersion: "networking.k8s.io/v1", Kind: "NetworkPolicy"},
		ObjectMeta: metav1.ObjectMeta{Name: DeploymentName(b), Namespace: b.Namespace, Labels: Labels(b)},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: Labels(b)},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{
					{Port: ptr.To(intstr.FromString("kopia")), Protocol: ptr.To(corev1.ProtocolTCP)},
					{Port: ptr.To(intstr.FromString(clientdist.PortName)), Protocol: ptr.To(corev1.ProtocolTCP)},
				},
				From: peers,
			}},
		},
	}
}

// ReplicaRefreshInterval is how often each server pod of a BSLS with
// several re-reads the repository's indexes and manifests (Kopia's
// --refresh-interval, 4 h by default). Replicas share one repository and
// each serves from what it last read: without it, a snapshot written
// through one pod stays unseen through another until something else
// refreshes it (docs/design.md, decision 26: seen through every replica within
// 5 s). Each refresh lists the repository's index blobs and reads the new
// ones; docs/operations.md gives its cost in storage requests.
const ReplicaRefreshInterval = 3 * time.Second

// kopiaServerArgs are the arguments of the kopia container's `kopia
// server start`.
func kopiaServerArgs(b *v1alpha1.BackupStorageLocationServer) []string {
	args := []string{
		"server", "start",
		"--config-file=" + configFile,
		// Loopback only: a session that bypassed the gate would outlive
		// its access.
		"--address=" + kopiaLocalAddr,
		"--tls-cert-file=" + chainFile,
		"--tls-key-file=" + tlsKeyFile,
		"--server-control-username=" + ControlUsername,
		// Checked before the repository's users, without their hash or
		// its mutex: the gate verified the password (docs/security.md).
		"--htpasswd-file=" + htpasswdFile,
		"--no-ui",
	}
	if SharesMaintenance(b) {
		// One pod needs no periodic refresh: every write is its own, and
		// user sync refreshes it after writing users and access rules.
		args = append(args, "--refresh-interval="+ReplicaRefreshInterval.String())
	}
	return args
}

// SharesMaintenance is whether b runs more than one server pod. Two pods
// running Kopia's maintenance at once can delete data the other is still
// rewriting, so such a BSLS's pods elect the one that runs it with the
// Lease maintenancestate.LeaseName (Kopia's own maintenance lock stays the
// safety net).
func SharesMaintenance(b *v1alpha1.BackupStorageLocationServer) bool {
	return b.Spec.Replicas != nil && *b.Spec.Replicas > 1
}
