#!/usr/bin/env bash
# make bench-lab: Rivora against what users would pick instead, on one
# machine, in one run (issue 6). A lab of network namespaces:
#
#   client (c0 10.210.1.2) -- (n0 10.210.1.1) node (br0 10.210.2.1) -- b1 10.210.2.11
#                                                                     -- b2 10.210.2.12
#                                                                     -- b3 10.210.2.13
#
# The node is switched between paths, interleaved within each repetition:
#   direct      the node as a plain router; the client targets backend 1
#   nft_dnat    kube-proxy's nftables shape: a verdict map on
#               daddr . l4proto . dport, then numgen random mod 3 -> dnat to
#               (the iperf3 service uses jhash ip saddr mod 3, as iperf3's
#               control and data connections must reach the same backend)
#   rivora_nat  the release rivorad, NAT VIP (XDP on n0, tc_nat on n0 egress)
#   haproxy     haproxy in TCP mode on the node (roundrobin; source for iperf3)
# and measured with:
#   tcp   iperf3, one stream, 5 s, client TSO/GSO off on every path (XDP on
#         n0 clears GSO on c0 anyway: see ../shared/lab-notes.md)
#   cps   wrk against nginx backends with "Connection: close": every request
#         is a new TCP connection
#
# Environment: REPS (default 3), PATHS (default "direct nft_dnat rivora_nat
# haproxy"), DURATION (seconds per measure, default 5), WRK_CONNS (default
# 32), RESULTS (default target/bench/results.json; empty: do not write).
# Prints one "RESULT" line per run, then a table of medians with min-max and
# ratios to direct and nft_dnat, and merges lab_tcp_gbps_<path> and
# lab_cps_<path> into $RESULTS. Everything is torn down on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
PATHS=${PATHS:-"direct nft_dnat rivora_nat haproxy"}
DURATION=${DURATION:-5}
WRK_CONNS=${WRK_CONNS:-32}
RESULTS=${RESULTS-target/bench/results.json}
BIN=./target/release

TAG="rlb$$"
NS_C="${TAG}c"; NS_N="${TAG}n"; NS_B=("${TAG}b1" "${TAG}b2" "${TAG}b3")
WORK=$(mktemp -d /tmp/rivora-lab.XXXXXX)
PINS="/sys/fs/bpf/rivora-lab-$$"
VIP=10.210.100.1
BACKENDS=(10.210.2.11 10.210.2.12 10.210.2.13)
PIDS=()       # long-lived: servers in the backends
PATH_PID=""   # the running rivorad or haproxy, if any
CURRENT=""    # the path the node is set up for

