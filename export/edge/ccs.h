/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/* ccs.h - structs shared by ccs.bpf.c (kernel) and the ccs-edge agent (ccs.c and agent.h). */
#ifndef CCS_H
#define CCS_H

#include "ccs_table.h"

#define CCS_SLOTS 2            /* double buffer: live table + previous one (rollback) */
#define CCS_MAX_ENTRIES 4000000 /* hard cap on one table */
#define CCS_MODEL_VERSION_MAX 64 /* manifest model_version: at most 63 bytes + NUL */
/*
 * A manifest's epoch and version: at most 2^53 - 1, the integers every JSON reader keeps exact
 * (json.loads, cJSON's doubles, JavaScript). The agent refuses a table above it, so no signed
 * version can take the last value of a 64-bit counter (issue 56, item 3).
 */
#define CCS_SERIAL_MAX 9007199254740991ull
/* the default bound on how far one table's version may pass the floor's, within one epoch */
#define CCS_VERSION_MAX_STEP 100000ull
/* the highest epoch an agent with no floor yet takes (its first table): above it the epochs left
 * would be few; later epochs go up one at a time */
#define CCS_FIRST_EPOCH_MAX 1048576ull

/*
 * The lookup (issue 29): an exact-match hash per slot, searched by binary search on prefix
 * lengths (Waldvogel, Varghese, Turner, Plattner, "Scalable high speed IP routing lookups",
 * SIGCOMM '97), not an LPM trie walk. Keys are 16-byte addresses with a prefix length, both
 * families in one map, IPv4 as ::ffff:a.b.c.d/(96+n). The distinct key lengths of each family are
 * in the slot's meta (lens, ascending); a lookup probes the middle length of the range
 * still open: a hit whose value says CCS_VAL_LONGER goes on among the longer lengths, any other
 * hit ends the search, a miss goes on among the shorter ones. So that a longer match is never
 * missed, every entry puts a marker on each length where the search towards its own length turns
 * longer; a marker carries its best matching prefix (the longest entry of a length <= its own
 * that covers it, copied with CCS_VAL_ENTRY) or none. At most ceil(log2(n + 1)) probes for n
 * lengths: 2 for a table of /16, /24 and /32, the ALICCS ladder (Algorithm 1).
 * The address space rule (ccs_table.h): an IPv6 entry may not lie inside ::ffff:0:0/96 (the agent
 * refuses the table), so an IPv4 client (or an IPv4-mapped one) searches the IPv4 lengths only and
 * an IPv6 client the IPv6 ones: the longest match an LPM trie holding both families would give,
 * except that an IPv6 entry covering the mapped space (::/0, ::/8) never decides for an IPv4
 * client (the search never reaches the IPv6 lengths).
 */
struct ccs_lpm_key {
	__u32 prefixlen;
	__u8 addr[16];
};

/* hash value: an entry, a marker (CCS_VAL_LONGER), or both */
#define CCS_VAL_ENTRY 0x40   /* the value holds an entry: the key's own, or a marker's best match */
#define CCS_VAL_LONGER 0x20  /* a marker: longer entries under this key, search the longer lengths */
struct ccs_lpm_val {
	__u8 cc;          /* enum ccs_cc_id */
	__u8 flags;       /* CCS_ENTRY_LOW_CONF | CCS_VAL_* */
	__u16 purity_permille;
	__u32 cwnd_clamp_segs;   /* 0 = none */
	__u64 pacing_rate_bps;   /* 0 = none */
};

#define CCS_LEN4_MAX 33   /* IPv4 lengths /0../32 (keys 96..128) */
#define CCS_LEN6_MAX 129  /* IPv6 lengths /0../128 */
#define CCS_LOOKUP_PROBES 8 /* ceil(log2(129 + 1)): the search's loop bound */

/* ccs_ctl[0]: which slot is live. Writing `live` (one 4-byte word) is the swap. */
struct ccs_ctl {
	__u32 live;          /* 0: no table; 1 + slot (slot 0 or 1) otherwise */
	__u32 generation;    /* bumped by every load/rollback (informational) */
};

/*
 * ccs_meta[slot]: what the slot holds. A load first writes valid = 0 to the idle slot, then
 * installs the lookup hash, then writes the meta with valid = 1 and index_id = the installed map's
 * id, then flips ccs_ctl.live: a load interrupted at any point leaves the slot marked invalid
 * (never a hash under another table's metadata). The agent also checks index_id against the map
 * id in ccs_tables[slot] before it trusts a slot (rollback, status).
 */
/*
 * ccs_meta.valid: 0 the slot is changing (or empty); CCS_META_STAGED its table is whole but was
 * never made live (a load writes this before the flip); CCS_META_LIVE its table was made live
 * (written after the flip, or by an agent from before STAGED). The program uses any nonzero;
 * rollback only LIVE: a load killed between its metadata and the flip is not a table to go back to.
 */
