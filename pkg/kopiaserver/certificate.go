package kopiaserver

import (
	"context"
	"fmt"
	"time"

	certmanagerv1 "github.com/cert-manager/cert-manager/pkg/apis/certmanager/v1"
	cmmeta "github.com/cert-manager/cert-manager/pkg/apis/meta/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	certutil "k8s.io/client-go/util/cert"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// The Issuers of a BSLS's own CA (certManagerCA), written by server-side
// apply.
// +kubebuilder:rbac:groups=cert-manager.io,resources=issuers,verbs=create;patch

// CertificateName is the cert-manager Certificate of a BSLS's server.
func CertificateName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-server" }

// certificateResult is what the certificate step found.
type certificateResult struct {
	material *tlsMaterial
	// source describes where the certificate comes from, for messages.
	source string
	// renewAt is when the certificate must be looked at again: a
	// self-managed leaf's renewal, or a CA rotation's next look at the
	// guests it waits for.
	renewAt time.Time
	// rotation is the CA rotation under way (status.caRotation); nil when
	// none.
	rotation *v1alpha1.CARotationStatus
}

// tlsSource is where a BSLS's server certificate comes from.
type tlsSource int

const (
	// tlsAdminSecret: tls.secretName, the admin's own Secret.
	tlsAdminSecret tlsSource = iota
	// tlsAdminIssuer: tls.issuerRef, the admin's cert-manager issuer.
	tlsAdminIssuer
	// tlsOwnCertManagerCA: a CA of the BSLS's own, issued by cert-manager.
	tlsOwnCertManagerCA
	// tlsOwnControllerCA: a CA of the BSLS's own, issued by the controller.
	tlsOwnControllerCA
)

// chooseTLS decides where b's certificate comes from. An admin's Secret or
// issuer is their choice, and shares trust with whatever else it signs;
// otherwise each BSLS gets a CA of its own (docs/design.md, decision 13), from
// cert-manager when the controller is asked to use it and it is served.
func chooseTLS(b *v1alpha1.BackupStorageLocationServer, certManagerCA, certManagerServed bool) tlsSource {
	switch {
	case b.Spec.TLS.SecretName != "":
		return tlsAdminSecret
	case b.Spec.TLS.IssuerRef != nil:
		return tlsAdminIssuer
	case certManagerCA && certManagerServed:
		return tlsOwnCertManagerCA
	}
	return tlsOwnControllerCA
}

// certificate makes sure the server's certificate Secret exists and checks
// it, in whichever way chooseTLS picks.
func (r *Reconciler) certificate(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*certificateResult, *problem, error) {
	switch chooseTLS(b, r.CertManagerCA, r.CertManager) {
	case tlsAdminSecret:
		s, p, err := r.tlsSecret(ctx, b, "create a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt, or remove tls.secretName")
		if s == nil {
			return nil, p, err
		}
		m, p := checkTLSSecret(s, EndpointHost(b))
		return &certificateResult{material: m, source: "Secret " + b.Spec.TLS.SecretName}, p, nil
	case tlsAdminIssuer:
		return r.certManagerCertificate(ctx, b, b.Spec.TLS.IssuerRef, "")
	case tlsOwnCertManagerCA:
		iss, err := r.certManagerCA(ctx, b)
		if err != nil {
			return nil, nil, err
		}
		if err := r.refuseRotation(ctx, b); err != nil {
			return nil, nil, err
		}
		return r.certManagerCertificate(ctx, b, iss, fmt.Sprintf("its own CA in Secret %s, through cert-manager Issuer %s", CASecretName(b), iss.Name))
	}
	return r.selfManagedCertificate(ctx, b)
}

// selfSignedIssuerName is the cert-manager Issuer that signs a BSLS's own
// CA Certificate.
func selfSignedIssuerName(b *v1alpha1.BackupStorageLocationServer) string {
	return b.Name + "-selfsigned"
}

// CAIssuerName is the cert-manager CA Issuer, backed by Secret <bsls>-ca,
// that signs the server's certificate of a BSLS with a CA of its own.
func CAIssuerName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-ca" }

// CACertificateName is the cert-manager Certificate of a BSLS's own CA; it
// writes Secret <bsls>-ca.
func CACertificateName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-ca" }

// certManagerAnnotationCertificate is the annotation cert-manager puts on
// every Secret it writes for a Certificate.
const certManagerAnnotationCertificate = "cert-manager.io/certificate-name"

// certManagerCA makes cert-manager keep a CA of b's own in its namespace: a
// selfSigned Issuer signs the CA Certificate, whose Secret <bsls>-ca backs a
// CA Issuer that signs the server. It returns that CA Issuer.
//
// The CA Certificate has no ownerReference and carries AnnotationKeep, like
// the controller's own CA (same Secret, same key format): deleting or
// re-creating the BSLS, or switching between cert-manager and the
// controller, keeps the CA and so the guests' pin. A CA Secret the
// controller issued before is used as it is rather than re-issued by a
// Certificate, for the same reason.
func (r *Reconciler) certManagerCA(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*v1alpha1.IssuerReference, error) {
	existing := &corev1.Secret{}
	err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: CASecretName(b)}, existing)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("get Secret %s: %w", CASecretName(b), err)
	}
	controllersCA := err == nil && existing.Annotations[certManagerAnnotationCertificate] == "" && len(existing.Data[corev1.TLSCertKey]) > 0
	objs := certManagerObjects(b, tlsOwnCertManagerCA, controllersCA)
	// The last is the server's Certificate, which certManagerCertificate
	// applies and reads the status of.
	for _, obj := range objs[:len(objs)-1] {
		if obj.GetAnnotations()[AnnotationKeep] == "" {
			if err := r.apply(ctx, b, obj); err != nil {
				return nil, err
			}
			continue
		}
		// Not r.apply: what is kept has no ownerReference, see above.
		if err := r.Client.Patch(ctx, obj, client.Apply, client.FieldOwner(FieldOwner), client.ForceOwnership); err != nil { //nolint:staticcheck // see apply
			return nil, fmt.Errorf("apply %T %s/%s: %w", obj, b.Namespace, obj.GetName(), err)
		}
	}
	return ownCAIssuerRef(b), nil
}

