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

/* RFC 1624 eqn. 3: HC' = ~(~HC + ~m + m'). */
static __always_inline void rv_csum_replace4(__u16 *sum, __u32 from, __u32 to)
{
	__u32 c = ~((__u32)*sum) & 0xffff;

	c = rv_csum_add(rv_csum_sub(c, from), to);
	*sum = rv_csum_fold(c);
}

static __always_inline void rv_csum_replace2(__u16 *sum, __u16 from, __u16 to)
{
	rv_csum_replace4(sum, from, to);
}

static __always_inline void rv_csum_replace16(__u16 *sum, const __be32 *from,
					      const __be32 *to)
{
	__u32 c = ~((__u32)*sum) & 0xffff;
	int i;

#pragma unroll
	for (i = 0; i < 4; i++)
		c = rv_csum_add(rv_csum_sub(c, from[i]), to[i]);
	*sum = rv_csum_fold(c);
}

/* UDP over IPv4 may carry no checksum (0); a computed 0 is sent as 0xffff
 * (RFC 768). */
static __always_inline void rv_udp_csum_fixup(__u16 *sum)
{
	if (*sum == 0)
		*sum = 0xffff;
}

#endif /* RV_CSUM_H */
