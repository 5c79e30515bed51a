//go:build tools

// Package tools pins the LeaderWorkerSet controller (sigs.k8s.io/lws) the dev cluster runs.
//
// A module of its own, beside ../go.mod, on purpose: joined to the control plane's module,
// minimal version selection lifts sigs.k8s.io/structured-merge-diff (the API server's
// server-side apply engine) above the version Kubernetes v1.36.3 pins. Apart, kube-apiserver
// keeps exactly Kubernetes' dependency versions and the controller exactly the ones LWS
// itself releases with. operator/devcluster/build.py builds ./cmd of this module as
// `lws-controller` into the same binary cache directory.
package tools

import (
	_ "sigs.k8s.io/lws/cmd"
)