// certManagerObjects are the cert-manager objects that issue b's
// certificate from src, in the order they are applied: none for a Secret
// (the admin's, or the controller's own CA); the server's Certificate from
// the admin's issuer; or, for a CA of b's own, its selfSigned Issuer and
// CA Certificate (unless controllersCA: Secret <bsls>-ca holds a CA the
// controller issued, kept as it is), its CA Issuer, and the server's
// Certificate from it. Those carrying AnnotationKeep get no
// ownerReference.
func certManagerObjects(b *v1alpha1.BackupStorageLocationServer, src tlsSource, controllersCA bool) []client.Object {
	switch src {
	case tlsAdminIssuer:
		return []client.Object{servingCertificate(b, b.Spec.TLS.IssuerRef)}
	case tlsOwnCertManagerCA:
		selfSigned, ca := ownCAIssuers(b)
		var objs []client.Object
		if !controllersCA {
			objs = append(objs, selfSigned, caCertificate(b))
		}
		return append(objs, ca, servingCertificate(b, ownCAIssuerRef(b)))
	case tlsAdminSecret, tlsOwnControllerCA:
		// Secrets, checked or issued by the controller.
	}
	return nil
}

// ownCAIssuerRef refers to the CA Issuer of b's own CA (ownCAIssuers).
func ownCAIssuerRef(b *v1alpha1.BackupStorageLocationServer) *v1alpha1.IssuerReference {
	return &v1alpha1.IssuerReference{Name: CAIssuerName(b), Kind: certmanagerv1.IssuerKind, Group: certmanagerv1.SchemeGroupVersion.Group}
}

