#!/usr/bin/env bash
# The Helm chart's tools, pinned and built from source, and the Kubernetes schemas that
# kubeconform validates against, made offline (only the Go module proxy is needed):
#   helm         go install helm.sh/helm/v3/cmd/helm@$HELM_VERSION
#   kubeconform  go install github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION
#   schemas      Kubernetes' own OpenAPI document (api/openapi-spec/swagger.json of the
#                k8s.io/kubernetes module) and the Prometheus Operator's ServiceMonitor CRD,
#                fetched with `go mod download` and turned into strict JSON schemas by
#                deploy/helm/openapi2jsonschema.py
# into ${SFAAS_CACHE:-~/.cache/sfaas}/bin and .../kube-schemas, each only when missing or of
# another version (a couple of minutes on a fresh machine, then instant).
#
#   scripts/helm_tools.sh              install what is missing; print HELM=, KUBECONFORM=,
#                                      KUBE_VERSION= and KUBE_SCHEMA_LOCATION= lines
#   scripts/helm_tools.sh check [ARGS] helm lint, then helm template | kubeconform -strict,
#                                      of deploy/helm/sfaas with ARGS (-f values.yaml, --set …)
set -euo pipefail

HELM_VERSION=v3.22.0
KUBECONFORM_VERSION=v0.8.0
# The Kubernetes release whose API the manifests are checked against (helm v3.22 is built
# on its client libraries, v0.37), and the Prometheus Operator release of the ServiceMonitor.
KUBERNETES_VERSION=v1.37.2
PROMETHEUS_OPERATOR_VERSION=v0.85.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${SFAAS_CACHE:-$HOME/.cache/sfaas}"
bin="$cache/bin"
chart="$here/deploy/helm/sfaas"
generator="$here/deploy/helm/openapi2jsonschema.py"
schemas="$cache/kube-schemas"
strict_dir="$schemas/$KUBERNETES_VERSION-standalone-strict"

say() { printf '[helm_tools] %s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

command -v go >/dev/null || die "go is required to build helm and kubeconform (apt-get install golang-go, or ./run test, which installs it)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# A binary is current when `go version -m` names the pinned module version it was built from.
built_from() {  # FILE MODULE VERSION
  [ -x "$1" ] && go version -m "$1" 2>/dev/null | grep -qE "^[[:space:]]+mod[[:space:]]+$2[[:space:]]+$3([[:space:]]|$)"
}

install_tool() {  # NAME MODULE VERSION PACKAGE
  local name=$1 module=$2 version=$3 package=$4 t0
  if built_from "$bin/$name" "$module" "$version"; then
    return
  fi
  say "building $name $version from $package (go install; once)"
  mkdir -p "$bin"
  t0=$(date +%s)
  (cd "$work" && GOBIN="$bin" CGO_ENABLED=0 go install -trimpath -ldflags='-s -w' "$package@$version") \
    || die "go install $package@$version failed (is the Go module proxy reachable? GOPROXY=$(go env GOPROXY))"
  built_from "$bin/$name" "$module" "$version" || die "$bin/$name is not $module $version after go install"
  say "built $name $version in $(( $(date +%s) - t0 )) s"
}

module_dir() {  # MODULE VERSION: the module's files, downloaded into Go's module cache
  local json
  json="$(cd "$work" && go mod download -json "$1@$2")" || die "go mod download $1@$2 failed"
  printf '%s' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p'
}

python_with_yaml() {
  local py
  for py in "${SFAAS_PYTHON:-}" python3 "$cache/venv/bin/python"; do
    if [ -n "$py" ] && "$py" -c 'import yaml' 2>/dev/null; then
      printf '%s' "$py"; return
    fi
  done
  die "no Python with PyYAML found (pip install pyyaml, or set SFAAS_PYTHON)"
}

install_schemas() {
  # regenerated when a version or the generator changes
  local stamp t0 k8s po py new
  stamp="$KUBERNETES_VERSION $PROMETHEUS_OPERATOR_VERSION $(sha256sum "$generator" | cut -c1-16)"
  if [ "$(cat "$strict_dir/.stamp" 2>/dev/null)" = "$stamp" ]; then
    return
  fi
  say "making the Kubernetes $KUBERNETES_VERSION JSON schemas (go mod download k8s.io/kubernetes; once)"
  t0=$(date +%s)
  k8s="$(module_dir k8s.io/kubernetes "$KUBERNETES_VERSION")"
  po="$(module_dir github.com/prometheus-operator/prometheus-operator "$PROMETHEUS_OPERATOR_VERSION")"
  [ -f "$k8s/api/openapi-spec/swagger.json" ] || die "no api/openapi-spec/swagger.json in $k8s"
  py="$(python_with_yaml)"
  mkdir -p "$schemas"
  new="$(mktemp -d "$schemas/.new.XXXXXX")"  # (a concurrent run makes its own)
  "$py" "$generator" "$new" --swagger "$k8s/api/openapi-spec/swagger.json" \
    --crd "$po/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
  printf '%s' "$stamp" > "$new/.stamp"
  chmod 755 "$new"
  rm -rf "$strict_dir"
  mv "$new" "$strict_dir"
  say "made the schemas in $(( $(date +%s) - t0 )) s"
}

install_tool helm helm.sh/helm/v3 "$HELM_VERSION" helm.sh/helm/v3/cmd/helm
install_tool kubeconform github.com/yannh/kubeconform "$KUBECONFORM_VERSION" \
  github.com/yannh/kubeconform/cmd/kubeconform
install_schemas

location="$schemas/{{ .NormalizedKubernetesVersion }}-standalone{{ .StrictSuffix }}/{{ .ResourceKind }}{{ .KindSuffix }}.json"
case "${1:-}" in
  "")
    printf 'HELM=%s\nKUBECONFORM=%s\nKUBE_VERSION=%s\nKUBE_SCHEMA_LOCATION=%s\n' \
      "$bin/helm" "$bin/kubeconform" "${KUBERNETES_VERSION#v}" "$location"
    ;;
  check)
    shift
    "$bin/helm" lint --strict "$chart" "$@"
    "$bin/helm" template sfaas "$chart" "$@" \
      | "$bin/kubeconform" -strict -summary -kubernetes-version "${KUBERNETES_VERSION#v}" \
          -schema-location "$location" -
    ;;
  *)
    die "unknown command '$1': expected nothing or 'check [helm template args]'"
    ;;
esac
