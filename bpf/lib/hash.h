/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * MurmurHash3 (32-bit) over whole words. The seed is a constant, not a
 * per-boot random: nodes behind ECMP must pick the same backend for the
 * same flow, and so must a restarted node.
 */
#ifndef RV_HASH_H
#define RV_HASH_H

#include "common.h"

#define RV_HASH_SEED 0x52495652 /* "RIVR" */

static __always_inline __u32 rv_rotl32(__u32 x, __u32 r)
{
	return (x << r) | (x >> (32 - r));
}

static __always_inline __u32 rv_murmur_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = rv_rotl32(k, 15);
	k *= 0x1b873593;
	h ^= k;
	h = rv_rotl32(h, 13);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 rv_murmur_final(__u32 h, __u32 len)
{
	h ^= len;
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	h ^= h >> 16;
	return h;
}

/* The flow hash: the client's address, and unless only the address
 * counts (clientIP affinity), the ports and protocol.
 *
 * The hashing itself is a global function, verified once on its own
 * rather than at every path that reaches a pick (inlined, the verifier
 * walked its multiplications thousands of times); it takes scalars only,
 * packed to fit the five argument registers. */
__noinline __u32 rv_flow_hash_words(__u32 a0, __u32 a1, __u32 a2, __u32 a3,
				    __u64 rest)
{
	__u32 ports = (__u32)rest;
	__u8 proto = rest >> 32;
	int v6 = (rest >> 40) & 1;
	int addr_only = (rest >> 41) & 1;
	__u32 h = RV_HASH_SEED;
	__u32 len = 4;

	h = rv_murmur_mix(h, a0);
	if (v6) {
		h = rv_murmur_mix(h, a1);
		h = rv_murmur_mix(h, a2);
		h = rv_murmur_mix(h, a3);
		len = 16;
	}
	if (!addr_only) {
		h = rv_murmur_mix(h, ports);
		h = rv_murmur_mix(h, proto);
		len += 8;
	}
	return rv_murmur_final(h, len);
}

static __always_inline __u32 rv_flow_hash(const __be32 *caddr, __u8 family,
					  __be16 sport, __be16 dport,
					  __u8 proto, int addr_only)
{
	int v6 = family == RV_FAMILY_V6;

	return rv_flow_hash_words(
		caddr[0], v6 ? caddr[1] : 0, v6 ? caddr[2] : 0,
		v6 ? caddr[3] : 0,
		(((__u32)sport << 16) | dport) | ((__u64)proto << 32) |
			((__u64)v6 << 40) | ((__u64) !!addr_only << 41));
}

/* The flow label of an IPv6 L3 DSR tunnel (RFC 6438): 20 bits, the same
 * for every packet of a flow, that spread flows over the paths to the
 * backend. Computed for every packet, unlike the flow hash (once per new
 * flow), so cheaper: the words of the tuple folded by XOR, then the top 20
 * bits of a multiplicative (Fibonacci) hash. */
static __always_inline __u32 rv_flow_label(const __be32 *caddr, __be16 sport,
					   __be16 dport, __u8 proto)
{
	__u32 h = caddr[0] ^ caddr[1] ^ caddr[2] ^ caddr[3] ^
		  (((__u32)sport << 16) | dport) ^ proto;

	return (h * 0x9e3779b1) >> 12;
}

#endif /* RV_HASH_H */
