package storagespace

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"syscall"
	"testing"

	"github.com/minio/minio-go/v7"
)

func TestRefused(t *testing.T) {
	full := &fs.PathError{Op: "write", Path: "/repository/p0/tmp", Err: syscall.ENOSPC}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"ENOSPC, wrapped", fmt.Errorf("can't write temporary file: %w", full), true},
		{"ENOSPC behind fmt's %w", fmt.Errorf("sync users: %w", full), true},
		{"EDQUOT", &fs.PathError{Op: "write", Path: "/r", Err: syscall.EDQUOT}, true},
		{"ENOSPC's words only (the chain was lost)", errors.New("error writing manifest: unable to complete PutBlobInPath: write /r/x: no space left on device"), true},
		{"MinIO out of drive space", fmt.Errorf("PutObject: %w", minio.ErrorResponse{Code: "XMinioStorageFull", StatusCode: http.StatusInsufficientStorage}), true},
		{"MinIO bucket quota", fmt.Errorf("put: %w", minio.ErrorResponse{Code: "XMinioAdminBucketQuotaExceeded", StatusCode: http.StatusBadRequest}), true},
		{"Ceph's quota", minio.ErrorResponse{Code: "QuotaExceeded", StatusCode: http.StatusForbidden}, true},
		{"HTTP 507 with any code", minio.ErrorResponse{Code: "SomethingElse", StatusCode: http.StatusInsufficientStorage}, true},
		{"a quota code in a copied message", errors.New("PutBlob: XMinioStorageFull: Storage backend has reached its minimum free drive threshold"), true},
		{"access denied", minio.ErrorResponse{Code: "AccessDenied", StatusCode: http.StatusForbidden}, false},
		{"permission denied", &fs.PathError{Op: "open", Path: "/r", Err: syscall.EACCES}, false},
		{"not found", os.ErrNotExist, false},
		{"a timeout", errors.New("context deadline exceeded"), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Refused(tc.err); got != tc.want {
				t.Errorf("Refused(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
