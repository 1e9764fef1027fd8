/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
#ifndef RV_COMMON_H
#define RV_COMMON_H

#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#include "rivora/abi.h"

/* vmlinux.h carries types, not #defines. */
#define RV_ETH_P_IP 0x0800
#define RV_ETH_P_IPV6 0x86DD
#define RV_ETH_P_8021Q 0x8100
#define RV_ETH_P_8021AD 0x88A8
#define RV_ETH_ALEN 6

#define RV_IPPROTO_ICMP 1
#define RV_IPPROTO_IPIP 4
#define RV_IPPROTO_TCP 6
#define RV_IPPROTO_UDP 17
#define RV_IPPROTO_IPV6 41
#define RV_IPPROTO_ICMPV6 58
#define RV_IPPROTO_HOPOPTS 0
#define RV_IPPROTO_ROUTING 43
#define RV_IPPROTO_FRAGMENT 44
#define RV_IPPROTO_DSTOPTS 60

#define RV_IP_MF 0x2000
#define RV_IP_DF 0x4000
#define RV_IP_OFFSET 0x1FFF

#define RV_ICMP_DEST_UNREACH 3
#define RV_ICMPV6_DEST_UNREACH 1
#define RV_ICMPV6_PKT_TOOBIG 2

#define RV_TCP_FLAG_SYN 0x02
#define RV_TCP_FLAG_ACK 0x10

#define RV_NSEC_PER_SEC 1000000000ULL

#define RV_XDP_PASS 2
#define RV_XDP_DROP 1
#define RV_XDP_TX 3
#define RV_XDP_REDIRECT 4

/* TCX verdicts (include/uapi/linux/bpf.h, enum tcx_action_base). */
#define RV_TCX_NEXT (-1)
#define RV_TCX_PASS 0

#define rv_likely(x) __builtin_expect(!!(x), 1)
#define rv_unlikely(x) __builtin_expect(!!(x), 0)

/* Offsets into a frame stay below this: an XDP frame's linear part is
 * at most a page or two. */
#define RV_MAX_PKT_OFF 0x3fff

/* Bounds check for a header of type T at offset off; the verifier needs
 * to see the comparison against data_end in the same function. The mask
 * changes no offset a frame can have; it bounds one the verifier reads
 * back from the stack as any 32-bit value (a packet descriptor's field
 * spilled and reloaded), which it would not add to a packet pointer. */
#define rv_hdr(T, data, data_end, off)                                         \
	({                                                                     \
		T *__h =                                                       \
			(T *)((void *)(data) + ((__u32)(off)&RV_MAX_PKT_OFF)); \
		((void *)(__h + 1) > (void *)(data_end)) ? (T *)0 : __h;       \
	})

/* ctx->data and ctx->data_end read by an instruction of our own: where
 * several inlined paths join, clang may otherwise load them through an
 * address computed into a register (ctx plus the field's offset), which
 * the verifier refuses ("dereference of modified ctx ptr"). */
static __always_inline void *rv_xdp_data(struct xdp_md *ctx)
{
	void *p;

	asm volatile("%0 = *(u32 *)(%1 + 0)" : "=r"(p) : "r"(ctx));
	return p;
}

static __always_inline void *rv_xdp_data_end(struct xdp_md *ctx)
{
	void *p;

	asm volatile("%0 = *(u32 *)(%1 + 4)" : "=r"(p) : "r"(ctx));
	return p;
}

static __always_inline void rv_addr6_copy(__be32 *dst, const __be32 *src)
{
	dst[0] = src[0];
	dst[1] = src[1];
	dst[2] = src[2];
	dst[3] = src[3];
}

static __always_inline int rv_addr6_is_zero(const __be32 *a)
{
	return (a[0] | a[1] | a[2] | a[3]) == 0;
}

#endif /* RV_COMMON_H */
