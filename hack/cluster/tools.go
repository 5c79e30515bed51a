//go:build tools

// Package tools pins every binary the local control plane needs, so `go mod tidy`
// keeps them in go.mod/go.sum. devtools/sglang_pd_operator_dev/cluster/build.py compiles them all (plus
// ./cmd/etcd) in one `go build`.
package tools

import (
	_ "helm.sh/helm/v3/cmd/helm"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubectl"
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
