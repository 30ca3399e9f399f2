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

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/pkg/pki"
)

// CertificateName is the cert-manager Certificate of a BSLS's server.
func CertificateName(b *v1alpha1.BackupStorageLocationServer) string { return b.Name + "-server" }

// certificateResult is what the certificate step found.
type certificateResult struct {
	material *tlsMaterial
	// source describes where the certificate comes from, for messages.
	source string
	// renewAt is when a self-managed leaf must be renewed.
	renewAt time.Time
}

// issuer is the cert-manager issuer of a BSLS's certificate: its own, else
// the controller's default; nil means the controller issues it itself.
func (r *Reconciler) issuer(b *v1alpha1.BackupStorageLocationServer) *v1alpha1.IssuerReference {
	if b.Spec.TLS.IssuerRef != nil {
		return b.Spec.TLS.IssuerRef
	}
	if r.CertManager && r.DefaultIssuer != nil {
		return r.DefaultIssuer
	}
	return nil
}

// certificate makes sure the server's certificate Secret exists and checks
// it, in whichever of three ways the BSLS asks for: an admin's Secret, a
// cert-manager Certificate, or a CA the controller keeps itself.
func (r *Reconciler) certificate(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*certificateResult, *problem, error) {
	if name := b.Spec.TLS.SecretName; name != "" {
		s, p, err := r.tlsSecret(ctx, b, "create a kubernetes.io/tls Secret with tls.crt, tls.key and ca.crt, or remove tls.secretName")
		if s == nil {
			return nil, p, err
		}
		m, p := checkTLSSecret(s)
		return &certificateResult{material: m, source: "Secret " + name}, p, nil
	}
	if iss := r.issuer(b); iss != nil {
		return r.certManagerCertificate(ctx, b, iss)
	}
	return r.selfManagedCertificate(ctx, b)
}

// tlsSecret reads the serving certificate Secret; a missing one is a
// problem whose message ends with fix.
func (r *Reconciler) tlsSecret(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, fix string) (*corev1.Secret, *problem, error) {
	s := &corev1.Secret{}
	name := TLSSecretName(b)
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: name}, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &problem{ReasonTLSSecretNotFound, fmt.Sprintf("Secret %s not found in namespace %s: %s", name, b.Namespace, fix)}, nil
		}
		return nil, nil, fmt.Errorf("get Secret %s: %w", name, err)
	}
	return s, nil, nil
}

func (r *Reconciler) certManagerCertificate(ctx context.Context, b *v1alpha1.BackupStorageLocationServer, iss *v1alpha1.IssuerReference) (*certificateResult, *problem, error) {
	kind, group := iss.Kind, iss.Group
	if kind == "" {
		kind = "ClusterIssuer"
	}
	if group == "" {
		group = "cert-manager.io"
	}
	source := fmt.Sprintf("cert-manager %s %s", kind, iss.Name)
	if !r.CertManager {
		return nil, &problem{ReasonCertManagerMissing, fmt.Sprintf("tls.issuerRef names %s, but cert-manager's Certificate CRD is not installed: install cert-manager, or remove tls.issuerRef so that the controller issues the certificate from a CA of its own", source)}, nil
	}
	dnsNames, ips := ServingNames(b)
	ipStrings := make([]string, len(ips))
	for i, ip := range ips {
		ipStrings[i] = ip.String()
	}
	cert := &certmanagerv1.Certificate{
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
			SecretTemplate: &certmanagerv1.CertificateSecretTemplate{Labels: Labels(b)},
		},
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
	m, p := checkTLSSecret(s)
	if p != nil {
		p.Message += fmt.Sprintf(" (the Secret is written by %s: does the issuer publish its CA in ca.crt?)", source)
	}
	return &certificateResult{material: m, source: source}, p, nil
}

func (r *Reconciler) selfManagedCertificate(ctx context.Context, b *v1alpha1.BackupStorageLocationServer) (*certificateResult, *problem, error) {
	caSecret := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: CASecretName(b)}, caSecret); err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("get Secret %s: %w", CASecretName(b), err)
	}
	leafSecret := &corev1.Secret{}
	if err := r.Client.Get(ctx, types.NamespacedName{Namespace: b.Namespace, Name: TLSSecretName(b)}, leafSecret); err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, fmt.Errorf("get Secret %s: %w", TLSSecretName(b), err)
	}
	newCA, newLeaf, err := selfManagedTLS(b, caSecret.Data, leafSecret.Data, r.now())
	if err != nil {
		return nil, &problem{ReasonTLSSecretInvalid, fmt.Sprintf("%v: fix or delete Secret %s; guests pin its CA, so a new one makes every guest reconnect with a new pin", err, CASecretName(b))}, nil
	}
	if newCA != nil {
		// No ownerReference: guests pin this CA, so it outlives the BSLS
		// (a BSLS re-created on the same storage keeps its guests' pin).
		ca := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{
				Name: CASecretName(b), Namespace: b.Namespace, Labels: Labels(b),
				Annotations: map[string]string{AnnotationKeep: "the CA that guests of BackupStorageLocationServer " + b.Name + " pin; not deleted with it"},
			},
			Type: corev1.SecretTypeTLS,
			Data: newCA,
		}
		if err := r.Client.Create(ctx, ca); err != nil {
			return nil, nil, fmt.Errorf("create Secret %s: %w", ca.Name, err)
		}
		r.Recorder.Eventf(b, corev1.EventTypeNormal, "CAIssued", "Issued a CA for the server in Secret %s (cert-manager is not used)", ca.Name)
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
		r.Recorder.Eventf(b, corev1.EventTypeNormal, "ServingCertificateIssued", "Issued the server's certificate in Secret %s; the server restarts to load it and guests keep their CA pin", leaf.Name)
		leafSecret = leaf
	}
	m, p := checkTLSSecret(leafSecret)
	res := &certificateResult{material: m, source: "the controller's CA in Secret " + CASecretName(b)}
	if certs, err := pki.ParseCerts(leafSecret.Data[corev1.TLSCertKey]); err == nil {
		life := certs[0].NotAfter.Sub(certs[0].NotBefore)
		res.renewAt = certs[0].NotAfter.Add(-life / 3)
	}
	return res, p, nil
}