in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }
log() { printf '%s\n' "$*" >&2; }
# Stop a process we started, and its children should it have forked.
stop_pid() { pkill -TERM -P "$1" 2>/dev/null || true; kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

cleanup() {
	set +e
	[ -n "$CURRENT" ] && "down_$CURRENT" 2>/dev/null
	for p in "${PIDS[@]}"; do stop_pid "$p"; done
	wait 2>/dev/null
	for ns in "$NS_C" "$NS_N" "${NS_B[@]}"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "$PINS" "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || { echo "lab-bench needs root (network namespaces, BPF)" >&2; exit 1; }
for t in iperf3 wrk nft haproxy nginx ethtool nsenter python3 curl; do
	command -v "$t" >/dev/null || PATH="$PATH:/usr/sbin:/sbin" command -v "$t" >/dev/null ||
		{ echo "lab-bench: $t missing (scripts/deps.sh iperf3 wrk nftables haproxy nginx conntrack curl)" >&2; exit 1; }
done
export PATH="$PATH:/usr/sbin:/sbin"
for p in $PATHS; do
	case $p in rivora_*) [ -x "$BIN/rivorad" ] || { echo "lab-bench: build first (cargo build --release --bins)" >&2; exit 1; } ;; esac
done

# ---------------------------------------------------------------- the lab
lab_up() {
	for ns in "$NS_C" "$NS_N" "${NS_B[@]}"; do
		ip netns add "$ns"
		in_ns "$ns" ip link set lo up
		# No TIME_WAIT sockets: wrk makes ~25k connections/s over the same
		# few address pairs, and TIME_WAIT left by one path's run (60 s)
		# made the next paths' SYNs wait for retransmits (conn/s fell from
		# ~25k to under 1k in whole runs). Same for every path.
		echo 0 | in_ns "$ns" tee /proc/sys/net/ipv4/tcp_max_tw_buckets >/dev/null
	done
	ip link add c0 netns "$NS_C" type veth peer name n0 netns "$NS_N"
	in_ns "$NS_C" ip addr add 10.210.1.2/24 dev c0
	in_ns "$NS_C" ip link set c0 up
	in_ns "$NS_C" ip route add "$VIP/32" via 10.210.1.1
	in_ns "$NS_C" ip route add 10.210.2.0/24 via 10.210.1.1
	# Complete checksums from the client (as a NIC hands them); no TSO/GSO
	# on any path, so the node's per-packet cost shows (lab-notes).
	in_ns "$NS_C" ethtool -K c0 tx off tso off gso off >/dev/null
	in_ns "$NS_N" ip addr add 10.210.1.1/24 dev n0
	in_ns "$NS_N" ip link set n0 up
	in_ns "$NS_N" ip link add br0 type bridge stp_state 0 mcast_snooping 0
	in_ns "$NS_N" ip addr add 10.210.2.1/24 dev br0
	in_ns "$NS_N" ip link set br0 up
	echo 1 | in_ns "$NS_N" tee /proc/sys/net/ipv4/ip_forward >/dev/null
	echo 0 | in_ns "$NS_N" tee /proc/sys/net/ipv4/conf/all/send_redirects >/dev/null
	for i in 1 2 3; do
		local ns=${NS_B[$((i - 1))]} a=${BACKENDS[$((i - 1))]}
		ip link add "b$i" netns "$ns" type veth peer name "nb$i" netns "$NS_N"
		in_ns "$NS_N" ip link set "nb$i" master br0 up
		in_ns "$ns" ip addr add "$a/24" dev "b$i"
		in_ns "$ns" ip link set "b$i" up
		in_ns "$ns" ip route add default via 10.210.2.1
		# nginx, one worker (the backends share the machine's 2 cores)
		mkdir -p "$WORK/ngx$i/www" "$WORK/ngx$i/tmp"
		echo "backend-$i" >"$WORK/ngx$i/www/index.html"
		cat >"$WORK/ngx$i/nginx.conf" <<NGX
daemon off;
worker_processes 1;
pid $WORK/ngx$i/nginx.pid;
error_log $WORK/ngx$i/error.log;
events { worker_connections 4096; }
http {
	access_log off;
	client_body_temp_path $WORK/ngx$i/tmp;
	proxy_temp_path $WORK/ngx$i/tmp;
	fastcgi_temp_path $WORK/ngx$i/tmp;
	uwsgi_temp_path $WORK/ngx$i/tmp;
	scgi_temp_path $WORK/ngx$i/tmp;
	server { listen $a:8080 reuseport backlog=4096; root $WORK/ngx$i/www; }
}
NGX
		nsenter --net="/run/netns/$ns" nginx -c "$WORK/ngx$i/nginx.conf" -p "$WORK/ngx$i" -e "$WORK/ngx$i/error.log" &
		PIDS+=($!)
		nsenter --net="/run/netns/$ns" iperf3 -s -B "$a" -p 5201 >"$WORK/iperf3-$i.log" 2>&1 &
		PIDS+=($!)
	done
	for a in "${BACKENDS[@]}"; do
		for _ in $(seq 50); do in_ns "$NS_C" curl -s -o /dev/null --max-time 1 "http://$a:8080/" && break; sleep 0.1; done
	done
}

# ----------------------------------------------------------- the paths
# Each path has up_<path> and down_<path>, and sets TARGET (what the client
# connects to).

up_direct() { TARGET=${BACKENDS[0]}; HTTP_PORT=8080; }
down_direct() { :; }

up_nft_dnat() {
	TARGET=$VIP; HTTP_PORT=80
	local b1=${BACKENDS[0]} b2=${BACKENDS[1]} b3=${BACKENDS[2]}
	in_ns "$NS_N" nft -f - <<NFT
table ip rivlab {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { $VIP . tcp . 80 : goto svc-http, $VIP . tcp . 5201 : goto svc-iperf }
	}
	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		ip daddr . meta l4proto . th dport vmap @service-ips
	}
	chain svc-http {
		numgen random mod 3 vmap { 0 : goto sep-http-1, 1 : goto sep-http-2, 2 : goto sep-http-3 }
	}
	chain sep-http-1 {
		meta l4proto tcp dnat to $b1:8080
	}
	chain sep-http-2 {
		meta l4proto tcp dnat to $b2:8080
	}
	chain sep-http-3 {
		meta l4proto tcp dnat to $b3:8080
	}
	chain svc-iperf {
		jhash ip saddr mod 3 vmap { 0 : goto sep-iperf-1, 1 : goto sep-iperf-2, 2 : goto sep-iperf-3 }
	}
	chain sep-iperf-1 {
		meta l4proto tcp dnat to $b1:5201
	}
	chain sep-iperf-2 {
		meta l4proto tcp dnat to $b2:5201
	}
	chain sep-iperf-3 {
		meta l4proto tcp dnat to $b3:5201
	}
}
NFT
}
down_nft_dnat() { in_ns "$NS_N" nft delete table ip rivlab; }