// ownCAIssuers are the cert-manager Issuers of b's own CA: a selfSigned
// Issuer that signs the CA Certificate, and a CA Issuer, backed by the CA's
// Secret, that signs the server's certificate.
func ownCAIssuers(b *v1alpha1.BackupStorageLocationServer) (selfSigned, ca *certmanagerv1.Issuer) {
	issuer := func(name string, cfg certmanagerv1.IssuerConfig) *certmanagerv1.Issuer {
		return &certmanagerv1.Issuer{
			TypeMeta:   metav1.TypeMeta{APIVersion: certmanagerv1.SchemeGroupVersion.String(), Kind: certmanagerv1.IssuerKind},
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.Namespace, Labels: Labels(b)},
			Spec:       certmanagerv1.IssuerSpec{IssuerConfig: cfg},
		}
	}
	return issuer(selfSignedIssuerName(b), certmanagerv1.IssuerConfig{SelfSigned: &certmanagerv1.SelfSignedIssuer{}}),
		issuer(CAIssuerName(b), certmanagerv1.IssuerConfig{CA: &certmanagerv1.CAIssuer{SecretName: CASecretName(b)}})
}

// caCertificate is the cert-manager Certificate of b's own CA. It carries
// AnnotationKeep, and the reconciler gives it no ownerReference.
func caCertificate(b *v1alpha1.BackupStorageLocationServer) *certmanagerv1.Certificate {
	keep := map[string]string{AnnotationKeep: "the CA that guests of BackupStorageLocationServer " + b.Name + " pin; not deleted with it"}
	return &certmanagerv1.Certificate{
		TypeMeta:   metav1.TypeMeta{APIVersion: certmanagerv1.SchemeGroupVersion.String(), Kind: "Certificate"},
		ObjectMeta: metav1.ObjectMeta{Name: CACertificateName(b), Namespace: b.Namespace, Labels: Labels(b), Annotations: keep},
		Spec: certmanagerv1.CertificateSpec{
			IsCA:       true,
			CommonName: b.Namespace + "/" + b.Name + " guestbackup CA",
			SecretName: CASecretName(b),
			Duration:   &metav1.Duration{Duration: selfManagedCALifetime},
			// PKCS#8, as the controller writes its own CA: either can
			// take over the other's Secret.
			PrivateKey: &certmanagerv1.CertificatePrivateKey{
				Algorithm: certmanagerv1.ECDSAKeyAlgorithm, Size: 256, Encoding: certmanagerv1.PKCS8,
				RotationPolicy: certmanagerv1.RotationPolicyNever,
			},
			IssuerRef:      cmmeta.ObjectReference{Name: selfSignedIssuerName(b), Kind: certmanagerv1.IssuerKind, Group: certmanagerv1.SchemeGroupVersion.Group},
			SecretTemplate: &certmanagerv1.CertificateSecretTemplate{Labels: certManagerSecretLabels(b), Annotations: keep},
		},
	}
}

// tlsSecret reads the serving certificate Secret; a missing one is a
// problem whose message ends with fix.
func (r *Reconciler) tlsSecret(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, fix string) (*corev1.Secret, *problem, error) {
	s := &corev1.Secret{}
	name := TLSSecretName(b)
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &problem{ReasonTLSSecretNotFound, fmt.Sprintf("Secret %s not found in namespace %s: %s", name, b.Namespace, fix)}, nil
		}
		return nil, nil, fmt.Errorf("get Secret %s: %w", name, err)
	}
	return s, nil, nil
}