#define CCS_META_LIVE 1
#define CCS_META_STAGED 2

struct ccs_meta {
	__u64 version;
	__u64 created_unix;
	__u64 expires_unix;
	__u64 expires_mono_ns;  /* expiry on CLOCK_MONOTONIC, what the kernel checks (coarse clock) */
	__u64 loaded_unix;
	__u32 n_v4;
	__u32 n_v6;
	__u32 valid;
	__u32 index_id;          /* map id of the hash in ccs_tables[slot] (0: written by an older agent) */
	__u8 sha256[32];
	__u8 n_len4;            /* distinct IPv4 key lengths in the slot's hash (the lookup above) */
	__u8 n_len6;
	/* ascending key prefixlens: IPv4's (96 + n for /n) from 0, IPv6's from CCS_LEN4_MAX */
	__u8 lens[CCS_LEN4_MAX + CCS_LEN6_MAX];
};

/*
 * ccs_version[0]: the version rule. Tables only go forward: a load needs a version above
 * `highest` (the newest ever made live here), or equal to it with the same sha256 (the same
 * signed table again). Making an older table live takes an explicit override -- `rollback`, or
 * `load --allow-downgrade V` naming the manifest's version -- and each one is logged (stderr)
 * and recorded here. The program never reads it (agent-only, like ccs_model).
 */
struct ccs_version {
	__u64 highest;
	__u8 highest_sha256[32];
	__u64 overrides;          /* older tables made live by an override */
	__u64 override_unix;      /* the last override: when, from which live version, to which */
	__u64 override_from;
	__u64 override_to;
};

/*
 * ccs_log[0]: the transport log's ledger, kept by the agent that writes the log (translog.c) and
 * shown by status. Every record taken from the ring is either written (whole, in a log file) or
 * lost (a failed open or write: counted, never half in a file); every failed open, write,
 * truncate, fsync, close or rename is an error. The program never reads it (agent-only).
 */
struct ccs_log_state {
	__u64 written;          /* records written whole into a log file */
	__u64 lost;             /* records taken from the ring that no file holds */
	__u64 errors;           /* failed file calls */
	__u64 last_error_unix;  /* the last failure: when, errno, what ("write DIR/.NAME.part") */
	__s32 last_errno;
	__u32 degraded;         /* 1 from a failed call until a write succeeds again */
	char last_op[112];
};

/*
 * ccs_routes[0]: the route table this agent's route CCs were last written to (routes.c), so that
 * a flush takes only this agent's routes (another agent of the namespace has a table of its own)
 * and still finds them after a config moved route_table or turned route CCs off. Agent-only.
 */
struct ccs_route_state {
	char table[32];   /* as route_table says it; "" = none written since the last flush */
};

/*
 * ccs_model[slot]: the manifest's model_version of the table in the slot, for status. The
 * program never reads it; it has a map of its own (not a ccs_meta field) so that a pin dir made
 * before it still takes an in-place attach (libbpf reuses a pinned map only of the same size).
 * It belongs to the slot's table when version and loaded_unix equal the slot's ccs_meta ones.
 */
struct ccs_model {
	__u64 version;
	__u64 loaded_unix;
	char model_version[CCS_MODEL_VERSION_MAX]; /* NUL-terminated */
};

/*
 * ccs_flow[slot]: the flow tree of the slot's table (issue 27), written with ccs_model before
 * the slot's meta turns valid. It belongs to the slot's table when version and loaded_unix equal
 * the slot's ccs_meta ones (the program checks, like status does for ccs_model); tree_id is the
 * map id of the node array in ccs_trees[slot] (0: the table has no tree, and the slot holds none).
 * A map of its own, not ccs_meta fields, so that a pin dir made before it still takes an
 * in-place attach (libbpf reuses a pinned map only of the same size).
 */
struct ccs_flow {
	__u64 version;
	__u64 loaded_unix;
	__u32 tree_id;
	__u16 n_nodes;              /* 0: no tree */
	__u16 min_purity_permille;  /* an entry below it is mixed (flow modes fill, combine, prior) */
	__u16 min_leaf_permille;    /* prior: a leaf below it is unsure (a confident entry decides) */
	__u16 reserved;
	char model[CCS_MODEL_VERSION_MAX]; /* the manifest's tree.model, NUL-terminated */
};

/*
 * ccs_trees[slot] holds a one-element array map whose value is the whole tree: the walk costs one
 * map lookup, not one per node (an inner map's lookups are helper calls: the verifier cannot
 * inline them). Nodes past the table's tree_nodes are zero.
 */
struct ccs_tree {
	struct ccs_tree_node nodes[CCS_TREE_MAX_NODES];
};

