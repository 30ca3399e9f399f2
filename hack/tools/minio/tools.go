//go:build tools

// Package tools pins the minio command so `go mod tidy` keeps its
// dependencies; hack/tools.sh builds it with `go build`.
package tools

import _ "github.com/minio/minio"
