#!/usr/bin/env bash
# The lab bench (issue 6): Rivora against what users would pick instead,
# on one machine, in one run. `make bench` runs it after the micro
# benchmarks; `make bench-lab` runs it alone. BENCHMARKS.md explains the
# lab, the measures and how to read them.
#
# One L2 segment (a bridge in a namespace of its own) carrying two subnets,
# the shape DSR needs and the one tests/common/lab.rs uses:
#
#   client c0 10.210.1.2 ---+                      +--- b1 10.210.2.11
#                           +-- [br0 in switch] ---+--- b2 10.210.2.12
#   node NODEIF 10.210.1.1 -+                      +--- b3 10.210.2.13
#               10.210.2.1
#
# Paths, switched on the node and interleaved within each repetition:
#   direct        the node as a plain router; the client targets backend 1
#   nft_dnat      kube-proxy's nftables shape (verdict map, numgen / jhash,
#                 dnat to)
#   rivora_nat    the release rivorad, NAT VIPs
#   rivora_dsr    the release rivorad, DSR VIPs; backends hold the VIP on lo
#                 and answer the client on-link
#   rivora_l3dsr  the release rivorad, L3 DSR (IPIP) VIPs; backends also run
#                 Rivora's decap program (this machine has no ipip module)
#   rivora_fullnat
#                 the release rivorad, full-NAT VIPs: requests leave with
#                 the node's 10.210.2.1 and a port of node.snat.ports as
#                 source. The backends' default route (via the node) is
#                 removed for this path, so they have no route to the
#                 client's subnet at all: every reply reaches the client
#                 only because it was addressed to the node (checked before
#                 the path is measured). udpTimeout is the shortest allowed
#                 (2s): a new flow every packet takes every port towards
#                 each backend within a fraction of a second (31,744 ports
#                 x 3 backends); the measure after it waits that long, so
#                 the following ones are not measuring an exhausted range.
#                 Its new-flow figures are bounded by that range, not by
#                 the node: ports x backends / udpTimeout flows a second.
#   haproxy       haproxy in TCP mode on the node (no UDP)
# Measures (each path, each repetition):
#   tcp1, tcp4    iperf3, one and four streams, client TSO/GSO off
#   cps           wrk with "Connection: close" against nginx: new connections/s
#   rr            wrk, one connection, one request at a time: latency p50/p99
#   pps_1, pps_64k, pps_new
#                 64-byte UDP frames from trafgen on core 0, one flow, 64k
#                 flows (source ports 1-65535), a new flow every packet
#                 (random source address in 10.211/16 and port); counted as
#                 delivered by an nft rule in each backend; the node's
#                 receive path (threaded NAPI) pinned to core 1, whose busy
#                 time per delivered packet is reported as cpu_ns, and the
#                 time of the node's receive threads alone (its NAPI thread
#                 and core 1's ksoftirqd, whatever else runs on core 1) as
#                 node_ns
#   xpps          the same three, from the second generator: live XDP
#                 frames (`rivora-bench xdpgen`, BPF_PROG_TEST_RUN with
#                 BPF_F_TEST_XDP_LIVE_FRAMES on core 0) redirected from the
#                 switch's namespace into pn, so the node's XDP program gets
#                 xdp_frames, as from a NIC, where trafgen's skbs make veth
#                 copy each frame first; keys xpps_*, xcpu_ns_*, xnode_ns_*
#
# Environment: LAB_NICE (nice level of the generators and the node's NAPI
# thread, default -10), REPS (default 3), PATHS (default: all seven), DURATION
# (seconds per TCP/HTTP measure, default 4), PPS_DURATION (seconds per
# packet-rate measure, default 3), MEASURES (default "pps xpps tcp1 tcp4 cps rr"),
# WRK_CONNS (default 32), RESULTS (default target/bench/results.json; empty:
# write nothing), SC_PASS (non-empty: xdp_pass on the switch port facing
# the client too, so frames reach the node with XDP headroom as from a NIC;
# it moves veth's copy from the node's core to the generator's, which then
# caps every path: an experiment, not the published setup), OUT (directory
# for the chart and the raw runs, default
# target/bench), PROFILE (non-empty: perf record core 1 during each packet-rate
# measure and every core during each TCP and connections/s measure, reports in
# OUT/perf-<path>-<measure>.txt). Everything is torn down on exit, also on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

REPS=${REPS:-3}
PATHS=${PATHS:-"direct nft_dnat rivora_nat rivora_dsr rivora_l3dsr rivora_fullnat haproxy"}
DURATION=${DURATION:-4}
PPS_DURATION=${PPS_DURATION:-3}
# Packet rates first: rivorad starts with empty flow tables for each path,
# and the HTTP measures leave 100k+ stale connections in them (see
# BENCHMARKS.md: with them, a 64k-flow working set no longer fits).
MEASURES=${MEASURES:-"pps xpps tcp1 tcp4 cps rr"}
WRK_CONNS=${WRK_CONNS:-32}
RESULTS=${RESULTS-target/bench/results.json}
OUT=${OUT:-target/bench}
PROFILE=${PROFILE:-}
BIN=./target/release