/* ccs_policy.flow_mode: when the flow tree decides (export/edge/README.md, table_format.decide) */
enum ccs_flow_mode {
	CCS_FLOW_OFF = 0,      /* the table alone */
	CCS_FLOW_FILL = 1,     /* the tree where the entry is not confident (miss, keep, low, mixed) */
	CCS_FLOW_COMBINE = 2,  /* fill, and a more confident leaf overrides a confident entry */
	CCS_FLOW_FLOW = 3,     /* the tree for every treatment connection */
	CCS_FLOW_PRIOR = 4,    /* the tree, but a confident entry where the leaf is unsure */
	CCS_FLOW__MAX = 4,
};

/* ccs_policy[local port] */
struct ccs_policy {
	__u8 served;     /* 1: enforce on this port */
	__u8 ab;         /* 1: A/B mode (even CRC32 -> control) */
	__u8 caps;       /* 1: apply pacing / cwnd caps from the table */
	__u8 flow_mode;  /* enum ccs_flow_mode (was padding: 0 = off, as before) */
	__u32 service_id;
};

enum ccs_decision {
	CCS_DEC_TABLE = 0,
	CCS_DEC_FALLBACK = 1,   /* hit, but low confidence or "keep" entry, or setsockopt failed */
	CCS_DEC_DEFAULT = 2,    /* miss, or no table loaded */
	CCS_DEC_AB_CONTROL = 3,
	CCS_DEC_STALE = 4,      /* table expired */
	CCS_DEC_FLOW = 5,       /* the flow tree's leaf (flow modes) */
	CCS_DEC_TABLE_FLOW = 6, /* combine: a more confident leaf overrode a confident entry */
	CCS_DEC__MAX = 6,
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
	CCS_CNT_CC_PRESET,       /* route CCs: the socket already ran the CC decided (no switch) */
	CCS_CNT_CC_RESET,        /* route CCs: a route's CC the decision is not, put back to the default */
	CCS_CNT__MAX,
};

/*
 * ccs_flow_counters: the decision source of every lookup (issue 27) and the tree's own counts, in
 * a map of their own (a pin dir made before them keeps its ccs_counters). Invariant:
 * lookups = src_table + src_flow + src_table_flow + src_fallback + src_default.
 */
enum ccs_flow_counter {
	CCS_FCNT_SRC_TABLE = 0,
	CCS_FCNT_SRC_FLOW,
	CCS_FCNT_SRC_TABLE_FLOW,
	CCS_FCNT_SRC_FALLBACK,
	CCS_FCNT_SRC_DEFAULT,
	CCS_FCNT_TREE_EVALS,     /* tree walks (each lookup of a service whose mode asks for one) */
	CCS_FCNT_TREE_NO_LEAF,   /* a walk that found no leaf in the bound (never, for a checked tree) */
	CCS_FCNT__MAX,
};

/*
 * ccs_svc_counters[service_id]: the same counters per service (issue 59), one per-CPU value per
 * service slot: ccs_policy's service_id (1 + the service's index in the agent's config), slot 0
 * for what belongs to no service (connections on unserved ports, a listener the program could
 * not mark, a route CC put back on an unserved port). Summed over the slots, each counter is
 * ccs_counters'/ccs_flow_counters' node total. The agent starts a slot from zero when the port
 * it counts for changes (attach.c apply_policy). A map of its own, so that a pin dir made before
 * it keeps ccs_counters (libbpf reuses a pinned map only of the same size).
 */
#define CCS_SVC_SLOTS 257      /* service ids 1..256 (the agent's MAX_SERVICES) and 0 */
struct ccs_svc_counters {
	__u64 cnt[CCS_CNT__MAX];
	__u64 fcnt[CCS_FCNT__MAX];
};

#ifndef __BPF__
static const char *const ccs_flow_counter_names[CCS_FCNT__MAX] = {
	"src_table", "src_flow", "src_table_flow", "src_fallback", "src_default", "tree_evals",
	"tree_no_leaf",
};
static const char *const ccs_flow_mode_names[CCS_FLOW__MAX + 1] = { "off", "fill", "combine", "flow", "prior" };
static const char *const ccs_counter_names[CCS_CNT__MAX] = {
	"established", "no_table", "expired", "ab_control", "lookups", "miss", "hit_keep",
	"hit_lowconf", "hit_cubic", "hit_bbr", "hit_reno", "setsockopt_err", "pacing_set",
	"clamp_set", "caps_err", "log_sampled", "log_emitted", "log_dropped", "storage_err",
	"not_served", "cc_preset", "cc_reset",
};
static const char *const ccs_decision_names[] = {
	"table", "fallback", "default", "ab_control", "stale", "flow", "table+flow",
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
	__u32 service_id;        /* the policy's service (ccs_svc_counters slot), for on_close */
};

#endif /* CCS_H */
