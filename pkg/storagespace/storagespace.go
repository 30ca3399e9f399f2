// Package storagespace tells a write the repository's storage refused for
// want of space from every other failure: a filesystem out of space or
// over its quota, an S3 bucket over its quota, or a MinIO whose drives
// reached their minimum free space. The server pod reports such a
// refusal in its storage state (package maintenancestate), from which the
// controller makes the BSLS's StorageSpace condition.
package storagespace

import (
	"errors"
	"net/http"
	"strings"
	"syscall"

	"github.com/minio/minio-go/v7"
)

// refusalCodes are S3 error codes that mean the write was refused for want
// of space: MinIO's, when its drives reached their minimum free space or a
// bucket its quota, and Ceph RGW's (and others') quota code.
var refusalCodes = map[string]bool{
	"XMinioStorageFull":              true,
	"XMinioAdminBucketQuotaExceeded": true,
	"QuotaExceeded":                  true,
}

// refusalTexts are how the same refusals read once an error chain lost
// their type (a message copied into a new error): the C library's words
// for ENOSPC and EDQUOT, MinIO's and the HTTP status's.
var refusalTexts = []string{
	"no space left on device",
	"disk quota exceeded",
	"storage backend has reached its minimum free drive threshold",
	"bucket quota exceeded",
	"insufficient storage",
}

// Refused reports whether err says that the storage refused a write for
// want of space. It looks for the storage's own error in err's chain
// (ENOSPC or EDQUOT from a filesystem; an S3 error response with a quota
// or storage-full code, or HTTP 507), and else for those errors' words
// in its message.
func Refused(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return true
	}
	var response minio.ErrorResponse
	if errors.As(err, &response) && (refusalCodes[response.Code] || response.StatusCode == http.StatusInsufficientStorage) {
		return true
	}
	return RefusedText(err.Error())
}

// RefusedText reports whether an error message, as a component wrote it
// down, says that the storage refused a write for want of space.
func RefusedText(message string) bool {
	lower := strings.ToLower(message)
	for _, t := range refusalTexts {
		if strings.Contains(lower, t) {
			return true
		}
	}
	for code := range refusalCodes {
		if strings.Contains(message, code) {
			return true
		}
	}
	return false
}