up_rivora_nat() {
	TARGET=$VIP; HTTP_PORT=80
	local b
	{
		echo "interfaces:"
		echo "  - name: n0"
		echo "healthCheck: { type: tcp, interval: 1s, timeout: 500ms, rise: 1, fall: 3 }"
		echo "api:"
		echo "  socket: $WORK/rivorad.sock"
		echo "vips:"
		echo "  - { name: http, address: $VIP, port: 80, protocol: tcp, mode: nat, backends: ["
		for b in "${BACKENDS[@]}"; do echo "      { address: $b, port: 8080 },"; done
		echo "    ] }"
		echo "  - { name: iperf, address: $VIP, port: 5201, protocol: tcp, mode: nat, affinity: { type: clientIP }, healthCheck: false, backends: ["
		for b in "${BACKENDS[@]}"; do echo "      { address: $b, port: 5201 },"; done
		echo "    ] }"
	} >"$WORK/rivora-nat.yaml"
	# No probes on the iperf3 VIP: an iperf3 server takes a probe's connect
	# for a new test's control connection and breaks the running test.
	: >"$WORK/rivorad.log"
	nsenter --net="/run/netns/$NS_N" "$BIN/rivorad" -config "$WORK/rivora-nat.yaml" -pin-dir "$PINS" -state-dir "$WORK/state" \
		>>"$WORK/rivorad.log" 2>&1 &
	PATH_PID=$!
	for _ in $(seq 100); do grep -q 'ready' "$WORK/rivorad.log" && break; sleep 0.1; done
	grep -q 'ready' "$WORK/rivorad.log" || { cat "$WORK/rivorad.log" >&2; log "rivorad did not start"; return 1; }
}
down_rivora_nat() {
	[ -n "$PATH_PID" ] && stop_pid "$PATH_PID"
	PATH_PID=""
	"$BIN/rivorad" -cleanup -pin-dir "$PINS" >/dev/null 2>&1 || true
	rm -rf "$PINS"
}

up_haproxy() {
	TARGET=$VIP; HTTP_PORT=80
	in_ns "$NS_N" ip addr add "$VIP/32" dev lo
	{
		echo "global"
		echo "  maxconn 8000"
		echo "defaults"
		echo "  mode tcp"
		echo "  timeout connect 5s"
		echo "  timeout client 60s"
		echo "  timeout server 60s"
		echo "frontend http"
		echo "  bind $VIP:80"
		echo "  default_backend http"
		echo "backend http"
		echo "  balance roundrobin"
		local i=1 b
		for b in "${BACKENDS[@]}"; do echo "  server b$i $b:8080"; i=$((i + 1)); done
		echo "frontend iperf"
		echo "  bind $VIP:5201"
		echo "  default_backend iperf"
		echo "backend iperf"
		echo "  balance source"
		i=1
		for b in "${BACKENDS[@]}"; do echo "  server b$i $b:5201"; i=$((i + 1)); done
	} >"$WORK/haproxy.cfg"
	nsenter --net="/run/netns/$NS_N" haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
	PATH_PID=$!
	for _ in $(seq 50); do in_ns "$NS_C" curl -s -o /dev/null --max-time 1 "http://$VIP/" && return 0; sleep 0.1; done
	cat "$WORK/haproxy.log" >&2; log "haproxy did not start"; return 1
}
down_haproxy() {
	[ -n "$PATH_PID" ] && stop_pid "$PATH_PID"
	PATH_PID=""
	in_ns "$NS_N" ip addr del "$VIP/32" dev lo 2>/dev/null || true
}

switch_to() {
	[ -n "$CURRENT" ] && "down_$CURRENT"
	CURRENT=""
	"up_$1" || { log "path $1: setup failed"; return 1; }
	CURRENT=$1
	# The path must carry traffic before it is measured.
	local ok=0
	for _ in $(seq 30); do
		if in_ns "$NS_C" curl -s -o /dev/null --max-time 1 "http://$TARGET:$HTTP_PORT/"; then ok=1; break; fi
		sleep 0.2
	done
	[ "$ok" -eq 1 ] || { log "path $1: no answer from http://$TARGET:$HTTP_PORT/"; return 1; }
}

