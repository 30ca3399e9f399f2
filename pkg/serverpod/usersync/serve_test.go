package usersync

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestHandler holds the user-sync container's probes to what its pod spec
// expects: alive from the start, ready only once the users are synced, and
// saying why not.
func TestHandler(t *testing.T) {
	s := New(Options{})
	h := s.Handler()
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, http.NoBody))
		return rec.Code, rec.Body.String()
	}
	for _, tt := range []struct {
		name, path string
		synced     error
		wantCode   int
		wantBody   string
	}{
		{"alive before the first sync", "/healthz", errNotSynced, http.StatusOK, "ok"},
		{"not ready before the first sync", "/readyz", errNotSynced, http.StatusInternalServerError, errNotSynced.Error()},
		{"not ready, saying why, after a failed sync", "/readyz", errors.New("users Secret main-users-0 is missing"), http.StatusInternalServerError, "main-users-0"},
		{"ready once synced", "/readyz", nil, http.StatusOK, "ok"},
		{"metrics", "/metrics", nil, http.StatusOK, "guestbackup_server_foreign_acls_removed_total"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s.setStatus(tt.synced, tt.synced, 3)
			code, body := get(tt.path)
			if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}

// kopiaDown is a Kopia server as user sync's probe sees it while it starts
// or after it exited: its control API does not answer.
type kopiaDown struct{}

func (kopiaDown) Refresh(context.Context) error { return errors.New("connection refused") }
func (kopiaDown) Connected(context.Context) (bool, error) {
	return false, errors.New("dial tcp 127.0.0.1:51517: connection refused")
}
func (kopiaDown) Accepts(context.Context, string, string) (bool, error) {
	return false, errors.New("dial tcp 127.0.0.1:51517: connection refused")
}

// TestHandlerServerDown: the Kopia server listens on the pod's loopback
// only, out of the kubelet's reach, so the pod's readiness says whether it
// answers.
func TestHandlerServerDown(t *testing.T) {
	s := New(Options{Server: kopiaDown{}})
	s.setStatus(nil, nil, 3)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", http.NoBody))
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), "the Kopia server does not answer") {
		t.Errorf("GET /readyz = %d %q, want 500 saying the Kopia server does not answer", rec.Code, rec.Body.String())
	}
}
