module github.com/sglang-pd-operator/sglang-pd-operator/hack/argocd-health

go 1.26.0

require github.com/yuin/gopher-lua v1.1.2