// servingCertificate is the cert-manager Certificate of b's server, issued
// by iss (kind ClusterIssuer and group cert-manager.io unless it says
// otherwise) for the names guests and the Service use.
func servingCertificate(b *v1alpha1.BackupStorageLocationServer, iss *v1alpha1.IssuerReference) *certmanagerv1.Certificate {
	kind, group := iss.Kind, iss.Group
	if kind == "" {
		kind = certmanagerv1.ClusterIssuerKind
	}
	if group == "" {
		group = certmanagerv1.SchemeGroupVersion.Group
	}
	dnsNames, ips := ServingNames(b)
	ipStrings := make([]string, len(ips))
	for i, ip := range ips {
		ipStrings[i] = ip.String()
	}
	return &certmanagerv1.Certificate{
		TypeMeta:   metav1.TypeMeta{APIVersion: certmanagerv1.SchemeGroupVersion.String(), Kind: "Certificate"},
		ObjectMeta: metav1.ObjectMeta{Name: CertificateName(b), Namespace: b.Namespace, Labels: Labels(b)},
		Spec: certmanagerv1.CertificateSpec{
			SecretName:     TLSSecretName(b),
			CommonName:     dnsNames[0],
			DNSNames:       dnsNames,
			IPAddresses:    ipStrings,
			Usages:         []certmanagerv1.KeyUsage{certmanagerv1.UsageServerAuth, certmanagerv1.UsageDigitalSignature, certmanagerv1.UsageKeyEncipherment},
			PrivateKey:     &certmanagerv1.CertificatePrivateKey{Algorithm: certmanagerv1.ECDSAKeyAlgorithm, Size: 256, RotationPolicy: certmanagerv1.RotationPolicyAlways},
			IssuerRef:      cmmeta.ObjectReference{Name: iss.Name, Kind: kind, Group: group},
			SecretTemplate: &certmanagerv1.CertificateSecretTemplate{Labels: certManagerSecretLabels(b)},
		},
	}
}

// certManagerCertificate has cert-manager issue the server's certificate
// from iss; source describes it in messages (default: the issuer's kind
// and name).
func (r *Reconciler) certManagerCertificate(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, iss *v1alpha1.IssuerReference, source string) (*certificateResult, *problem, error) {
	cert := servingCertificate(b, iss)
	if source == "" {
		source = fmt.Sprintf("cert-manager %s %s", cert.Spec.IssuerRef.Kind, iss.Name)
	}
	if !r.CertManager {
		return nil, &problem{ReasonCertManagerMissing, fmt.Sprintf("tls.issuerRef names %s, but cert-manager's Certificate CRD is not installed: install cert-manager, or remove tls.issuerRef so that the controller issues the certificate from a CA of its own", source)}, nil
	}
	if err := r.apply(ctx, b, cert); err != nil {
		return nil, nil, err
	}
	pending := func(why string) *problem {
		return &problem{ReasonCertificatePending, fmt.Sprintf("Certificate %s from %s is not issued yet: %s", cert.Name, source, why)}
	}
	s, _, err := r.tlsSecret(ctx, b, "")
	if err != nil {
		return nil, nil, err
	}
	if err := r.releaseToCertManager(ctx, s); err != nil {
		return nil, nil, err
	}
	if s == nil {
		why := "no Secret " + TLSSecretName(b) + " yet"
		for _, c := range cert.Status.Conditions {
			if c.Type == certmanagerv1.CertificateConditionReady && c.Message != "" {
				why = c.Message
			}
		}
		return nil, pending(why), nil
	}
	// A Secret issued earlier stays usable while cert-manager renews it.
	if _, _, p := checkTLSStructure(s); p != nil {
		p.Message += fmt.Sprintf(" (the Secret is written by %s: does the issuer publish its CA in ca.crt?)", source)
		return nil, p, nil
	}
	// A new clientURL host is in the Certificate, not yet in its Secret.
	m, p := checkTLSSecret(s, EndpointHost(b))
	if p != nil {
		return nil, pending(fmt.Sprintf("the certificate in Secret %s is not valid for %s yet", s.Name, EndpointHost(b))), nil
	}
	return &certificateResult{material: m, source: source}, nil, nil
}

