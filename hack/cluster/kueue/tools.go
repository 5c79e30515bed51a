//go:build tools

// Package tools pins the Kueue controller manager (sigs.k8s.io/kueue) the dev cluster runs
// when it is started with Kueue (an optional component).
//
// A module of its own, beside ../go.mod and ../lws/go.mod, for the same reason as lws/:
// joined to the control plane's module, minimal version selection would lift Kubernetes'
// pinned dependencies (structured-merge-diff, client-go ...) to the versions Kueue needs.
// Apart, each binary keeps the dependency versions its project releases with.
// devtools' cluster/build.py builds ./cmd/kueue of this module as `kueue-controller` into
// its own binary cache directory (kueue-bin/<hash>/), only when a cluster asks for Kueue.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
