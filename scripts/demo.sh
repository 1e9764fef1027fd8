#!/usr/bin/env bash
# make demo: a client, a node running rivorad and three HTTP backends, each
# in its own network namespace; real traffic through a NAT VIP; then one
# backend dies and the health checker takes it out while traffic goes on.
# Everything is torn down on exit, also on failure or Ctrl-C.
#
# Every claim printed is checked: when something did not happen (a backend
# not stopped, a backend answering that should not), the demo says so and
# exits non-zero. It runs nothing beyond what scripts/deps.sh installs
# (make demo's DEMO_PKGS) and a minimal Debian's base: processes are
# stopped by the ids recorded when they were started, not by pkill.
set -euo pipefail
cd "$(dirname "$0")/.."

BIN=./target/release
TAG="rvd$$"
NS_C="${TAG}c"; NS_N="${TAG}n"; NS_B=("${TAG}b1" "${TAG}b2" "${TAG}b3")
WORK=$(mktemp -d /tmp/rivora-demo.XXXXXX)
PINS="/sys/fs/bpf/rivora-demo-$$"
SOCK="$WORK/rivorad.sock"
VIP=10.200.100.1
PIDS=()
BACKEND_PIDS=()

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
fail() { printf '\n\033[1;31mdemo FAILED: %s\033[0m\n' "$*" >&2; exit 1; }
in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }

cleanup() {
	set +e
	for p in "${PIDS[@]}" "${BACKEND_PIDS[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	for ns in "$NS_C" "$NS_N" "${NS_B[@]}"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "$PINS" "$WORK"
}
trap cleanup EXIT INT TERM

[ "$(id -u)" -eq 0 ] || { echo "make demo needs root (network namespaces, BPF)" >&2; exit 1; }

say "Lab: client ($NS_C) -- node ($NS_N) -- backends (${NS_B[*]})"
for ns in "$NS_C" "$NS_N" "${NS_B[@]}"; do ip netns add "$ns"; in_ns "$ns" ip link set lo up; done
ip link add c0 netns "$NS_C" type veth peer name n0 netns "$NS_N"
in_ns "$NS_C" ip addr add 10.200.1.2/24 dev c0
in_ns "$NS_C" ip link set c0 up
in_ns "$NS_C" ip route add "$VIP/32" via 10.200.1.1
in_ns "$NS_C" ip route add 10.200.2.0/24 via 10.200.1.1
# The client hands the node complete checksums (as a NIC does).
in_ns "$NS_C" ethtool -K c0 tx off >/dev/null
in_ns "$NS_N" ip addr add 10.200.1.1/24 dev n0
in_ns "$NS_N" ip link set n0 up
in_ns "$NS_N" ip link add br0 type bridge
in_ns "$NS_N" ip addr add 10.200.2.1/24 dev br0
in_ns "$NS_N" ip link set br0 up
echo 1 | in_ns "$NS_N" tee /proc/sys/net/ipv4/ip_forward >/dev/null
for i in 1 2 3; do
	ns=${NS_B[$((i - 1))]}
	ip link add "b$i" netns "$ns" type veth peer name "nb$i" netns "$NS_N"
	in_ns "$NS_N" ip link set "nb$i" master br0 up
	in_ns "$ns" ip addr add "10.200.2.1$i/24" dev "b$i"
	in_ns "$ns" ip link set "b$i" up
	in_ns "$ns" ip route add default via 10.200.2.1
	mkdir -p "$WORK/www$i"
	echo "backend-$i" >"$WORK/www$i/index.html"
	# nsenter execs python3 (it forks only to enter a PID namespace), so
	# $! is the server itself and killing it stops the backend.
	nsenter --net="/run/netns/$ns" python3 -m http.server 8080 --bind 10.200.2.1$i --directory "$WORK/www$i" >/dev/null 2>&1 &
	BACKEND_PIDS+=($!)
done

cat >"$WORK/rivora.yaml" <<YAML
interfaces:
  - name: n0
