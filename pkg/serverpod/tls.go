package serverpod

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// shutdownGrace bounds how long ServeTLS waits for requests in flight once
// its context ends.
const shutdownGrace = 5 * time.Second

// TrustChain is the TLS configuration of a client of the Kopia server in
// this pod: the chain the server presents must verify against cas, whatever
// host name it was reached by, since the pod's containers reach it on
// loopback while its certificate names the Service.
func TrustChain(cas []*x509.Certificate) *tls.Config {
	roots := x509.NewCertPool()
	for _, ca := range cas {
		roots.AddCert(ca)
	}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		// Verification is VerifyConnection's: the chain, but not the host name.
		InsecureSkipVerify: true, //nolint:gosec // verified below
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server presented no certificate")
			}
			intermediates := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				intermediates.AddCert(c)
			}
			_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: intermediates})
			return err
		},
	}
}

// ServeTLS serves srv on ln with the certificate chain and key the Kopia
// server presents (guests trust the same CA on every port of the pod)
// until ctx ends, then shuts it down. It closes ln.
func ServeTLS(ctx context.Context, ln net.Listener, chainFile, keyFile string, srv *http.Server) error {
	cert, err := tls.LoadX509KeyPair(chainFile, keyFile)
	if err != nil {
		ln.Close()
		return fmt.Errorf("load TLS certificate: %w", err)
	}
	srv.TLSConfig = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		_ = srv.Shutdown(shutdown) //nolint:contextcheck // ctx is already done
	}()
	if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
