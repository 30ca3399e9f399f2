package serverpod

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// ControlClient calls a Kopia server's control API as its server-control
// user. It trusts the server when the chain it presents verifies against the
// given CAs, whatever host name it was reached by: the user-sync container
// reaches its server on loopback, while the certificate names the Service.
type ControlClient struct {
	url      string
	username string
	password string
	http     *http.Client
}

// NewControlClient returns a client for the server at url (https://host:port).
func NewControlClient(url, username, password string, cas []*x509.Certificate) *ControlClient {
	return &ControlClient{
		url: url, username: username, password: password,
		http: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: TrustChain(cas)}},
	}
}

// Connected reports whether the server is up and has its repository open.
func (c *ControlClient) Connected(ctx context.Context) (bool, error) {
	var status struct {
		Connected bool `json:"connected"`
	}
	if err := c.call(ctx, http.MethodGet, "status", &status); err != nil {
		return false, err
	}
	return status.Connected, nil
}

// Refresh makes the server re-read the repository's manifests, so that users
// written by another process authenticate at once rather than after Kopia's
// periodic refresh.
func (c *ControlClient) Refresh(ctx context.Context) error {
	return c.call(ctx, http.MethodPost, "refresh", nil)
}

// Accepts reports whether the server authenticates user with password,
// by the answer to a control request it makes as them: refused as
// unauthenticated (401), or let through authentication to its
// authorization (403 for anyone but the control user).
func (c *ControlClient) Accepts(ctx context.Context, user, password string) (bool, error) {
	resp, err := c.send(ctx, http.MethodGet, "status", user, password)
	if err != nil {
		return false, fmt.Errorf("kopia control API status as %s: %w", user, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	switch resp.StatusCode {
	case http.StatusUnauthorized:
		return false, nil
	case http.StatusOK, http.StatusForbidden:
		return true, nil
	}
	return false, fmt.Errorf("kopia control API status as %s: %s", user, resp.Status)
}

// Close releases idle connections.
func (c *ControlClient) Close() { c.http.CloseIdleConnections() }

func (c *ControlClient) call(ctx context.Context, method, endpoint string, into any) error {
	resp, err := c.send(ctx, method, endpoint, c.username, c.password)
	if err != nil {
		return fmt.Errorf("kopia control API %s: %w", endpoint, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("kopia control API %s: %s", endpoint, resp.Status)
	}
	if into == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(into); err != nil {
		return fmt.Errorf("kopia control API %s: decode response: %w", endpoint, err)
	}
	return nil
}

// send makes a request of the control API's endpoint as user.
func (c *ControlClient) send(ctx context.Context, method, endpoint, user, password string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, c.url+"/api/v1/control/"+endpoint, http.NoBody)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(user, password)
	return c.http.Do(req)
}
