package usersync

import (
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
			s.setStatus(tt.synced, 3)
			code, body := get(tt.path)
			if code != tt.wantCode || !strings.Contains(body, tt.wantBody) {
				t.Errorf("GET %s = %d %q, want %d containing %q", tt.path, code, body, tt.wantCode, tt.wantBody)
			}
		})
	}
}
