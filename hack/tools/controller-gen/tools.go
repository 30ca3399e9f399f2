//go:build tools

// Package tools pins the controller-gen command so `go mod tidy` keeps its
// dependencies; hack/tools.sh builds it with `go build`.
package tools

import _ "sigs.k8s.io/controller-tools/cmd/controller-gen"