func (r *Reconciler) selfManagedCertificate(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*certificateResult, *problem, error) {
	caSecret := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: CASecretName(b)}, caSecret); err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("get Secret %s: %w", CASecretName(b), err)
	}
	leafSecret := &corev1.Secret{}
	if err := r.APIReader.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: TLSSecretName(b)}, leafSecret); err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("get Secret %s: %w", TLSSecretName(b), err)
	}
	var (
		rotation *caRotation
		waiting  waitingList
	)
	if len(caSecret.Data[corev1.TLSCertKey]) > 0 {
		var err error
		if rotation, waiting, err = r.rotateCA(ctx, b, caSecret); err != nil {
			return nil, nil, err
		}
	}
	var keys caKeySource
	if len(caSecret.Data[corev1.TLSCertKey]) == 0 {
		password, err := r.passwordSecret(ctx, b)
		if err != nil {
			return nil, nil, err
		}
		keys = caKeySourceOf(b, password)
	}
	newCA, newLeaf, samePin, err := selfManagedTLS(b, keys, caSecret.Data, leafSecret.Data, r.Clock.Now())
	if err != nil {
		return nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("%v: fix Secret %s, or annotate it %s and delete it to have a new CA issued; guests trust its CA, so a new one leaves every guest distrusting the server until its VM gets the new CA", err, CASecretName(b), AnnotationReplaceCA)}, nil
	}
	if newCA != nil {
		// No ownerReference: guests trust this CA, so it outlives the BSLS
		// (a BSLS re-created on the same storage keeps its guests' trust).
		ca := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: CASecretName(b), Namespace: b.Namespace, Labels: Labels(b),
				Annotations: map[string]string{AnnotationKeep: "the CA that guests of BackupStorageLocationServer " + b.Name + " pin; not deleted with it"},
				// Guarded from its first moment (guardCA).
				Finalizers: []string{FinalizerCAGuard},
			},
			Type: corev1.SecretTypeTLS,
			Data: newCA,
		}
		if err := r.Client.Create(ctx, ca); err != nil {
			return nil, nil, fmt.Errorf("create Secret %s: %w", ca.Name, err)
		}
		switch {
		case samePin:
			r.Recorder.Eventf(b, corev1.EventTypeWarning, ReasonCASecretRemade,
				"Secret %s was missing; the CA guests trust (SHA-256 %s) is made again, its key derived from the repository password in Secret %s, so running guests keep trusting the server",
				ca.Name, b.Status.TLSFingerprint, keys.PasswordSecret)
		case keys.derived():
			r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonCAIssued,
				"Issued a CA for the server in Secret %s (cert-manager is not used), its key derived from the repository password in Secret %s (key generation %d): a cluster given that Secret makes the same key again, and guests keep trusting the server",
				ca.Name, keys.PasswordSecret, keys.Generation)
		default:
			r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonCAIssued,
				"Issued a CA for the server in Secret %s (cert-manager is not used), with a random key: the repository password is not one the controller generated, so keep a backup of Secret %s; guests trust no other CA",
				ca.Name, ca.Name)
		}
	}
	if newLeaf != nil {
		leaf := &corev1.Secret{
			TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
			ObjectMeta: metav1.ObjectMeta{Name: TLSSecretName(b), Namespace: b.Namespace, Labels: Labels(b)},
			Type:       corev1.SecretTypeTLS,
			Data:       newLeaf,
		}
		if err := r.apply(ctx, b, leaf); err != nil {
			return nil, nil, err
		}
		r.Recorder.Eventf(b, corev1.EventTypeNormal, ReasonServingCertificateIssued, "Issued the server's certificate in Secret %s; the server restarts to load it and guests keep trusting it through its CA", leaf.Name)
		leafSecret = leaf
	}
	m, p := checkTLSSecret(leafSecret, EndpointHost(b))
	res := &certificateResult{material: m, source: "the controller's CA in Secret " + CASecretName(b)}
	if certs, err := certutil.ParseCertsPEM(leafSecret.Data[corev1.TLSCertKey]); err == nil {
		life := certs[0].NotAfter.Sub(certs[0].NotBefore)
		res.renewAt = certs[0].NotAfter.Add(-life / 3)
	}
	if m != nil && rotation != nil && pki.Fingerprint(rotation.current.Cert) == m.Pin {
		// Guests are given the next CA too; the pin stays the CA that
		// signs the server's certificate until the switch.
		m.CA = rotation.bundle()
		res.rotation = rotationStatus(rotation, waiting)
		if recheck := r.Clock.Now().Add(caRotationRecheck); res.renewAt.IsZero() || recheck.Before(res.renewAt) {
			res.renewAt = recheck
		}
	}
	return res, p, nil
}
