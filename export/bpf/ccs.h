/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* ccs.h - structs shared by ccs.bpf.c (kernel) and ccs-edge.c (agent). */
#ifndef CCS_H
#define CCS_H

#include "ccs_table.h"

#define CCS_SLOTS 2            /* double buffer: live table + previous one (rollback) */
#define CCS_MAX_ENTRIES 4000000 /* hard cap on one table */

/* LPM trie key: both families in one trie, IPv4 as ::ffff:a.b.c.d/(96+n) */
struct ccs_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* trie value */
struct ccs_lpm_val {
	__u8 cc;          /* enum ccs_cc_id */
	__u8 flags;       /* CCS_ENTRY_* */
	__u16 purity_permille;
	__u32 cwnd_clamp_segs;   /* 0 = none */
	__u64 pacing_rate_bps;   /* 0 = none */
};

/* ccs_ctl[0]: which slot is live. Writing `live` (one 4-byte word) is the swap. */
struct ccs_ctl {
	__u32 live;          /* 0: no table; 1 + slot (slot 0 or 1) otherwise */
	__u32 generation;    /* bumped by every load/rollback (informational) */
};

/* ccs_meta[slot]: what the slot holds */
struct ccs_meta {
	__u64 version;
	__u64 created_unix;
	__u64 expires_unix;
	__u64 expires_mono_ns;  /* expiry on CLOCK_MONOTONIC, what the kernel checks (coarse clock) */
	__u64 loaded_unix;
	__u32 n_v4;
	__u32 n_v6;
	__u32 valid;
	__u32 pad;
	__u8 sha256[32];
};

/* ccs_policy[local port] */
struct ccs_policy {
	__u8 served;     /* 1: enforce on this port */
	__u8 ab;         /* 1: A/B mode (even CRC32 -> control) */
	__u8 caps;       /* 1: apply pacing / cwnd caps from the table */
	__u8 pad;
	__u32 service_id;
};

enum ccs_decision {
	CCS_DEC_TABLE = 0,
	CCS_DEC_FALLBACK = 1,   /* hit, but low confidence or "keep" entry, or setsockopt failed */
	CCS_DEC_DEFAULT = 2,    /* miss, or no table loaded */
	CCS_DEC_AB_CONTROL = 3,
	CCS_DEC_STALE = 4,      /* table expired */
};

enum ccs_counter {
	CCS_CNT_ESTABLISHED = 0, /* passive connections on served ports */
	CCS_CNT_NO_TABLE,
	CCS_CNT_EXPIRED,
	CCS_CNT_AB_CONTROL,
	CCS_CNT_LOOKUPS,
	CCS_CNT_MISS,
	CCS_CNT_HIT_KEEP,        /* hit on a cc=0 ("keep default") entry */
	CCS_CNT_HIT_LOWCONF,
	CCS_CNT_HIT_CUBIC,
	CCS_CNT_HIT_BBR,
	CCS_CNT_HIT_RENO,
	CCS_CNT_SETSOCKOPT_ERR,  /* TCP_CONGESTION failed */
	CCS_CNT_PACING_SET,
	CCS_CNT_CLAMP_SET,
	CCS_CNT_CAPS_ERR,
	CCS_CNT_LOG_SAMPLED,
	CCS_CNT_LOG_EMITTED,
	CCS_CNT_LOG_DROPPED,     /* ring buffer full */
	CCS_CNT_STORAGE_ERR,
	CCS_CNT_NOT_SERVED,      /* passive connections on ports outside the policy */
	CCS_CNT__MAX,
};

#ifndef __BPF__
static const char *const ccs_counter_names[CCS_CNT__MAX] = {
	"established", "no_table", "expired", "ab_control", "lookups", "miss", "hit_keep",
	"hit_lowconf", "hit_cubic", "hit_bbr", "hit_reno", "setsockopt_err", "pacing_set",
	"clamp_set", "caps_err", "log_sampled", "log_emitted", "log_dropped", "storage_err",
	"not_served",
};
static const char *const ccs_decision_names[] = {
	"table", "fallback", "default", "ab_control", "stale",
};
#endif

/* per-connection state (socket storage) and the ring-buffer record emitted on close */
struct ccs_conn {
	__u64 cookie;            /* socket cookie: the 64-bit connection id */
	__u64 start_boot_ns;     /* PASSIVE_ESTABLISHED, CLOCK_BOOTTIME */
	__u64 end_boot_ns;
	__u64 table_version;
	__u64 bytes_acked;
	__u8 addr[16];           /* peer address, network order (v4 in addr[0..3]) */
	__u8 family;             /* 4 or 6 */
	__u8 decision;           /* enum ccs_decision */
	__u8 has_table;          /* table_version valid */
	__u8 pad;
	__u16 client_port;       /* host order */
	__u16 server_port;
	char cc[16];             /* CC name of the socket at close */
	__u32 mss_bytes;
	__u32 connection_time_us;
	__u32 init_snd_wnd_bytes;
	__u32 min_rtt_us;
	__u32 max_snd_wnd_bytes;
	__u32 min_snd_wnd_bytes;
	__u32 min_rtt_var_us;
	__u32 max_rtt_var_us;
	__u32 min_rto_us;
	__u32 min_srtt_us;
	__u32 max_srtt_us;
	__u32 max_cwnd_segs;
	__u32 data_segs_out;
	__u32 total_retrans;
	__u32 max_inflight_segs;
	__u32 pad2;
};

#endif /* CCS_H */
