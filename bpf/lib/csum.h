/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Internet checksum arithmetic (RFC 1071, incremental update per RFC 1624),
 * on raw network-order words: ones' complement sums do not care about byte
 * order as long as every operand is taken the same way.
 */
#ifndef RV_CSUM_H
#define RV_CSUM_H

#include "common.h"

static __always_inline __u32 rv_csum_add(__u32 csum, __u32 addend)
{
	csum += addend;
	return csum + (csum < addend);
}

static __always_inline __u32 rv_csum_sub(__u32 csum, __u32 addend)
{
	return rv_csum_add(csum, ~addend);
}

static __always_inline __u16 rv_csum_fold(__u32 csum)
{
	csum = (csum & 0xffff) + (csum >> 16);
	csum = (csum & 0xffff) + (csum >> 16);
	return (__u16)~csum;
}

/*
 * RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'). Open the sum a checksum stands
 * for, swap any number of fields in it, fold once.
 */
static __always_inline __u32 rv_csum_open(__u16 sum)
{
	return ~(__u32)sum & 0xffff;
}

static __always_inline __u32 rv_csum_swap(__u32 c, __u32 from, __u32 to)
{
	return rv_csum_add(rv_csum_sub(c, from), to);
}

static __always_inline __u32 rv_csum_swap16(__u32 c, const __be32 *from,
					    const __be32 *to)
{
	int i;

#pragma unroll
	for (i = 0; i < 4; i++)
		c = rv_csum_swap(c, from[i], to[i]);
	return c;
}

static __always_inline void rv_csum_replace4(__u16 *sum, __u32 from, __u32 to)
{
	*sum = rv_csum_fold(rv_csum_swap(rv_csum_open(*sum), from, to));
}

static __always_inline void rv_csum_replace2(__u16 *sum, __u16 from, __u16 to)
{
	rv_csum_replace4(sum, from, to);
}

static __always_inline void rv_csum_replace16(__u16 *sum, const __be32 *from,
					      const __be32 *to)
{
	*sum = rv_csum_fold(rv_csum_swap16(rv_csum_open(*sum), from, to));
}

/*
 * TTL - 1 in an IPv4 header whose TTL is `ttl` (> 0): the TTL is the high
 * byte of its 16-bit word, which goes down by 0x0100, so the checksum goes
 * up by as much, with the end-around carry (RFC 1141; the kernel's
 * ip_decrease_ttl): no fold needed.
 */
static __always_inline void rv_ip_decrease_ttl(struct iphdr *iph, __u8 ttl)
{
	__u32 c = (__u32)iph->check + bpf_htons(0x0100);

	iph->check = (__u16)(c + (c >= 0xffff));
	iph->ttl = ttl - 1;
}

/* UDP over IPv4 may carry no checksum (0); a computed 0 is sent as 0xffff
 * (RFC 768). */
static __always_inline void rv_udp_csum_fixup(__u16 *sum)
{
	if (*sum == 0)
		*sum = 0xffff;
}

#endif /* RV_CSUM_H */
