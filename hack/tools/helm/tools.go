//go:build tools

// Package tools pins the helm command so `go mod tidy` keeps its
// dependencies; hack/tools.sh builds it with `go build`.
package tools

import _ "helm.sh/helm/v3/cmd/helm"