TAG="rlb$$"
NS_S="${TAG}s"; NS_C="${TAG}c"; NS_N="${TAG}n"; NS_B=("${TAG}b1" "${TAG}b2" "${TAG}b3")
# The node's interface name is unique on the machine: its NAPI thread is
# found by name (napi/<ifname>-<id>) to be pinned.
NODEIF="rn$$"
WORK=$(mktemp -d /tmp/rivora-lab.XXXXXX)
PINS="/sys/fs/bpf/rivora-lab-$$"
VIP=10.210.100.1
NODE_C=10.210.1.1
NODE_B=10.210.2.1
CLIENT=10.210.1.2
BACKENDS=(10.210.2.11 10.210.2.12 10.210.2.13)
HTTP_PORT=8080
IPERF_PORT=5201
SINK_PORT=9999
PIDS=()       # long-lived: servers, XDP holders
NGINX_PIDS=() # the backends' nginx masters (their workers are children)
PATH_PIDS=()  # what the current path runs (rivorad, haproxy, decap holders)
CURRENT=""    # the path the node is set up for
# Full NAT's UDP idle timeout in the lab (the shortest rivorad takes), and
# the pause after a new-flow measure on a path that needs one.
FULLNAT_UDP_TIMEOUT=2
SETTLE_AFTER_NEW=0
GEN_CPU=0     # trafgen
RX_CPU=1      # the node's NAPI thread
# The generators and the node's NAPI thread run at this nice level: on a
# machine other work keeps busy (builds on both cores), at nice 0 the NAPI
# thread got 8% of its core and every figure measured the scheduler. A
# weight, not a real-time class: others slow down, none starves.
LAB_NICE=${LAB_NICE:--10}

in_ns() { local ns=$1; shift; nsenter --net="/run/netns/$ns" "$@"; }
# sysfs of a namespace: `ip netns exec` remounts /sys (and hides bpffs,
# which only this needs not).
sysfs_ns() { ip netns exec "$1" sh -c "$2"; }
log() { printf '%s\n' "$*" >&2; }
stop_pid() { pkill -TERM -P "$1" 2>/dev/null || true; kill "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }

cleanup() {
	set +e
	[ -n "$CURRENT" ] && "down_$CURRENT" 2>/dev/null
	for p in "${PATH_PIDS[@]}" "${PIDS[@]}"; do stop_pid "$p"; done
	wait 2>/dev/null
	for ns in "$NS_C" "$NS_N" "${NS_B[@]}" "$NS_S"; do ip netns del "$ns" 2>/dev/null; done
	"$BIN/rivorad" -cleanup -pin-dir "$PINS" >/dev/null 2>&1
	rm -rf "$PINS" "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

[ "$(id -u)" -eq 0 ] || { echo "lab-bench needs root (network namespaces, BPF)" >&2; exit 1; }
export PATH="$PATH:/usr/sbin:/sbin"
for t in iperf3 wrk nft haproxy nginx ethtool nsenter taskset python3 curl trafgen conntrack cc; do
	command -v "$t" >/dev/null ||
		{ echo "lab-bench: $t missing (make bench-lab installs what it needs)" >&2; exit 1; }
done
[ -x "$BIN/rivorad" ] && [ -x "$BIN/rivora-bench" ] || { echo "lab-bench: build first (cargo build --workspace --release --bins)" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "lab-bench: needs 2 cores (generator and node apart)" >&2; exit 1; }

# trafgen sizes its AF_PACKET send buffer through net.core.wmem_*, which is
# read-only in a namespace; with the receiver on another core the ring then
# fails to flush ("Resource temporarily unavailable"). Force a large send
# buffer on its packet sockets instead (SO_SNDBUFFORCE, 64 MB, through an
# LD_PRELOAD shim: with it trafgen 0.6.8 stopped aborting here).
build_sndbuf_shim() {
	cat >"$WORK/sndbuf.c" <<'C'
#define _GNU_SOURCE
#include <dlfcn.h>
#include <sys/socket.h>

int socket(int domain, int type, int protocol)
{
	static int (*real)(int, int, int);
	int fd, size = 64 << 20;

	if (!real)
		real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
	fd = real(domain, type, protocol);
	if (fd >= 0 && domain == AF_PACKET)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size));
	return fd;
}
C
	cc -shared -fPIC -O2 -o "$WORK/sndbuf.so" "$WORK/sndbuf.c" -ldl
}

# ---------------------------------------------------------------- the lab
sysctl_ns() { local ns=$1; shift; local kv; for kv in "$@"; do in_ns "$ns" sysctl -qw "$kv" >/dev/null; done; }

