/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/*
 * Clang emits BTF only for types a program uses, and map fields are
 * fixed-width integers by rule, so the ABI enums would never reach BTF.
 * This read-only anchor carries them into the object: the Rust skeleton
 * and bpftool then know every mode, state, limit and drop reason by name.
 */
#ifndef RV_BTF_ENUMS_H
#define RV_BTF_ENUMS_H

#include "common.h"

struct rv_btf_enums {
	enum rv_abi abi;
	enum rv_limits limits;
	enum rv_mode mode;
	enum rv_affinity affinity;
	enum rv_health health;
	enum rv_family family;
	enum rv_service_flags service_flags;
	enum rv_drop_reason drop_reason;
	enum rv_nexthop_flags nexthop_flags;
	enum rv_fullnat_flags fullnat_flags;
	enum rv_iface_flags iface_flags;
};

const volatile struct rv_btf_enums rv_btf_enums = {};

#endif /* RV_BTF_ENUMS_H */
