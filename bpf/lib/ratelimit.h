/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Per-source token buckets for TCP SYNs. Buckets are updated without a
 * lock: two CPUs racing on one source may both take the last token, so
 * the limit is exact to within one token per CPU. That is the price of
 * keeping a spin lock off a path a SYN flood hammers.
 */
#ifndef RV_RATELIMIT_H
#define RV_RATELIMIT_H

#include "maps.h"

/* Refill time after which a bucket is full whatever the rate; also keeps
 * elapsed * rate inside 64 bits (rates are capped at 10M/s by the
 * writer). */
#define RV_RL_FULL_AFTER_NS (100ULL * RV_NSEC_PER_SEC)

static __always_inline int rv_rl_take(struct rv_rl_bucket *b,
				      const struct rv_rl_config *cfg, __u64 now)
{
	__u64 cap = (__u64)cfg->burst * 1000;
	__u64 elapsed = now > b->last_ns ? now - b->last_ns : 0;
	__u64 tokens = b->tokens_milli;

	if (elapsed >= RV_RL_FULL_AFTER_NS)
		tokens = cap;
	else
		tokens += elapsed * cfg->rate_per_sec / 1000000;
	if (tokens > cap)
		tokens = cap;
	b->last_ns = now;
	if (tokens < 1000) {
		b->tokens_milli = tokens;
		return -RV_DROP_RATE_LIMITED;
	}
	b->tokens_milli = tokens - 1000;
	return 0;
}

/* Returns 0 to let the SYN through, -RV_DROP_RATE_LIMITED to drop it. */
static __always_inline int rv_rate_limit(const struct rv_pkt *pkt, __u32 svc_id,
					 const struct rv_service *svc)
{
	const struct rv_rl_config *cfg;
	struct rv_rl_bucket fresh = {}, *b;
	__u32 zero = 0, scope = svc_id;
	__u64 now;

	if (svc->flags & RV_SVC_F_RATE_LIMIT) {
		cfg = bpf_map_lookup_elem(&svc_rl_config_map, &svc_id);
	} else {
		cfg = bpf_map_lookup_elem(&rl_config_map, &zero);
		scope = RV_RL_NODE_SVC;
	}
	if (!cfg || !cfg->enabled)
		return 0;

	/* Tick resolution: refill is computed from elapsed time, so a coarse
	 * clock only delays tokens by a tick, never loses them. */
	now = bpf_ktime_get_coarse_ns();
	if (pkt->family == RV_FAMILY_V4) {
		struct rv_rl_key key = { .svc_id = scope,
					 .saddr = pkt->saddr[0] };

		b = bpf_map_lookup_elem(&rl_buckets_map, &key);
		if (b)
			return rv_rl_take(b, cfg, now);
		fresh.last_ns = now;
		fresh.tokens_milli = (__u64)cfg->burst * 1000;
		if (rv_rl_take(&fresh, cfg, now))
			return -RV_DROP_RATE_LIMITED;
		bpf_map_update_elem(&rl_buckets_map, &key, &fresh, BPF_ANY);
		return 0;
	} else {
		struct rv_rl6_key key = { .svc_id = scope };

		rv_addr6_copy(key.saddr, pkt->saddr);
		b = bpf_map_lookup_elem(&rl_buckets_map6, &key);
		if (b)
			return rv_rl_take(b, cfg, now);
		fresh.last_ns = now;
		fresh.tokens_milli = (__u64)cfg->burst * 1000;
		if (rv_rl_take(&fresh, cfg, now))
			return -RV_DROP_RATE_LIMITED;
		bpf_map_update_elem(&rl_buckets_map6, &key, &fresh, BPF_ANY);
		return 0;
	}
}

#endif /* RV_RATELIMIT_H */