lab_up() {
	for ns in "$NS_S" "$NS_C" "$NS_N" "${NS_B[@]}"; do
		ip netns add "$ns"
		in_ns "$ns" ip link set lo up
		# No TIME_WAIT: wrk makes tens of thousands of connections a second
		# over a few address pairs; TIME_WAIT left by one path made the
		# next path's SYNs wait for retransmits. Same for every path.
		sysctl_ns "$ns" net.ipv4.tcp_max_tw_buckets=0 net.ipv4.conf.all.accept_redirects=0 \
			net.ipv4.conf.default.accept_redirects=0 net.ipv4.conf.all.rp_filter=0 net.ipv4.conf.default.rp_filter=0
	done
	in_ns "$NS_S" ip link add br0 type bridge stp_state 0 mcast_snooping 0
	in_ns "$NS_S" ip link set br0 up
	# A switch, not a firewall: with br_netfilter loaded (Docker loads
	# it) every bridged frame went through the IP hooks, a fifth of the
	# receive core's time in a profile.
	if [ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]; then
		sysctl_ns "$NS_S" net.bridge.bridge-nf-call-iptables=0 net.bridge.bridge-nf-call-ip6tables=0 \
			net.bridge.bridge-nf-call-arptables=0
	fi
	plug() { # ns ifname switch-port-name
		ip link add "$2" netns "$1" type veth peer name "$3" netns "$NS_S"
		in_ns "$NS_S" ip link set "$3" master br0 up
		in_ns "$1" ip link set "$2" up
	}
	plug "$NS_C" c0 sc
	plug "$NS_N" "$NODEIF" pn
	for i in 1 2 3; do plug "${NS_B[$((i - 1))]}" "b$i" "sb$i"; done
	# L3 DSR adds 20 bytes to what the client sends: the segment behind the
	# client carries 1600-byte frames, as an L3 DSR fabric must (the
	# client's own link stays at 1500, so its MSS is that of a normal host).
	for i in 1 2 3; do
		in_ns "$NS_S" ip link set "sb$i" mtu 1600
		in_ns "${NS_B[$((i - 1))]}" ip link set "b$i" mtu 1600
	done
	in_ns "$NS_S" ip link set pn mtu 1600
	in_ns "$NS_N" ip link set "$NODEIF" mtu 1600

	in_ns "$NS_C" ip addr add "$CLIENT/24" dev c0
	in_ns "$NS_C" ip route add "$VIP/32" via "$NODE_C"
	in_ns "$NS_C" ip route add 10.210.2.0/24 via "$NODE_C"
	# Complete checksums and no TSO/GSO from the client, on every path: XDP
	# on the node clears GSO on its peer anyway, and frames a node sends
	# back out with XDP_TX must carry complete checksums.
	in_ns "$NS_C" ethtool -K c0 tx off tso off gso off >/dev/null

	in_ns "$NS_N" ip addr add "$NODE_C/24" dev "$NODEIF"
	in_ns "$NS_N" ip addr add "$NODE_B/24" dev "$NODEIF"
	# One interface: everything the node forwards goes out where it came
	# in, so no redirects. accept_local: an L3 DSR packet the FIB cannot
	# finish yet goes to the kernel with the node's own source address.
	sysctl_ns "$NS_N" net.ipv4.ip_forward=1 net.ipv4.conf.all.send_redirects=0 \
		"net.ipv4.conf.$NODEIF.send_redirects=0" net.ipv4.conf.all.accept_local=1 \
		"net.ipv4.conf.$NODEIF.accept_local=1" "net.ipv4.conf.$NODEIF.rp_filter=0"

	# veth hands a frame to its peer's NAPI (where the pinned thread runs)
	# only when the sending side has no TSO, or the frame is a local
	# socket's; otherwise it goes to the sending core's backlog. Attaching
	# XDP to the node clears pn's TSO anyway: clear it for every path, or
	# the kernel paths would be served by the generator's core.
	in_ns "$NS_S" ethtool -K pn tso off gso off >/dev/null
	if [ -n "${SC_PASS:-}" ]; then hold_xdp "$NS_S" sc pass; PIDS+=("$HOLD_PID"); fi

	for i in 1 2 3; do
		local ns=${NS_B[$((i - 1))]} a=${BACKENDS[$((i - 1))]}
		in_ns "$ns" ip addr add "$a/24" dev "b$i"
		in_ns "$ns" ip route add default via "$NODE_B"
		# For the DSR paths' VIP on lo: answer ARP for it nowhere.
		sysctl_ns "$ns" net.ipv4.conf.all.arp_ignore=1 net.ipv4.conf.all.arp_announce=2 "net.ipv4.conf.b$i.rp_filter=0"
		# The packet-rate sink: count and drop before conntrack.
		in_ns "$ns" nft -f - <<NFT
table ip sink {
	counter delivered { }
	chain pre {
		type filter hook prerouting priority raw; policy accept;
		udp dport $SINK_PORT counter name delivered drop
	}
}
NFT
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
	server { listen $HTTP_PORT reuseport backlog=4096; root $WORK/ngx$i/www; }
}
NGX
		# Wildcard listeners: the backend's own address (NAT, nft, haproxy,
		# direct) and the VIP on lo (DSR, L3 DSR) alike.
		nsenter --net="/run/netns/$ns" nginx -c "$WORK/ngx$i/nginx.conf" -p "$WORK/ngx$i" -e "$WORK/ngx$i/error.log" &
		PIDS+=($!)
		NGINX_PIDS+=($!)
		nsenter --net="/run/netns/$ns" iperf3 -s -p "$IPERF_PORT" >"$WORK/iperf3-$i.log" 2>&1 &
		PIDS+=($!)
	done
	# Warm the node's neighbour table (XDP does not resolve neighbours) and
	# check every backend answers.
	for a in "${BACKENDS[@]}"; do
		in_ns "$NS_N" ping -c1 -W1 "$a" >/dev/null || true
		local ok=0
		for _ in $(seq 50); do
			if in_ns "$NS_C" curl -s -o /dev/null --max-time 1 "http://$a:$HTTP_PORT/"; then ok=1; break; fi
			sleep 0.1
		done
		[ "$ok" -eq 1 ] || { log "lab: backend $a does not answer"; return 1; }
	done
	in_ns "$NS_N" ping -c1 -W1 "$CLIENT" >/dev/null || true
	NODE_MAC=$(sysfs_ns "$NS_N" "cat /sys/class/net/$NODEIF/address")
	CLIENT_MAC=$(sysfs_ns "$NS_C" "cat /sys/class/net/c0/address")
}

# Run `rivora-bench lab-xdp IFACE PROG [VIP...]` in a namespace and wait
# until it has attached; HOLD_PID is the holder (the link goes with it).
hold_xdp() {
	local ns=$1 ifc=$2; shift 2
	local out="$WORK/hold-$ns-$ifc.log"
	nsenter --net="/run/netns/$ns" "$BIN/rivora-bench" lab-xdp "$ifc" "$@" >"$out" 2>&1 &
	HOLD_PID=$!
	for _ in $(seq 100); do
		grep -q attached "$out" && return 0
		kill -0 "$HOLD_PID" 2>/dev/null || break
		sleep 0.05
	done
	cat "$out" >&2
	log "lab: could not attach $* to $ifc in $ns"
	return 1
}

