#!/usr/bin/env bash
# A real kube-apiserver and etcd for the tests, on loopback.
#
#   apiserver.sh build            build target/apiserver/kube-apiserver from
#                                 tests/apiserver/ (only when missing or stale)
#   apiserver.sh start STATE_DIR  certificates, etcd, kube-apiserver with RBAC;
#                                 waits for /readyz, prints STATE_DIR/kubeconfig
#   apiserver.sh stop STATE_DIR   ends both and removes STATE_DIR
#
# start writes into STATE_DIR: kubeconfig (a system:masters client), server
# (the https URL), ca.crt, admin.crt, admin.key, etcd.log, apiserver.log.
# With APISERVER_WATCH_PID set, a watchdog stops everything once that process
# is gone, so a test killed before its destructor ran leaves nothing behind.
# Ports are picked free at start: several test processes may run at once.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$root/tests/apiserver
out=$root/target/apiserver
bin=$out/kube-apiserver
stamp=$out/kube-apiserver.stamp
# Marks a directory as one start made, so stop never removes anything else.
marker=.rivora-apiserver

die() {
	echo "apiserver: $*" >&2
	exit 1
}

find_go() {
	if command -v go >/dev/null 2>&1; then
		command -v go
	elif [ -x /usr/local/go/bin/go ]; then
		echo /usr/local/go/bin/go
	else
		die "no Go toolchain (go on PATH or /usr/local/go/bin/go): install Go >= 1.26 to build kube-apiserver"
	fi
}

