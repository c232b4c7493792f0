//go:build tools

// Package tools pins helm, whose command the install suite runs (`make helm` builds it into
// $(CISTERN_CACHE)/tools/helm-<version>/).
package tools

import _ "helm.sh/helm/v3/cmd/helm"