flush_ct() {
	command -v conntrack >/dev/null && in_ns "$NS_N" conntrack -F >/dev/null 2>&1 || true
}

# ------------------------------------------------------------ measures
measure_tcp() { # -> Gbit/s received, one stream
	flush_ct
	local j
	j=$(in_ns "$NS_C" iperf3 -c "$TARGET" -p 5201 -t "$DURATION" -J 2>"$WORK/iperf3-client.err") || {
		log "  iperf3: $(python3 -c 'import json,sys; print(json.load(sys.stdin).get("error"))' <<<"$j" 2>/dev/null) $(tail -2 "$WORK/iperf3-client.err")"
		echo nan; return
	}
	python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))' <<<"$j" 2>/dev/null || {
		log "  iperf3: $(echo "$j" | grep -i error | head -3)"
		echo nan
	}
}

measure_cps() { # -> new connections (requests with Connection: close) per second
	flush_ct
	local out
	out=$(in_ns "$NS_C" wrk -t2 -c"$WRK_CONNS" -d"${DURATION}s" -H 'Connection: close' "http://$TARGET:$HTTP_PORT/" 2>&1) || { echo nan; return; }
	echo "$out" >>"$WORK/wrk.log"
	# Connect errors and timeouts are not connections made: report them.
	if grep -q 'Socket errors' <<<"$out"; then log "  wrk: $(grep 'Socket errors' <<<"$out")"; fi
	awk '/Requests\/sec/ {print $2}' <<<"$out"
}

# ---------------------------------------------------------------- run
log "lab: client $NS_C -- node $NS_N -- backends ${NS_B[*]}; paths: $PATHS; $REPS repetitions, ${DURATION}s per measure"
lab_up
read -r -a path_list <<<"$PATHS"
n=${#path_list[@]}
: >"$WORK/results"
for rep in $(seq "$REPS"); do
	# Interleave, and rotate the order so that no path always runs first.
	for k in $(seq 0 $((n - 1))); do
		p=${path_list[$(((k + rep - 1) % n))]}
		if ! switch_to "$p"; then
			echo "RESULT rep=$rep path=$p tcp_gbps=nan cps=nan" | tee -a "$WORK/results"
			continue
		fi
		tcp=$(measure_tcp)
		cps=$(measure_cps)
		echo "RESULT rep=$rep path=$p tcp_gbps=$tcp cps=$cps" | tee -a "$WORK/results"
	done
done
[ -n "$CURRENT" ] && "down_$CURRENT"
CURRENT=""

python3 - "$WORK/results" "$RESULTS" "$PATHS" <<'PY'
import json, math, os, statistics, sys
lines, out, paths = sys.argv[1], sys.argv[2], sys.argv[3].split()
runs = {}
for line in open(lines):
    f = dict(kv.split("=", 1) for kv in line.split()[1:])
    for m in ("tcp_gbps", "cps"):
        try:
            v = float(f[m])
        except ValueError:
            continue
        if not math.isnan(v):
            runs.setdefault((f["path"], m), []).append(v)
med = {k: statistics.median(v) for k, v in runs.items()}
def ratio(p, base, m):
    b = med.get((base, m))
    return "%.2fx" % (med[(p, m)] / b) if b and (p, m) in med else "-"
units = {"tcp_gbps": "TCP 1 stream, GSO off (Gbit/s)", "cps": "new connections/s"}
print()
print("%-32s %-11s %-24s %-9s %-9s" % ("measure", "path", "median (min-max) n", "/direct", "/nft"))
for m in ("tcp_gbps", "cps"):
    for p in paths:
        v = runs.get((p, m))
        if not v:
            print("%-32s %-11s %s" % (units[m], p, "failed"))
            continue
        fmt = "%.2f" if m == "tcp_gbps" else "%.0f"
        s = (fmt + " (" + fmt + "-" + fmt + ") %d") % (med[(p, m)], min(v), max(v), len(v))
        print("%-32s %-11s %-24s %-9s %-9s" % (units[m], p, s, ratio(p, "direct", m), ratio(p, "nft_dnat", m)))
if out:
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    cur = {}
    if os.path.exists(out):
        try:
            cur = json.load(open(out))
        except ValueError:
            cur = {}
    for (p, m), v in med.items():
        cur["lab_%s_%s" % ("tcp_gbps" if m == "tcp_gbps" else "cps", p)] = v
    with open(out, "w") as fh:
        json.dump(dict(sorted(cur.items())), fh, indent=2)
        fh.write("\n")
    print("\nwrote %d lab keys to %s" % (len(med), out))
PY