# ----------------------------------------------------------- the paths
# up_<path> sets TARGET (what the client sends to); down_<path> undoes.

up_direct() { TARGET=${BACKENDS[0]}; }
down_direct() { :; }

up_nft_dnat() {
	TARGET=$VIP
	local svc chain proto port sel i
	{
		echo "table ip rivlab {"
		echo "  map service-ips {"
		echo "    type ipv4_addr . inet_proto . inet_service : verdict"
		echo "    elements = { $VIP . tcp . $HTTP_PORT : goto svc-http, $VIP . tcp . $IPERF_PORT : goto svc-iperf, $VIP . udp . $SINK_PORT : goto svc-sink }"
		echo "  }"
		echo "  chain prerouting {"
		echo "    type nat hook prerouting priority dstnat; policy accept;"
		echo "    ip daddr . meta l4proto . th dport vmap @service-ips"
		echo "  }"
		# iperf3's control and data connections must reach one backend:
		# that service hashes the client address, as sessionAffinity would.
		for svc in "http tcp $HTTP_PORT numgen random mod 3" "iperf tcp $IPERF_PORT jhash ip saddr mod 3" \
			"sink udp $SINK_PORT numgen random mod 3"; do
			read -r chain proto port sel <<<"$svc"
			echo "  chain svc-$chain {"
			echo "    $sel vmap { 0 : goto sep-$chain-1, 1 : goto sep-$chain-2, 2 : goto sep-$chain-3 }"
			echo "  }"
			for i in 1 2 3; do
				echo "  chain sep-$chain-$i {"
				echo "    meta l4proto $proto dnat to ${BACKENDS[$((i - 1))]}:$port"
				echo "  }"
			done
		done
		echo "}"
	} >"$WORK/nft-dnat.nft"
	in_ns "$NS_N" nft -f "$WORK/nft-dnat.nft"
}
down_nft_dnat() { in_ns "$NS_N" nft delete table ip rivlab; }

# rivorad with the three VIPs in one mode.
rivora_up() {
	local mode=$1 b
	# XDP_TX out of the node lands on pn, which delivers only when it runs
	# XDP itself. Only for Rivora's paths: on pn, XDP makes veth copy
	# every frame the kernel forwards into a fresh page first (too little
	# headroom), a cost no switch port charges the kernel paths.
	hold_xdp "$NS_S" pn pass || return 1
	PATH_PIDS+=("$HOLD_PID")
	{
		echo "interfaces:"
		echo "  - name: $NODEIF"
		echo "node:"
		echo "  tunnelSource: { ipv4: $NODE_B }"
		if [ "$mode" = fullnat ]; then
			# The backends' side of the node, as rivorad would pick from
			# the route anyway: said here so that the lab shows it.
			echo "  snat: { ipv4: $NODE_B, udpTimeout: ${FULLNAT_UDP_TIMEOUT}s }"
		fi
		echo "healthCheck: { type: tcp, interval: 1s, timeout: 500ms, rise: 1, fall: 3 }"
		echo "api:"
		echo "  socket: $WORK/rivorad.sock"
		echo "vips:"
		echo "  - { name: http, address: $VIP, port: $HTTP_PORT, protocol: tcp, mode: $mode, backends: ["
		for b in "${BACKENDS[@]}"; do echo "      { address: $b },"; done
		echo "    ] }"
		# No probes on the iperf3 VIP: an iperf3 server takes a probe's
		# connect for a new test's control connection and breaks the test
		# in progress. clientIP affinity: control and data connections on
		# one backend.
		echo "  - { name: iperf, address: $VIP, port: $IPERF_PORT, protocol: tcp, mode: $mode, affinity: { type: clientIP }, healthCheck: false, backends: ["
		for b in "${BACKENDS[@]}"; do echo "      { address: $b },"; done
		echo "    ] }"
		echo "  - { name: sink, address: $VIP, port: $SINK_PORT, protocol: udp, mode: $mode, healthCheck: false, backends: ["
		for b in "${BACKENDS[@]}"; do echo "      { address: $b },"; done
		echo "    ] }"
	} >"$WORK/rivora-$mode.yaml"
	: >"$WORK/rivorad.log"
	nsenter --net="/run/netns/$NS_N" "$BIN/rivorad" -config "$WORK/rivora-$mode.yaml" -pin-dir "$PINS" \
		-state-dir "$WORK/state" >>"$WORK/rivorad.log" 2>&1 &
	PATH_PIDS+=($!)
	for _ in $(seq 150); do grep -q 'ready' "$WORK/rivorad.log" && return 0; sleep 0.1; done
	cat "$WORK/rivorad.log" >&2
	log "rivorad did not start"
	return 1
}
rivora_down() {
	local p
	for p in "${PATH_PIDS[@]}"; do stop_pid "$p"; done
	PATH_PIDS=()
	"$BIN/rivorad" -cleanup -pin-dir "$PINS" >/dev/null 2>&1 || true
	rm -rf "$PINS"
}

# DSR backends hold the VIP on lo and reach the client subnet on-link, so
# their answers never cross the node.
dsr_backends() { # add|del
	local i ns
	for i in 1 2 3; do
		ns=${NS_B[$((i - 1))]}
		in_ns "$ns" ip addr "$1" "$VIP/32" dev lo 2>/dev/null || [ "$1" = del ]
		in_ns "$ns" ip route "$1" 10.210.1.0/24 dev "b$i" 2>/dev/null || [ "$1" = del ]
	done
}

