//go:build tools

// Package tools pins the Prometheus server's module (built by build.sh) in this module's go.mod and go.sum.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
