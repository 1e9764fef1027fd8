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
 * counts (clientIP affinity), the ports and protocol. */
static __always_inline __u32 rv_flow_hash(const __be32 *caddr, __u8 family,
					  __be16 sport, __be16 dport,
					  __u8 proto, int addr_only)
{
	__u32 h = RV_HASH_SEED;
	__u32 len = 4;

	h = rv_murmur_mix(h, caddr[0]);
	if (family == RV_FAMILY_V6) {
		h = rv_murmur_mix(h, caddr[1]);
		h = rv_murmur_mix(h, caddr[2]);
		h = rv_murmur_mix(h, caddr[3]);
		len = 16;
	}
	if (!addr_only) {
		h = rv_murmur_mix(h, ((__u32)sport << 16) | dport);
		h = rv_murmur_mix(h, proto);
		len += 8;
	}
	return rv_murmur_final(h, len);
}

#endif /* RV_HASH_H */