# Full NAT's backends have no route to the client's subnet: only the
# connected 10.210.2.0/24, where the node's source address is. A reply
# that reached the client by any other way than the node's source
# rewrite would have to be routed, and cannot be.
# And their replies leave with complete checksums (TX checksum offload
# off): full NAT turns them back in the node's XDP program, which updates
# the checksum it finds, and a veth hands over a locally generated packet
# with only the pseudo-header's sum in it (CHECKSUM_PARTIAL). Sent on with
# XDP_TX, the client dropped every SYN-ACK as corrupt. A NIC delivers
# complete checksums; NAT's replies take the kernel's path and tc_nat,
# which keep the partial sum's meaning, so the other paths keep offload on.
fullnat_backends() { # del|add (the default route via the node; add: offload back on)
	local i ns
	for i in 1 2 3; do
		ns=${NS_B[$((i - 1))]}
		# Tolerant both ways: a setup that failed half-way is undone too.
		in_ns "$ns" ip route "$1" default via "$NODE_B" 2>/dev/null || true
		if [ "$1" = del ]; then
			in_ns "$ns" ethtool -K "b$i" tx off >/dev/null
		else
			in_ns "$ns" ethtool -K "b$i" tx on >/dev/null 2>&1 || true
		fi
	done
	[ "$1" = add ] && return 0
	for ns in "${NS_B[@]}"; do
		if in_ns "$ns" ip route get "$CLIENT" >/dev/null 2>&1; then
			log "lab: $ns still has a route to $CLIENT: $(in_ns "$ns" ip route get "$CLIENT")"
			return 1
		fi
	done
}

up_rivora_nat() { TARGET=$VIP; rivora_up nat; }
down_rivora_nat() { rivora_down; }
up_rivora_dsr() { TARGET=$VIP; dsr_backends add; rivora_up dsr; }
down_rivora_dsr() { rivora_down; dsr_backends del; }
up_rivora_l3dsr() {
	TARGET=$VIP
	dsr_backends add
	local i
	for i in 1 2 3; do
		hold_xdp "${NS_B[$((i - 1))]}" "b$i" decap "$VIP" || return 1
		PATH_PIDS+=("$HOLD_PID")
	done
	rivora_up l3dsr
}
down_rivora_l3dsr() { rivora_down; dsr_backends del; }
up_rivora_fullnat() {
	TARGET=$VIP
	fullnat_backends del || return 1
	rivora_up fullnat
	# After a new flow every packet, wait until what it took is idle past
	# udpTimeout, so the next measure finds the ports free to claim.
	SETTLE_AFTER_NEW=$((FULLNAT_UDP_TIMEOUT + 1))
}
down_rivora_fullnat() { rivora_down; fullnat_backends add; SETTLE_AFTER_NEW=0; }

up_haproxy() {
	TARGET=$VIP
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
		echo "  bind $VIP:$HTTP_PORT"
		echo "  default_backend http"
		echo "backend http"
		echo "  balance roundrobin"
		local i=1 b
		for b in "${BACKENDS[@]}"; do echo "  server b$i $b:$HTTP_PORT"; i=$((i + 1)); done
		echo "frontend iperf"
		echo "  bind $VIP:$IPERF_PORT"
		echo "  default_backend iperf"
		echo "backend iperf"
		echo "  balance source"
		i=1
		for b in "${BACKENDS[@]}"; do echo "  server b$i $b:$IPERF_PORT"; i=$((i + 1)); done
	} >"$WORK/haproxy.cfg"
	nsenter --net="/run/netns/$NS_N" haproxy -db -f "$WORK/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
	PATH_PIDS+=($!)
}
down_haproxy() {
	local p
	for p in "${PATH_PIDS[@]}"; do stop_pid "$p"; done
	PATH_PIDS=()
	in_ns "$NS_N" ip addr del "$VIP/32" dev lo 2>/dev/null || true
}

# How the node receives, per kind of measure:
#   stream  the veth's defaults (GRO off, NAPI in softirq wherever it
#           lands): TCP and HTTP measure per-packet forwarding, and GRO on
#           the node would re-aggregate what the client sent unsegmented
#           for the kernel paths only (XDP sends what it receives): with
#           GRO on, direct TCP read 7.2 Gbit/s over four streams against
#           4.4 without, while the XDP paths did not move.
#   pinned  the node's receive path on a core of its own, apart from the
#           generator's, so the node's work sets the packet rate: NAPI
#           on the veth (GRO, or XDP when attached) in a thread pinned to
#           RX_CPU; the generator runs on GEN_CPU.
node_mode() {
	if [ "$1" = pinned ]; then
		in_ns "$NS_N" ethtool -K "$NODEIF" gro on >/dev/null
		sysfs_ns "$NS_N" "echo 1 > /sys/class/net/$NODEIF/threaded"
		pin_napi
		downstream_mode pinned
	else
		downstream_mode stream
		# Without XDP or GRO a veth has no NAPI to thread, and the write
		# fails (EIO): nothing to undo then.
		sysfs_ns "$NS_N" "{ echo 0 > /sys/class/net/$NODEIF/threaded; } 2>/dev/null" || true
		in_ns "$NS_N" ethtool -K "$NODEIF" gro off >/dev/null
	fi
}