healthCheck: { type: http, path: /, interval: 1s, timeout: 500ms, rise: 2, fall: 2 }
api:
  socket: $SOCK
vips:
  - name: demo-web
    address: $VIP
    port: 80
    protocol: tcp
    mode: nat
    backends:
      - { address: 10.200.2.11, port: 8080 }
      - { address: 10.200.2.12, port: 8080 }
      - { address: 10.200.2.13, port: 8080 }
YAML
say "rivorad -config rivora.yaml (NAT VIP $VIP:80 -> three backends :8080)"
sed 's/^/    /' "$WORK/rivora.yaml"
# Started by nsenter itself, not through the in_ns function: a backgrounded
# function is a subshell, and killing it left rivorad running.
nsenter --net="/run/netns/$NS_N" "$BIN/rivorad" -config "$WORK/rivora.yaml" -pin-dir "$PINS" -state-dir "$WORK/state" \
	>"$WORK/rivorad.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 100); do grep -q '"ready"\|ready$' "$WORK/rivorad.log" 2>/dev/null && break; sleep 0.1; done
grep -q 'ready' "$WORK/rivorad.log" || { cat "$WORK/rivorad.log"; fail "rivorad did not start"; }
# Let the backends' HTTP servers come up.
for i in 1 2 3; do
	up=no
	for _ in $(seq 50); do
		in_ns "${NS_B[$((i - 1))]}" bash -c "exec 3<>/dev/tcp/10.200.2.1$i/8080" 2>/dev/null && { up=yes; break; }
		sleep 0.1
	done
	[ "$up" = yes ] || fail "backend-$i's HTTP server did not come up"
done

requests() {
	local n=$1 ok=0 fail=0
	: >"$WORK/answers"
	for _ in $(seq "$n"); do
		if a=$(in_ns "$NS_C" curl -s --max-time 2 "http://$VIP/"); then
			echo "$a" >>"$WORK/answers"; ok=$((ok + 1))
		else
			fail=$((fail + 1))
		fi
	done
	sort "$WORK/answers" | uniq -c | sed 's/^/    /'
	echo "    $ok answered, $fail failed"
	[ "$fail" -eq 0 ] || fail "$fail of $n requests failed"
}

# answered NAME: how many of the last round's answers came from NAME.
answered() { grep -cx "$1" "$WORK/answers" || true; }

say "300 requests from the client to http://$VIP/"
requests 300
for i in 1 2 3; do
	[ "$(answered "backend-$i")" -gt 0 ] || fail "backend-$i never answered: the VIP does not spread over all three"
done

say "rivoractl stats"
"$BIN/rivoractl" --socket "$SOCK" stats || fail "rivoractl stats failed"

say "Stopping backend-2's server: the health checker takes it out"
kill "${BACKEND_PIDS[1]}" || fail "could not stop backend-2's server (pid ${BACKEND_PIDS[1]})"
wait "${BACKEND_PIDS[1]}" 2>/dev/null || true
if in_ns "${NS_B[1]}" bash -c "exec 3<>/dev/tcp/10.200.2.12/8080" 2>/dev/null; then
	fail "backend-2 still accepts connections after it was stopped"
fi
down=no
for _ in $(seq 50); do
	grep -q 'health changed.*10.200.2.12.*up=false' "$WORK/rivorad.log" && { down=yes; break; }
	sleep 0.2
done
grep 'health changed' "$WORK/rivorad.log" | sed 's/^/    /' || true
[ "$down" = yes ] || fail "rivorad did not log backend-2 (10.200.2.12) as down within 10 s"
"$BIN/rivoractl" --socket "$SOCK" backend list || fail "rivoractl backend list failed"

say "300 more requests: only backend-1 and backend-3 answer, none fails"
requests 300
[ "$(answered backend-2)" -eq 0 ] || fail "backend-2 answered $(answered backend-2) requests after it was stopped"
for i in 1 3; do
	[ "$(answered "backend-$i")" -gt 0 ] || fail "backend-$i did not answer"
done

say "Done: every step above was checked; tearing the lab down"
