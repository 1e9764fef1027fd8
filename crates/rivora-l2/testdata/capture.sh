#!/usr/bin/env bash
# How the frames in this directory were captured (as root; needs iproute2,
# tcpdump, iputils-arping and ndisc6): two namespaces on a veth pair with
# fixed MACs, the kernel of `a` answering for its own addresses, tcpdump on
# `b`'s side. The unit tests of src/frames.rs read the .pcap files: the
# parser must read what real tools send, and the builders must write, byte
# for byte, what the kernel writes for the same question.
#
#   a: va 02:00:00:00:00:0a  10.250.0.1/24  fd00:250::1/64
#   b: vb 02:00:00:00:00:0b  10.250.0.2/24  fd00:250::2/64
#
# Frames (one file each):
#   arping-request.pcap     arping -c1 from b for 10.250.0.1
#   kernel-arp-reply.pcap   a's kernel answering it
#   arping-probe.pcap       arping -D (duplicate address probe, sender 0.0.0.0)
#   kernel-garp.pcap        a's kernel announcing 10.250.0.1 (arp_notify=1, MAC change)
#   arping-garp-reply.pcap  arping -A from a (the reply form of gratuitous ARP)
#   ndisc6-ns.pcap          ndisc6 from b for fd00:250::1
#   kernel-na.pcap          a's kernel answering it
#   kernel-dad-ns.pcap      b's kernel checking fd00:250::99 for duplicates
#   kernel-unsol-na.pcap    a's kernel announcing fd00:250::1 (ndisc_notify=1, MAC change)
set -euo pipefail
out=$(cd "$(dirname "$0")" && pwd)
A=rvcap-a-$$ B=rvcap-b-$$
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip -n "$A" link add va address 02:00:00:00:00:01 type veth peer name vb netns "$B" address 02:00:00:00:00:0b
for ns in "$A" "$B"; do
	ip netns exec "$ns" sh -c 'echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad; echo 0 > /proc/sys/net/ipv6/conf/all/forwarding; echo 0 > /proc/sys/net/ipv6/conf/default/accept_ra'
done
ip -n "$A" addr add 10.250.0.1/24 dev va
ip -n "$A" addr add fd00:250::1/64 dev va nodad
ip -n "$B" addr add 10.250.0.2/24 dev vb
ip -n "$B" addr add fd00:250::2/64 dev vb nodad
ip -n "$A" link set va up; ip -n "$B" link set vb up
ip netns exec "$A" sh -c 'echo 1 > /proc/sys/net/ipv4/conf/va/arp_notify; echo 1 > /proc/sys/net/ipv6/conf/va/ndisc_notify'
sleep 1

# One capture per file: tcpdump on vb with a filter, the stimulus, stop.
capture() { # file filter command-in-ns ns [seconds to wait]
	local file=$1 filter=$2 cmd=$3 ns=$4 wait=${5:-1}
	ip netns exec "$B" tcpdump -i vb -U -w "$out/$file.all" "$filter" 2>/dev/null &
	local pid=$!
	sleep 1
	ip netns exec "$ns" sh -c "$cmd" >/dev/null 2>&1 || true
	sleep "$wait"
	kill "$pid"; wait "$pid" 2>/dev/null || true
}
first() { # keep the first frame tcpdump's filter matches
	tcpdump -r "$out/$1.all" -c 1 -w "$out/$1.pcap" "$2" 2>/dev/null
	rm -f "$out/$1.all"
}

capture arp 'arp' 'arping -c 1 -w 1 -I vb 10.250.0.1' "$B"
cp "$out/arp.all" "$out/arping-request.all"; mv "$out/arp.all" "$out/kernel-arp-reply.all"
first arping-request 'arp[6:2] = 1'
first kernel-arp-reply 'arp[6:2] = 2'
ip -n "$A" neigh flush dev va; ip -n "$B" neigh flush dev vb

capture arping-probe 'arp' 'arping -D -c 1 -w 1 -I vb 10.250.0.1' "$B"
first arping-probe 'arp[6:2] = 1 and arp[14:4] = 0'

capture kernel-garp 'arp' 'ip link set va address 02:00:00:00:00:0a' "$A"
first kernel-garp 'arp[6:2] = 1'

capture arping-garp-reply 'arp' 'arping -A -c 1 -I va 10.250.0.1' "$A"
first arping-garp-reply 'arp[6:2] = 2'

capture nd 'icmp6' 'ndisc6 -1 -r 1 fd00:250::1 vb' "$B"
cp "$out/nd.all" "$out/ndisc6-ns.all"; mv "$out/nd.all" "$out/kernel-na.all"
first ndisc6-ns 'icmp6 and ip6[40] = 135'
first kernel-na 'icmp6 and ip6[40] = 136'

capture kernel-dad-ns 'icmp6' 'echo 1 > /proc/sys/net/ipv6/conf/vb/accept_dad; ip addr add fd00:250::99/64 dev vb' "$B" 3
first kernel-dad-ns 'icmp6 and ip6[40] = 135'

capture kernel-unsol-na 'icmp6' 'ip link set va address 02:00:00:00:00:0a; ip link set va address 02:00:00:00:00:0c; ip link set va address 02:00:00:00:00:0a' "$A"
first kernel-unsol-na 'icmp6 and ip6[40] = 136 and ip6 src fd00:250::1 and ether src 02:00:00:00:00:0a'
ls -l "$out"/*.pcap