# Where what the node sends is received, per kind of measure:
#   pinned  on GEN_CPU, in NAPI threads of their own: the switch's port
#           facing the node (pn, and the bridge behind it) and the
#           backends' veths (their receive path, the L3 DSR decap
#           program). A veth hands what it sends to its peer's receive on
#           the sending core; left there, all of it ran on the node's core
#           and was charged to the node: an L3 DSR backend's decap (and
#           veth's copy of each frame into XDP for it) read as the node's
#           cost. On a NIC the node's work ends at the transmit ring.
#           A veth has NAPI to thread with GRO on (or XDP), and uses it
#           for what a sender with TSO off sends (veth_xmit).
#   stream  the veths' defaults, as the TCP and HTTP measures had them.
downstream_mode() {
	local ns i pid n
	if [ "$1" = pinned ]; then
		in_ns "$NS_N" ethtool -K "$NODEIF" tso off gso off >/dev/null
		in_ns "$NS_S" ethtool -K pn gro on >/dev/null
		sysfs_ns "$NS_S" "echo 1 > /sys/class/net/pn/threaded"
		for i in 1 2 3; do
			ns=${NS_B[$((i - 1))]}
			in_ns "$NS_S" ethtool -K "sb$i" tso off gso off >/dev/null
			in_ns "$ns" ethtool -K "b$i" gro on >/dev/null
			sysfs_ns "$ns" "echo 1 > /sys/class/net/b$i/threaded"
		done
		# Above the generator's priority: what the node sent is received
		# before more is generated, so nothing the node paid for is
		# dropped on the way for want of a core (it would count against
		# the node, per delivered packet).
		n=0
		for pid in $(pgrep '^napi/(pn|b[123])-[0-9]+$' || true); do
			taskset -pc "$GEN_CPU" "$pid" >/dev/null
			renice -n $((LAB_NICE - 5)) -p "$pid" >/dev/null
			n=$((n + 1))
		done
		# pn and b1-b3: fewer, and some of it is charged to the node.
		[ "$n" -ge 4 ] || { log "lab: $n of 4 downstream NAPI threads found to pin"; return 1; }
	else
		sysfs_ns "$NS_S" "{ echo 0 > /sys/class/net/pn/threaded; } 2>/dev/null" || true
		in_ns "$NS_S" ethtool -K pn gro off >/dev/null
		for i in 1 2 3; do
			ns=${NS_B[$((i - 1))]}
			sysfs_ns "$ns" "{ echo 0 > /sys/class/net/b$i/threaded; } 2>/dev/null" || true
			in_ns "$ns" ethtool -K "b$i" gro off >/dev/null
			# Back to the defaults where the device allows it (XDP on a
			# veth's peer takes its segmentation offloads away).
			in_ns "$NS_S" ethtool -K "sb$i" tso on gso on >/dev/null 2>&1 || true
		done
		in_ns "$NS_N" ethtool -K "$NODEIF" tso on gso on >/dev/null 2>&1 || true
	fi
}

# Pin the node's NAPI thread(s) to RX_CPU.
pin_napi() {
	local pid found=0
	for pid in $(pgrep "napi/$NODEIF" || true); do
		taskset -pc "$RX_CPU" "$pid" >/dev/null && found=1
		renice -n "$LAB_NICE" -p "$pid" >/dev/null
	done
	[ "$found" -eq 1 ] || { log "lab: no napi/$NODEIF-* thread to pin"; return 1; }
}

switch_to() {
	[ -n "$CURRENT" ] && "down_$CURRENT"
	CURRENT=""
	# A setup that failed half-way is undone (down_<path> tolerates what
	# was never set up): a route or holder it left would change the next
	# path.
	"up_$1" || { log "path $1: setup failed"; "down_$1" >/dev/null 2>&1 || true; return 1; }
	CURRENT=$1
	# The path must carry traffic before it is measured.
	local _
	for _ in $(seq 50); do
		in_ns "$NS_C" curl -s -o /dev/null --max-time 1 "http://$TARGET:$HTTP_PORT/" && return 0
		sleep 0.2
	done
	log "path $1: no answer from http://$TARGET:$HTTP_PORT/"
	return 1
}

flush_ct() { in_ns "$NS_N" conntrack -F >/dev/null 2>&1 || true; }

# ------------------------------------------------------------ measures
# Each prints "key=value" pairs; nan for a failed measure.

# perf record of every core for most of a measure (PROFILE set): where the
# time goes when nothing is pinned.
profile_all() { # name
	[ -n "$PROFILE" ] || return 0
	(sleep 0.5; perf record -q -a -g -o "$OUT/perf-$CURRENT-$1.data" -- sleep $((DURATION > 2 ? DURATION - 1 : 1)) >/dev/null 2>&1
		perf report -i "$OUT/perf-$CURRENT-$1.data" --no-children --sort symbol -g none --stdio 2>/dev/null |
			grep -v '^$' | head -60 >"$OUT/perf-$CURRENT-$1.txt"
		rm -f "$OUT/perf-$CURRENT-$1.data") &
}

measure_tcp() { # streams key
	flush_ct
	local j
	profile_all "$2"
	j=$(in_ns "$NS_C" iperf3 -c "$TARGET" -p "$IPERF_PORT" -P "$1" -t "$DURATION" -J 2>"$WORK/iperf3-client.err") || {
		log "  iperf3 -P $1: $(python3 -c 'import json,sys; print(json.load(sys.stdin).get("error"))' <<<"$j" 2>/dev/null) $(tail -2 "$WORK/iperf3-client.err")"
		echo "$2=nan"; return
	}
	python3 -c 'import json,sys; print("'"$2"'=%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"] / 1e9))' <<<"$j" 2>/dev/null ||
		echo "$2=nan"
}

measure_cps() {
	flush_ct
	local out
	profile_all cps
	out=$(in_ns "$NS_C" wrk -t2 -c"$WRK_CONNS" -d"${DURATION}s" -H 'Connection: close' "http://$TARGET:$HTTP_PORT/" 2>&1) || { echo "cps=nan"; return; }
	# Connect errors and timeouts are not connections made: report them.
	if grep -q 'Socket errors' <<<"$out"; then log "  wrk: $(grep 'Socket errors' <<<"$out")"; fi
	awk '/Requests\/sec/ {print "cps=" $2}' <<<"$out"
}

