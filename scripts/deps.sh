#!/usr/bin/env bash
# Install what building and testing Rivora needs, idempotently: nothing is
# installed when every tool is already there. Fails loudly otherwise.
set -euo pipefail

# command -> Debian package
declare -A want=(
	[clang]=clang
	[llvm-strip]=llvm
	[clang-format]=clang-format
	[pkg-config]=pkg-config
	[bpftool]=bpftool
	[ip]=iproute2
	[ethtool]=ethtool
	[make]=make
	[gcc]=gcc
	[nsenter]=util-linux
)
# headers and libraries, checked by file
declare -A want_files=(
	[/usr/include/libelf.h]=libelf-dev
	[/usr/include/zlib.h]=zlib1g-dev
)

missing=()
for cmd in "${!want[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin:/sbin" command -v "$cmd" >/dev/null 2>&1 || missing+=("${want[$cmd]}")
done
for f in "${!want_files[@]}"; do
	[ -e "$f" ] || missing+=("${want_files[$f]}")
done
for pkg in "$@"; do
	dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done

if [ ${#missing[@]} -eq 0 ]; then
	exit 0
fi
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
echo "deps: installing ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
	echo "deps: missing packages (${missing[*]}) and not root: install them, or run as root" >&2
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "deps: no apt-get on this machine: install ${missing[*]} by hand" >&2
	exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Several installs at once (parallel test runs, a user in another shell)
# wait for the dpkg lock instead of failing on it.
apt_lock=(-o DPkg::Lock::Timeout=600)
apt-get "${apt_lock[@]}" update -qq || { echo "deps: apt-get update failed" >&2; exit 1; }
apt-get "${apt_lock[@]}" install -y -qq --no-install-recommends "${missing[@]}" >/dev/null || {
	echo "deps: apt-get install ${missing[*]} failed" >&2
	exit 1
}