# The go build command line, one word a line. -mod=readonly: go.mod and
# go.sum are checked in and must already say everything; a build that wants
# to change them is a broken checkout. -buildvcs=false: the module sits
# inside Rivora's repository, whose git state is no part of the binary (and
# git may refuse a CI clone's). The -X flags are what Kubernetes' own build
# stamps in (hack/lib/version.sh); without them /version says v0.0.0-master
# and clients that check it are misled.
build_args() {
	local go=$1 version major minor ldflags="" pkg
	version=$(cd "$src" && "$go" list -mod=readonly -m -f '{{.Version}}' k8s.io/kubernetes) ||
		die "go list in $src failed: is go.mod intact?"
	major=${version#v}
	minor=${major#*.}
	minor=${minor%%.*}
	major=${major%%.*}
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldflags+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	printf '%s\n' build -mod=readonly -trimpath -buildvcs=false -ldflags "${ldflags# }"
}

# What the binary is built from: every file of the module, the toolchain and
# the command line.
source_hash() {
	local go=$1 args=$2
	{
		(cd "$src" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum)
		"$go" version
		echo "CGO_ENABLED=0 $args"
	} | sha256sum | cut -d' ' -f1
}

cmd_build() {
	local go args want tmp t0
	local -a argv
	go=$(find_go)
	args=$(build_args "$go")
	mapfile -t argv <<<"$args"
	want=$(source_hash "$go" "$args")
	if [ -x "$bin" ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
		echo "apiserver: $bin is up to date"
		return 0
	fi
	mkdir -p "$out"
	# Built beside the result and renamed: a concurrent or interrupted build
	# never leaves a half-written binary under the final name.
	tmp=$(mktemp "$out/.kube-apiserver.XXXXXX")
	trap 'rm -f "$tmp"' EXIT
	echo "apiserver: building kube-apiserver from $src (the first build takes minutes)"
	t0=$(date +%s)
	if ! (cd "$src" && CGO_ENABLED=0 "$go" "${argv[@]}" -o "$tmp" .); then
		die "go build in $src failed (see above)"
	fi
	"$tmp" --version >/dev/null || die "the built kube-apiserver does not run: $tmp --version failed"
	mv -f "$tmp" "$bin"
	trap - EXIT
	echo "$want" >"$stamp"
	echo "apiserver: built $("$bin" --version) in $(($(date +%s) - t0)) s: $bin"
}

# A loopback TCP port nothing listens on, below the ephemeral range so no
# outgoing connection takes it in the meantime. Two starts may still draw
# the same port: start retries when a server cannot bind.
pick_port() {
	local p
	for _ in $(seq 50); do
		p=$((20000 + RANDOM % 12000))
		if ! ss -Hltn "sport = :$p" | grep -q .; then
			echo "$p"
			return 0
		fi
	done
	die "no free loopback port found"
}

alive() {
	local pidfile=$1
	[ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null
}

# The pid in $2/$1.pid, if that process is still the one start launched in
# this state dir (its command line names the dir), so a recycled pid is
# never signalled.
ours() {
	local name=$1 d=$2 pid
	[ -f "$d/$name.pid" ] || return 1
	pid=$(cat "$d/$name.pid")
	[ -r "/proc/$pid/cmdline" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$d" || return 1
	echo "$pid"
}

stop_dir() {
	local d=$1 pid pids=()
	[ -d "$d" ] || return 0
	[ -f "$d/$marker" ] || die "$d was not made by apiserver.sh start: not removing it"
	# The watchdog ends by running this very stop: it must not kill itself.
	if [ "$(cat "$d/watchdog.pid" 2>/dev/null)" != "$$" ]; then
		pid=$(ours watchdog "$d") && pids+=("$pid")
	fi
	pid=$(ours apiserver "$d") && pids+=("$pid")
	pid=$(ours etcd "$d") && pids+=("$pid")
	# SIGKILL: everything they would save on a graceful stop is removed
	# right after, and a graceful stop costs each test about 4 s (and hangs
	# a kube-apiserver whose etcd went first).
	if [ ${#pids[@]} -gt 0 ]; then
		kill -9 "${pids[@]}" 2>/dev/null || true
		for _ in $(seq 100); do
			kill -0 "${pids[@]}" 2>/dev/null || break
			sleep 0.1
		done
		if kill -0 "${pids[@]}" 2>/dev/null; then
			die "processes ${pids[*]} of $d still there 10 s after SIGKILL"
		fi
	fi
	rm -rf "$d"
}

cmd_stop() {
	[ $# -eq 1 ] || die "usage: apiserver.sh stop STATE_DIR"
	[ -d "$1" ] || return 0
	stop_dir "$(cd "$1" && pwd)"
}

certs() {
	local d=$1
	(
		cd "$d"
		openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=rivora-test-ca \
			-keyout ca.key -out ca.crt
		openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver \
			-keyout apiserver.key -out apiserver.csr
		printf 'subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n' >server.ext
		openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
			-extfile server.ext -out apiserver.crt
		# O=system:masters: the group RBAC lets do everything.
		openssl req -newkey rsa:2048 -nodes -subj "/O=system:masters/CN=rivora-test-admin" \
			-keyout admin.key -out admin.csr
		printf 'extendedKeyUsage=clientAuth\n' >client.ext
		openssl x509 -req -in admin.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
			-extfile client.ext -out admin.crt
		openssl genrsa -out sa.key 2048
		openssl rsa -in sa.key -pubout -out sa.pub
	) >"$d/openssl.log" 2>&1 || {
		cat "$d/openssl.log" >&2
		die "openssl failed making the certificates in $d"
	}
}

# Tail of a log on stderr, for a failed start.
show_log() {
	local f=$1
	[ -f "$f" ] || return 0
	echo "---- last lines of $f ----" >&2
	tail -n 40 "$f" >&2
}

# Whether a server that died did so because its port was taken.
lost_port_race() {
	grep -qiE 'address already in use' "$1" 2>/dev/null
}

start_etcd() {
	local d=$1 client peer
	for _ in 1 2 3 4 5; do
		client=$(pick_port)
		peer=$(pick_port)
		[ "$client" != "$peer" ] || continue
		rm -rf "$d/etcd"
		# 3.4 and 3.5 accept the same flags used here.
		setsid etcd --name rivora-test --data-dir "$d/etcd" \
			--listen-client-urls "http://127.0.0.1:$client" --advertise-client-urls "http://127.0.0.1:$client" \
			--listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
			--initial-cluster "rivora-test=http://127.0.0.1:$peer" --initial-cluster-state new \
			--logger zap --log-level warn \
			</dev/null >"$d/etcd.log" 2>&1 &
		echo $! >"$d/etcd.pid"
		# Outlives this script; its end is stop's business, not a job of ours.
		disown
		for _ in $(seq 200); do
			if ! alive "$d/etcd.pid"; then
				break
			fi
			if curl -sf "http://127.0.0.1:$client/health" 2>/dev/null | grep -q '"health":"true"'; then
				echo "http://127.0.0.1:$client" >"$d/etcd-url"
				return 0
			fi
			sleep 0.1
		done
		if alive "$d/etcd.pid"; then
			show_log "$d/etcd.log"
			die "etcd did not become healthy on 127.0.0.1:$client within 20 s"
		fi
		lost_port_race "$d/etcd.log" || {
			show_log "$d/etcd.log"
			die "etcd exited at start"
		}
	done
	show_log "$d/etcd.log"
	die "etcd found no free port in 5 tries"
}

# Start-up on two shared cores with other builds running: generous.
READY_SECONDS=${APISERVER_READY_SECONDS:-180}

start_apiserver() {
	local d=$1 etcd_url port i
	etcd_url=$(cat "$d/etcd-url")
	for _ in 1 2 3 4 5; do
		port=$(pick_port)
		# Dual-stack Service ranges: a Service's ipFamilies are then what a
		# dual-stack cluster gives it, which the controller assigns by.
		# --endpoint-reconciler-type=none: the default reconciler publishes
		# the advertise address as the `kubernetes` Service's endpoint, and
		# validation refuses a loopback one (an error every 10 s, no
		# endpoint). No controller-manager runs either, so the tests write
		# the EndpointSlices they need themselves.
		setsid "$bin" --etcd-servers="$etcd_url" \
			--bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$port" \
			--tls-cert-file="$d/apiserver.crt" --tls-private-key-file="$d/apiserver.key" \
			--client-ca-file="$d/ca.crt" \
			--service-account-issuer=https://kubernetes.default.svc \
			--service-account-key-file="$d/sa.pub" --service-account-signing-key-file="$d/sa.key" \
			--service-cluster-ip-range=10.96.0.0/16,fd00:96::/112 \
			--authorization-mode=RBAC --allow-privileged=true \
			--cert-dir="$d/certs" --profiling=false \
			--endpoint-reconciler-type=none \
			</dev/null >"$d/apiserver.log" 2>&1 &
		echo $! >"$d/apiserver.pid"
		disown
		for ((i = 0; i < READY_SECONDS * 2; i++)); do
			alive "$d/apiserver.pid" || break
			if curl -sf --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" \
				"https://127.0.0.1:$port/readyz" >/dev/null 2>&1; then
				echo "https://127.0.0.1:$port" >"$d/server"
				return 0
			fi
			sleep 0.5
		done
		if alive "$d/apiserver.pid"; then
			show_log "$d/apiserver.log"
			die "kube-apiserver not ready on 127.0.0.1:$port within $READY_SECONDS s"
		fi
		lost_port_race "$d/apiserver.log" || {
			show_log "$d/apiserver.log"
			die "kube-apiserver exited at start"
		}
	done
	show_log "$d/apiserver.log"
	die "kube-apiserver found no free port in 5 tries"
}

write_kubeconfig() {
	local d=$1
	cat >"$d/kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: rivora-test
  cluster:
    server: $(cat "$d/server")
    certificate-authority: $d/ca.crt
users:
- name: rivora-test-admin
  user:
    client-certificate: $d/admin.crt
    client-key: $d/admin.key
contexts:
- name: rivora-test
  context:
    cluster: rivora-test
    user: rivora-test-admin
current-context: rivora-test
KC
}

start_watchdog() {
	local d=$1 watch=$2
	# The state dir on the command line is what `ours` checks before stop
	# signals this process.
	# shellcheck disable=SC2016 # expanded by the inner bash, from its arguments
	setsid bash -c '
		while kill -0 "$1" 2>/dev/null; do sleep 1; done
		exec "$2" stop "$3"' apiserver-watchdog "$watch" "$root/scripts/apiserver.sh" "$d" \
		</dev/null >/dev/null 2>&1 &
	echo $! >"$d/watchdog.pid"
	disown
}

cmd_start() {
	[ $# -eq 1 ] || die "usage: apiserver.sh start STATE_DIR"
	local d=$1 t
	[ -x "$bin" ] || die "$bin is missing: run 'make apiserver' (scripts/apiserver.sh build) first"
	for t in etcd openssl curl ss setsid; do
		command -v "$t" >/dev/null 2>&1 || die "$t is missing: run scripts/deps.sh etcd-server openssl curl iproute2 util-linux"
	done
	# An empty directory (a caller's mktemp -d) is taken as it is.
	if [ -d "$d" ] && [ -z "$(ls -A "$d")" ]; then
		rmdir "$d"
	fi
	if [ -d "$d" ]; then
		d=$(cd "$d" && pwd)
		[ -f "$d/$marker" ] || die "$d exists and was not made by apiserver.sh start"
		# Started before and still serving: nothing to do.
		if alive "$d/etcd.pid" && alive "$d/apiserver.pid" && [ -f "$d/kubeconfig" ] &&
			curl -sf --cacert "$d/ca.crt" --cert "$d/admin.crt" --key "$d/admin.key" \
				"$(cat "$d/server")/readyz" >/dev/null 2>&1; then
			echo "$d/kubeconfig"
			return 0
		fi
		stop_dir "$d"
	fi
	mkdir -p "$(dirname "$d")"
	mkdir -m 0700 "$d"
	d=$(cd "$d" && pwd)
	touch "$d/$marker"
	# Whatever fails from here, or interrupts, leaves no process and no
	# directory.
	starting=$d
	trap 'stop_dir "$starting" || true' EXIT
	trap 'exit 130' INT TERM HUP
	certs "$d"
	start_etcd "$d"
	start_apiserver "$d"
	write_kubeconfig "$d"
	if [ -n "${APISERVER_WATCH_PID:-}" ]; then
		start_watchdog "$d" "$APISERVER_WATCH_PID"
	fi
	trap - EXIT INT TERM HUP
	echo "$d/kubeconfig"
}

case "${1:-}" in
build)
	shift
	[ $# -eq 0 ] || die "usage: apiserver.sh build"
	cmd_build
	;;
start)
	shift
	cmd_start "$@"
	;;
stop)
	shift
	cmd_stop "$@"
	;;
*)
	die "usage: apiserver.sh build | start STATE_DIR | stop STATE_DIR"
	;;
esac