# Move the backends' nginx (masters and workers) and what the path runs
# (haproxy, rivorad) to a set of cores.
pin_servers() {
	local p c
	for p in "${NGINX_PIDS[@]}" "${PATH_PIDS[@]}"; do
		for c in "$p" $(pgrep -P "$p"); do taskset -apc "$1" "$c" >/dev/null 2>&1 || true; done
	done
}

# One connection, one request at a time: the round trip through the path.
# Client, backends, haproxy and (so) every softirq on the way run on one
# core: with the request crossing cores, each hop waits for an idle vCPU to
# wake, and p50 jumped between ~15 and ~75 us from run to run on every path
# alike.
measure_rr() {
	flush_ct
	local out
	pin_servers "$RX_CPU"
	out=$(in_ns "$NS_C" taskset -c "$RX_CPU" wrk -t1 -c1 -d"${DURATION}s" --latency "http://$TARGET:$HTTP_PORT/" 2>&1) || {
		pin_servers "0-$(($(nproc) - 1))"
		echo "rr_p50_us=nan rr_p99_us=nan"
		return
	}
	pin_servers "0-$(($(nproc) - 1))"
	python3 - "$out" <<'PY'
import re, sys
out = sys.argv[1]
scale = {"us": 1.0, "ms": 1e3, "s": 1e6}
got = {}
for pct, val, unit in re.findall(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", out, re.M):
    got[pct] = float(val) * scale[unit]
print("rr_p50_us=%s rr_p99_us=%s" % tuple(
    ("%.1f" % got[p]) if p in got else "nan" for p in ("50", "99")))
PY
}

delivered() { # packets counted by the three backends' sinks
	local ns total=0 n
	for ns in "${NS_B[@]}"; do
		n=$(in_ns "$ns" nft list counter ip sink delivered | awk '/packets/ {for (i = 1; i <= NF; i++) if ($i == "packets") print $(i + 1)}')
		total=$((total + ${n:-0}))
	done
	echo "$total"
}
cpu_busy_ticks() { # busy jiffies of RX_CPU
	awk -v c="cpu$RX_CPU" '$1 == c {print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat
}

# Run time (ns) of the node's receive threads: its NAPI thread(s), which
# run its XDP program and the softirqs that follow on core 1 (no IRQ time
# accounting here: softirq time is charged to the thread it interrupts),
# and core 1's ksoftirqd. Unlike cpu_busy_ticks, not charged with what
# other processes do on core 1 (a loaded machine).
node_runtime_ns() {
	local pid total=0 t
	for pid in $(pgrep "napi/$NODEIF" || true) $(pgrep -x "ksoftirqd/$RX_CPU" || true); do
		t=$(awk '{print $1}' "/proc/$pid/schedstat" 2>/dev/null || echo 0)
		total=$((total + ${t:-0}))
	done
	echo "$total"
}

trafgen_conf() { # kind -> file
	local f="$WORK/trafgen-$1.cfg" ip udp
	case $1 in
	1) ip="ipv4(sa=$CLIENT, da=$TARGET, ttl=64, df)"; udp="udp(sp=4242, dp=$SINK_PORT)" ;;
	64k) ip="ipv4(sa=$CLIENT, da=$TARGET, ttl=64, df)"; udp="udp(sp=dinc(1, 65535), dp=$SINK_PORT)" ;;
	new) ip="ipv4(sa=10.211.0.1, sa[2:2]=drnd(), da=$TARGET, ttl=64, df)"; udp="udp(sp=drnd(), dp=$SINK_PORT)" ;;
	esac
	# 14 + 20 + 8 + 18 = 60 bytes: a 64-byte frame on a wire with its FCS.
	echo "{ eth(da=$NODE_MAC, sa=$CLIENT_MAC, type=0x0800), $ip, $udp, fill(0x00, 18) }" >"$f"
	echo "$f"
}

measure_pps() { # kind -> pps_<kind>=kpps [cpu_ns_<kind>=ns per packet]
	local kind=$1 conf before after t0 t1 c0 c1 r0 r1 x0 x1 n secs
	conf=$(trafgen_conf "$kind")
	flush_ct
	before=$(delivered); c0=$(cpu_busy_ticks); r0=$(node_runtime_ns); x0=$(node_rx); t0=$(date +%s.%N)
	local prof=""
	if [ -n "$PROFILE" ]; then
		# Where core 1's time goes, while the packets flow.
		prof="$OUT/perf-$CURRENT-$kind"
		(sleep 0.5; perf record -q -C "$RX_CPU" -g -o "$prof.data" -- sleep $((PPS_DURATION > 2 ? PPS_DURATION - 1 : 1)) >/dev/null 2>&1) &
	fi
	in_ns "$NS_C" env LD_PRELOAD="$WORK/sndbuf.so" timeout -s INT "$PPS_DURATION" \
		nice -n "$LAB_NICE" taskset -c "$GEN_CPU" trafgen -o c0 -i "$conf" --cpus 1 --no-sock-mem -Q >"$WORK/trafgen.log" 2>&1 || true
	if [ -n "$prof" ]; then
		wait
		perf report -i "$prof.data" --no-children --sort symbol -g none --stdio 2>/dev/null | grep -v '^$' | head -60 >"$prof.txt" || true
		rm -f "$prof.data"
	fi
	t1=$(date +%s.%N)
	sleep 0.2
	after=$(delivered); c1=$(cpu_busy_ticks); r1=$(node_runtime_ns); x1=$(node_rx)
	n=$((after - before))
	if [ "$n" -eq 0 ] || grep -qi 'fail\|error' "$WORK/trafgen.log"; then log "  trafgen ($kind, $n delivered): $(head -c 600 "$WORK/trafgen.log")"; fi
	secs=$(python3 -c "print($t1 - $t0)")
	per_packet "" "$kind" "$n" "$secs" $((c1 - c0)) $((r1 - r0)) $((x1 - x0))
}

# The node's receive threads' time is divided by the packets the node
# received (its interface's rx_packets), not by those delivered: what the
# node sent that was dropped after it (a full ring downstream) cost the
# node the same, and per delivered packet it read as a dearer node.
per_packet() { # prefix kind delivered secs busy-ticks node-ns node-rx -> key=value
	python3 -c "
p, kind, n, secs, ticks, node, rx = '$1', '$2', $3, $4, $5, $6, $7
hz = $(getconf CLK_TCK)
print('%spps_%s=%s' % (p, kind, '%.1f' % (n / secs / 1e3) if n else 'nan'), end=' ')
print('%scpu_ns_%s=%s' % (p, kind, '%.0f' % (ticks / hz * 1e9 / n) if n else 'nan'), end=' ')
print('%snode_ns_%s=%s' % (p, kind, '%.0f' % (node / rx) if n and rx else 'nan'))
"
}

# Packets the node's interface received (its receive path handled them).
node_rx() { sysfs_ns "$NS_N" "cat /sys/class/net/$NODEIF/statistics/rx_packets"; }

# The same from live XDP frames: rivora-bench xdpgen in the switch's
# namespace, redirecting into pn (the node's veth peer) on GEN_CPU. It
# offers more than the node takes (a full veth ring drops on the
# generator's core); only what reached the backends counts, and a path
# that delivers under 1% of what was offered reads as failed, not fast.
measure_xpps() { # kind -> xpps_<kind>= xcpu_ns_<kind>= xnode_ns_<kind>=
	local kind=$1 src=$CLIENT before after t0 t1 c0 c1 r0 r1 x0 x1 n secs out sent
	[ "$kind" = new ] && src=10.211.0.1
	flush_ct
	before=$(delivered); c0=$(cpu_busy_ticks); r0=$(node_runtime_ns); x0=$(node_rx); t0=$(date +%s.%N)
	out=$(in_ns "$NS_S" nice -n "$LAB_NICE" taskset -c "$GEN_CPU" "$BIN/rivora-bench" xdpgen --dev pn --dst-mac "$NODE_MAC" \
		--src-mac "$CLIENT_MAC" --src "$src" --dst "$TARGET" --sport 4242 --dport "$SINK_PORT" \
		--flows "$kind" --seconds "$PPS_DURATION" 2>&1) || out="failed: $out"
	t1=$(date +%s.%N)
	sleep 0.2
	after=$(delivered); c1=$(cpu_busy_ticks); r1=$(node_runtime_ns); x1=$(node_rx)
	n=$((after - before))
	sent=$(sed -n 's/.*xdpgen_sent=\([0-9]*\).*/\1/p' <<<"$out")
	if [ -z "$sent" ] || [ "$n" -lt 1000 ] || [ $((n * 100)) -lt "$sent" ]; then
		log "  xdpgen ($kind): ${sent:-?} sent, $n delivered: $(head -c 600 <<<"$out")"
		n=0
	fi
	secs=$(python3 -c "print($t1 - $t0)")
	per_packet x "$kind" "$n" "$secs" $((c1 - c0)) $((r1 - r0)) $((x1 - x0))
}

measure() { # path -> the run's key=value pairs on one line
	local m out=""
	for m in $MEASURES; do
		case $m in
		pps | xpps) node_mode pinned ;;
		*) node_mode stream ;;
		esac
		case $m in
		tcp1) out+=" $(measure_tcp 1 tcp1_gbps)" ;;
		tcp4) out+=" $(measure_tcp 4 tcp4_gbps)" ;;
		cps) out+=" $(measure_cps)" ;;
		rr) out+=" $(measure_rr)" ;;
		pps)
			# haproxy is a TCP proxy: no UDP packet rates.
			if [ "$1" != haproxy ]; then
				out+=" $(measure_pps 1) $(measure_pps 64k) $(measure_pps new)"
				sleep "$SETTLE_AFTER_NEW"
			fi
			;;
		xpps)
			if [ "$1" != haproxy ]; then
				out+=" $(measure_xpps 1) $(measure_xpps 64k) $(measure_xpps new)"
				sleep "$SETTLE_AFTER_NEW"
			fi
			;;
		*) log "unknown measure $m"; exit 1 ;;
		esac
	done
	echo "$out"
}

# ---------------------------------------------------------------- run
started=$(date +%s)
log "lab: $NS_C -- $NS_S -- $NS_N, ${NS_B[*]}; paths: $PATHS; measures: $MEASURES; $REPS repetitions"
build_sndbuf_shim
lab_up
read -r -a path_list <<<"$PATHS"
n=${#path_list[@]}
mkdir -p "$OUT"
runs="$OUT/lab-runs.txt"
: >"$runs"
for rep in $(seq "$REPS"); do
	# Interleave, and rotate the order so that no path always runs first.
	for k in $(seq 0 $((n - 1))); do
		p=${path_list[$(((k + rep - 1) % n))]}
		if ! switch_to "$p"; then
			echo "RESULT rep=$rep path=$p failed=1" | tee -a "$runs"
			continue
		fi
		echo "RESULT rep=$rep path=$p$(measure "$p")" | tee -a "$runs"
	done
done
[ -n "$CURRENT" ] && "down_$CURRENT"
CURRENT=""
log "lab: $(($(date +%s) - started)) s"

python3 scripts/lab-report.py "$runs" --paths "$PATHS" --results "$RESULTS" --chart "$OUT/lab.svg"
