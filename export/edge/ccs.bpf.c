// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ccs.bpf.c - ccselect edge enforcer (ALICCS section 3.3 / 4.1, Appendix F, as eBPF sock_ops).
 *
 * PASSIVE_ESTABLISHED on a served port (ccs_policy[local port]):
 *   live table?  -> no: decision default
 *   expired?     -> decision stale (default CC kept)
 *   A/B service and CRC32(client address) even -> decision ab_control
 *   longest-prefix lookup in the live hash (ccs_tables[slot], ccs.h) -> miss (or, for an IPv4 client, an IPv6
 *   entry covering ::ffff:0:0/96): default; keep/low-confidence: fallback;
 *   else bpf_setsockopt(TCP_CONGESTION) (+ caps when the service allows them): table.
 * With a flow tree in the live slot (ccs_flow, ccs_trees) and the service's flow_mode asking for
 * it, the handshake's MSS, window and first RTT sample walk the tree (a bounded loop over the
 * node array): fill -> the leaf where the entry is not confident (miss, keep, low confidence,
 * purity below the tree's min): decision flow; combine -> also on a confident entry, whose CC a
 * leaf of higher confidence that disagrees replaces: table+flow; flow -> the leaf always; prior ->
 * the leaf, except that a confident entry decides where the leaf is unsure (its confidence below
 * the tree's min_leaf_permille): the flow first, the prefix's history where the flow says little.
 * export/artifact/table_format.decide is the same decision in Python (issue 27).
 * Sampled connections (sample_thresh) get socket storage, RTT and state callbacks; on
 * TCP_CLOSE one struct ccs_conn goes to the ring buffer (the transport log).
 * Every counter is counted for the node (ccs_counters, ccs_flow_counters) and for the service
 * (ccs_svc_counters[service_id], found once per connection with its policy; issue 59).
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_endian.h>
#include "ccs.h"

#define AF_INET 2
#define AF_INET6 10
#define SOL_SOCKET 1
#define SOL_TCP 6
#define TCP_CONGESTION 13
#define SO_MAX_PACING_RATE 47
#define SO_MARK 36
#define TCP_BPF_SNDCWND_CLAMP 1002

/*
 * Read a u32 field of the context with a constant offset. clang may otherwise keep an offset in
 * a register and add it to the ctx pointer, which the verifier refuses ("modified ctx ptr").
 */
#define CTX_U32(ctx, field) ({							\
	__u32 __v;								\
	asm volatile("%0 = *(u32 *)(%1 + %2)"					\
		     : "=r"(__v)						\
		     : "r"(ctx), "i"(__builtin_offsetof(struct bpf_sock_ops, field)));	\
	__v; })

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* a connection is logged when bpf_get_prandom_u32() < sample_thresh (1 << 32: all, 0: none) */
const volatile __u64 sample_thresh = 0;
/*
 * The CC id (enum ccs_cc_id) of net.ipv4.tcp_congestion_control when the agent attached: 0
 * unknown, 0xff none of ours. Only a table CC equal to it is checked against the socket's own
 * CC (to skip a no-op bpf_setsockopt); any other goes straight to bpf_setsockopt, which is right
 * whatever the socket runs. A stale value (sysctl changed since) costs a check, never a wrong CC.
 */
const volatile __u8 default_cc_id = 0;
/*
 * Route CCs (issue 29, export/edge/README.md): the agent also writes the live table's CCs into
 * routes (`congctl`), which the kernel applies when it creates the child socket, with no call
 * from here. The program stays the authority: it reads the socket's CC before any switch (a route
 * that agrees leaves nothing to do, the cost of bpf_setsockopt saved), and where it decides the
 * default (no table, stale, A/B control, miss, keep, low confidence, an unserved port) it puts
 * back over a route's CC the CC the socket would have had without us (route_default). A missing,
 * late or stale route costs a switch, never a wrong CC.
 */
const volatile __u8 cc_routes = 0;
/*
 * Route CCs confined to the cgroup (issue 56): the agent's table is looked up only for sockets
 * carrying route_mark (its `ip rule fwmark route_mark lookup <route_table>`). The program marks
 * this cgroup's listeners when they listen (mark_listener); a SYN-ACK's route lookup and the
 * child socket take the listener's mark (inet_request_mark, tcp_fwmark_accept off), so only this
 * cgroup's passive connections ever get a route's CC: no other service, no outgoing connection.
 */
const volatile __u32 route_mark = 0;
/* the enforced cgroup's id (kernfs id), for ccs_mark_listeners: its listeners and its descendants' */
const volatile __u64 mark_cgroup_id = 0;
extern unsigned int CONFIG_HZ __kconfig __weak;
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

/* the slot's lookup hash (ccs.h: entries and markers, searched by prefix length) */
struct inner_index {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(key_size, sizeof(struct ccs_lpm_key));
	__uint(value_size, sizeof(struct ccs_lpm_val));
	__uint(max_entries, 1);
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CCS_SLOTS);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct inner_index);
} ccs_tables SEC(".maps");

/* the flow tree of each slot's table: one value holding every node, swapped in like the index
 * (ccs.h struct ccs_tree, ccs_flow) */
struct inner_tree {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__uint(key_size, sizeof(__u32));
	/* a size, not a BTF type: clang emits an inner map's value type only as a forward decl */
	__uint(value_size, sizeof(struct ccs_tree));
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, CCS_SLOTS);
	__type(key, __u32);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
	__array(values, struct inner_tree);
} ccs_trees SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CCS_SLOTS);
	__type(key, __u32);
	__type(value, struct ccs_flow);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_flow SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CCS_FCNT__MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_flow_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ccs_ctl);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_ctl SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CCS_SLOTS);
	__type(key, __u32);
	__type(value, struct ccs_meta);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_meta SEC(".maps");

/* ccs_version[0]: the version rule's state, for the agent only (ccs.h) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ccs_version);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_version SEC(".maps");

/* ccs_log[0]: the transport log's ledger, for the agent only (ccs.h) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ccs_log_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_log SEC(".maps");

/* ccs_routes[0]: where this agent's route CCs are, for the agent only (ccs.h) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ccs_route_state);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_routes SEC(".maps");

/* ccs_model[slot]: for the agent's status only (ccs.h) */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, CCS_SLOTS);
	__type(key, __u32);
	__type(value, struct ccs_model);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_model SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct ccs_policy);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_policy SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CCS_CNT__MAX);
	__type(key, __u32);
	__type(value, __u64);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_counters SEC(".maps");

/* the counters per service (ccs.h struct ccs_svc_counters): slot = ccs_policy's service_id, 0 none */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CCS_SVC_SLOTS);
	__type(key, __u32);
	__type(value, struct ccs_svc_counters);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_svc_counters SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct ccs_conn);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_conns SEC(".maps");

#define RB_BYTES (1 << 22)
#define RB_WAKE_BYTES (RB_BYTES / 4)

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, RB_BYTES);
	__uint(pinning, LIBBPF_PIN_BY_NAME);
} ccs_events SEC(".maps");

/* CRC-32/IEEE (reflected, poly 0xEDB88320), as zlib.crc32 */
static const __u32 crc_tab[256] = {
	0x00000000, 0x77073096, 0xee0e612c, 0x990951ba, 0x076dc419, 0x706af48f,
	0xe963a535, 0x9e6495a3, 0x0edb8832, 0x79dcb8a4, 0xe0d5e91e, 0x97d2d988,
	0x09b64c2b, 0x7eb17cbd, 0xe7b82d07, 0x90bf1d91, 0x1db71064, 0x6ab020f2,
	0xf3b97148, 0x84be41de, 0x1adad47d, 0x6ddde4eb, 0xf4d4b551, 0x83d385c7,
	0x136c9856, 0x646ba8c0, 0xfd62f97a, 0x8a65c9ec, 0x14015c4f, 0x63066cd9,
	0xfa0f3d63, 0x8d080df5, 0x3b6e20c8, 0x4c69105e, 0xd56041e4, 0xa2677172,
	0x3c03e4d1, 0x4b04d447, 0xd20d85fd, 0xa50ab56b, 0x35b5a8fa, 0x42b2986c,
	0xdbbbc9d6, 0xacbcf940, 0x32d86ce3, 0x45df5c75, 0xdcd60dcf, 0xabd13d59,
	0x26d930ac, 0x51de003a, 0xc8d75180, 0xbfd06116, 0x21b4f4b5, 0x56b3c423,
	0xcfba9599, 0xb8bda50f, 0x2802b89e, 0x5f058808, 0xc60cd9b2, 0xb10be924,
	0x2f6f7c87, 0x58684c11, 0xc1611dab, 0xb6662d3d, 0x76dc4190, 0x01db7106,
	0x98d220bc, 0xefd5102a, 0x71b18589, 0x06b6b51f, 0x9fbfe4a5, 0xe8b8d433,
	0x7807c9a2, 0x0f00f934, 0x9609a88e, 0xe10e9818, 0x7f6a0dbb, 0x086d3d2d,
	0x91646c97, 0xe6635c01, 0x6b6b51f4, 0x1c6c6162, 0x856530d8, 0xf262004e,
	0x6c0695ed, 0x1b01a57b, 0x8208f4c1, 0xf50fc457, 0x65b0d9c6, 0x12b7e950,
	0x8bbeb8ea, 0xfcb9887c, 0x62dd1ddf, 0x15da2d49, 0x8cd37cf3, 0xfbd44c65,
	0x4db26158, 0x3ab551ce, 0xa3bc0074, 0xd4bb30e2, 0x4adfa541, 0x3dd895d7,
	0xa4d1c46d, 0xd3d6f4fb, 0x4369e96a, 0x346ed9fc, 0xad678846, 0xda60b8d0,
	0x44042d73, 0x33031de5, 0xaa0a4c5f, 0xdd0d7cc9, 0x5005713c, 0x270241aa,
	0xbe0b1010, 0xc90c2086, 0x5768b525, 0x206f85b3, 0xb966d409, 0xce61e49f,
	0x5edef90e, 0x29d9c998, 0xb0d09822, 0xc7d7a8b4, 0x59b33d17, 0x2eb40d81,
	0xb7bd5c3b, 0xc0ba6cad, 0xedb88320, 0x9abfb3b6, 0x03b6e20c, 0x74b1d29a,
	0xead54739, 0x9dd277af, 0x04db2615, 0x73dc1683, 0xe3630b12, 0x94643b84,
	0x0d6d6a3e, 0x7a6a5aa8, 0xe40ecf0b, 0x9309ff9d, 0x0a00ae27, 0x7d079eb1,
	0xf00f9344, 0x8708a3d2, 0x1e01f268, 0x6906c2fe, 0xf762575d, 0x806567cb,
	0x196c3671, 0x6e6b06e7, 0xfed41b76, 0x89d32be0, 0x10da7a5a, 0x67dd4acc,
	0xf9b9df6f, 0x8ebeeff9, 0x17b7be43, 0x60b08ed5, 0xd6d6a3e8, 0xa1d1937e,
	0x38d8c2c4, 0x4fdff252, 0xd1bb67f1, 0xa6bc5767, 0x3fb506dd, 0x48b2364b,
	0xd80d2bda, 0xaf0a1b4c, 0x36034af6, 0x41047a60, 0xdf60efc3, 0xa867df55,
	0x316e8eef, 0x4669be79, 0xcb61b38c, 0xbc66831a, 0x256fd2a0, 0x5268e236,
	0xcc0c7795, 0xbb0b4703, 0x220216b9, 0x5505262f, 0xc5ba3bbe, 0xb2bd0b28,
	0x2bb45a92, 0x5cb36a04, 0xc2d7ffa7, 0xb5d0cf31, 0x2cd99e8b, 0x5bdeae1d,
	0x9b64c2b0, 0xec63f226, 0x756aa39c, 0x026d930a, 0x9c0906a9, 0xeb0e363f,
	0x72076785, 0x05005713, 0x95bf4a82, 0xe2b87a14, 0x7bb12bae, 0x0cb61b38,
	0x92d28e9b, 0xe5d5be0d, 0x7cdcefb7, 0x0bdbdf21, 0x86d3d2d4, 0xf1d4e242,
	0x68ddb3f8, 0x1fda836e, 0x81be16cd, 0xf6b9265b, 0x6fb077e1, 0x18b74777,
	0x88085ae6, 0xff0f6a70, 0x66063bca, 0x11010b5c, 0x8f659eff, 0xf862ae69,
	0x616bffd3, 0x166ccf45, 0xa00ae278, 0xd70dd2ee, 0x4e048354, 0x3903b3c2,
	0xa7672661, 0xd06016f7, 0x4969474d, 0x3e6e77db, 0xaed16a4a, 0xd9d65adc,
	0x40df0b66, 0x37d83bf0, 0xa9bcae53, 0xdebb9ec5, 0x47b2cf7f, 0x30b5ffe9,
	0xbdbdf21c, 0xcabac28a, 0x53b39330, 0x24b4a3a6, 0xbad03605, 0xcdd70693,
	0x54de5729, 0x23d967bf, 0xb3667a2e, 0xc4614ab8, 0x5d681b02, 0x2a6f2b94,
	0xb40bbe37, 0xc30c8ea1, 0x5a05df1b, 0x2d02ef8d,
};

/* the counters of service slot `id` (ccs_policy's service_id; 0 and any id past the slots: none) */
static __always_inline struct ccs_svc_counters *svc_counters(__u32 id)
{
	if (id >= CCS_SVC_SLOTS)
		id = 0;
	return bpf_map_lookup_elem(&ccs_svc_counters, &id);
}

/* one event: the node's total and the service's (sc: its svc_counters slot) */
static __always_inline void cnt(struct ccs_svc_counters *sc, __u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&ccs_counters, &idx);

	if (v)
		*v += 1;
	if (sc && idx < CCS_CNT__MAX)
		sc->cnt[idx] += 1;
}

/* an event of no service (slot 0): a listener, an unserved port */
static __always_inline void cnt0(__u32 idx)
{
	cnt(svc_counters(0), idx);
}

static __always_inline void fcnt(struct ccs_svc_counters *sc, __u32 idx)
{
	__u64 *v = bpf_map_lookup_elem(&ccs_flow_counters, &idx);

	if (v)
		*v += 1;
	if (sc && idx < CCS_FCNT__MAX)
		sc->fcnt[idx] += 1;
}

/*
 * The leaf the flow (x[CCS_FEAT_*]) reaches: at most CCS_TREE_MAX_DEPTH splits, then the leaf,
 * so CCS_TREE_MAX_DEPTH + 1 node reads bound the loop (the agent refused deeper trees, cycles
 * and bad feature ids at load; a walk that still ends without a leaf returns -1).
 */
static __always_inline int tree_leaf(void *tree_map, __u32 mss, __u32 wnd, __u32 rtt, __u8 *cc,
				     __u16 *conf)
{
	struct ccs_tree *tree;
	struct ccs_tree_node *n;
	__u32 idx = 0, v;
	int i;

	tree = bpf_map_lookup_elem(tree_map, &idx);
	if (!tree)
		return -1;
	for (i = 0; i <= CCS_TREE_MAX_DEPTH; i++) {
		if (idx >= CCS_TREE_MAX_NODES)
			return -1;
		n = &tree->nodes[idx];
		if (n->feature == CCS_TREE_LEAF) {
			*cc = n->cc;
			*conf = n->conf_permille;
			return 0;
		}
		if (n->feature == CCS_FEAT_MSS)
			v = mss;
		else if (n->feature == CCS_FEAT_INIT_SND_WND)
			v = wnd;
		else if (n->feature == CCS_FEAT_CONN_TIME)
			v = rtt;
		else
			return -1;
		idx = v <= n->threshold ? n->left : n->right;
	}
	return -1;
}

static __always_inline __u32 crc32_addr(const __u8 *p, int n)
{
	__u32 c = 0xffffffff;
	int i;

	for (i = 0; i < 16; i++) {
		if (i >= n)
			break;
		c = crc_tab[(c ^ p[i]) & 0xff] ^ (c >> 8);
	}
	return c ^ 0xffffffff;
}

/*
 * bpf_setsockopt(TCP_CONGESTION), unless the socket already runs that CC (the first 8 bytes of
 * icsk_ca_ops->name, compared as one word in memory order, equal the NUL-padded name): then the
 * call would change nothing (tcp_set_congestion_control returns early on the same ops) and is
 * skipped. The socket's own CC counts, not the sysctl default (a listener may have set another).
 * Checked only when `check` (the caller asks when cc is the default, default_cc_id, and always
 * with route CCs), through a read-only cast of the socket (bpf_rdonly_cast: a verifier-inlined
 * cast, no helper call; its loads are fault-safe) rather than bpf_skc_to_tcp_sock.
 * 1: set, 0: already that CC, <0: error.
 */
static __always_inline int set_cc(struct bpf_sock_ops *skops, bool check, __u8 cc)
{
	union {
		__u64 w;
		char c[8];
	} name = { .w = 0 };	/* all three names are shorter than 8 bytes */

	if (cc == CCS_CC_CUBIC) {
		name.c[0] = 'c'; name.c[1] = 'u'; name.c[2] = 'b'; name.c[3] = 'i'; name.c[4] = 'c';
	} else if (cc == CCS_CC_BBR) {
		name.c[0] = 'b'; name.c[1] = 'b'; name.c[2] = 'r';
	} else if (cc == CCS_CC_RENO) {
		name.c[0] = 'r'; name.c[1] = 'e'; name.c[2] = 'n'; name.c[3] = 'o';
	} else {
		return -1;
	}
	if (check && skops->sk && CTX_U32(skops, is_fullsock)) {
		struct tcp_sock *tp = bpf_rdonly_cast(skops->sk, bpf_core_type_id_kernel(struct tcp_sock));
		const struct tcp_congestion_ops *ops = tp->inet_conn.icsk_ca_ops;

		if (ops && *(__u64 *)ops->name == name.w)
			return 0;
	}
	return bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, name.c, sizeof(name.c)) ?: 1;
}

/* whether the socket's CC was chosen by TCP_CONGESTION (icsk_ca_setsockopt, copied to a child) */
static __always_inline bool ca_chosen(struct tcp_sock *tp)
{
	return BPF_CORE_READ_BITFIELD(&tp->inet_conn, icsk_ca_setsockopt);
}

/*
 * Route CCs: mark a listener of the cgroup, so its connections' route lookups see the agent's
 * table. Not one that chose its CC before listen (its children start on that CC, which no route
 * may replace: a reno listener's misses stay reno) nor one with a mark of its own.
 */
static __always_inline void mark_listener(struct bpf_sock_ops *skops)
{
	struct tcp_sock *tp;
	int mark = (int)route_mark;

	if (!route_mark || !skops->sk || !CTX_U32(skops, is_fullsock))
		return;
	tp = bpf_rdonly_cast(skops->sk, bpf_core_type_id_kernel(struct tcp_sock));
	if (tp->inet_conn.icsk_inet.sk.sk_mark || ca_chosen(tp))
		return;
	if (bpf_setsockopt(skops, SOL_SOCKET, SO_MARK, &mark, sizeof(mark)))
		cnt0(CCS_CNT_SETSOCKOPT_ERR);
}

/*
 * Route CCs: where the program decides the default, put back over a route's CC the CC the socket
 * would have had without us (cnt cc_reset if so). A child of a listener that did not choose its CC
 * gets, without a route, the network namespace's default of that moment (tcp_ca_openreq_child):
 * the sysctl now, not at attach. A listener that chose its CC is never marked, so no route in the
 * agent's table reaches its children; they are left alone (the listener's CC is not known here).
 */
static __always_inline void route_default(struct bpf_sock_ops *skops, struct ccs_svc_counters *sc)
{
	const struct tcp_congestion_ops *ops, *def;
	struct tcp_sock *tp;
	__u64 name[2];

	if (!skops->sk || !CTX_U32(skops, is_fullsock))
		return;
	tp = bpf_rdonly_cast(skops->sk, bpf_core_type_id_kernel(struct tcp_sock));
	if (ca_chosen(tp))
		return;
	ops = tp->inet_conn.icsk_ca_ops;
	def = tp->inet_conn.icsk_inet.sk.__sk_common.skc_net.net->ipv4.tcp_congestion_control;
	if (!ops || !def)
		return;
	/* TCP_CA_NAME_MAX is 16 and names are NUL-terminated: two words each */
	name[0] = *(__u64 *)&def->name[0];
	name[1] = *(__u64 *)&def->name[8];
	if (*(__u64 *)&ops->name[0] == name[0] && *(__u64 *)&ops->name[8] == name[1])
		return;
	if (bpf_setsockopt(skops, SOL_TCP, TCP_CONGESTION, name, sizeof(name)))
		cnt(sc, CCS_CNT_SETSOCKOPT_ERR);
	else
		cnt(sc, CCS_CNT_CC_RESET);
}

static __always_inline void update_stats(struct ccs_conn *c, struct bpf_sock_ops *skops,
					 struct tcp_sock *tp)
{
	__u32 srtt = CTX_U32(skops, srtt_us) >> 3;
	__u32 cwnd = CTX_U32(skops, snd_cwnd);
	__u32 inflight = CTX_U32(skops, packets_out) - (CTX_U32(skops, sacked_out) + CTX_U32(skops, lost_out)) +
			 CTX_U32(skops, retrans_out);

	if (srtt) {
		if (!c->min_srtt_us || srtt < c->min_srtt_us)
			c->min_srtt_us = srtt;
		if (srtt > c->max_srtt_us)
			c->max_srtt_us = srtt;
	}
	if (cwnd > c->max_cwnd_segs)
		c->max_cwnd_segs = cwnd;
	if ((int)inflight > 0 && inflight > c->max_inflight_segs)
		c->max_inflight_segs = inflight;
	if (tp) {
		/* direct loads through the BTF pointer (no bpf_probe_read_kernel call per field) */
		__u32 wnd = tp->snd_wnd;
		__u32 var = tp->mdev_us >> 2;
		__u32 rto = tp->inet_conn.icsk_rto;
		__u32 hz = CONFIG_HZ;

		if (wnd < c->min_snd_wnd_bytes)
			c->min_snd_wnd_bytes = wnd;
		if (wnd > c->max_snd_wnd_bytes)
			c->max_snd_wnd_bytes = wnd;
		if (var < c->min_rtt_var_us)
			c->min_rtt_var_us = var;
		if (var > c->max_rtt_var_us)
			c->max_rtt_var_us = var;
		if (hz) {
			__u32 rto_us = (__u32)((__u64)rto * 1000000 / hz);

			if (rto_us && (!c->min_rto_us || rto_us < c->min_rto_us))
				c->min_rto_us = rto_us;
		}
	}
}

static __always_inline void start_log(struct bpf_sock_ops *skops, struct bpf_sock *sk,
				      struct tcp_sock *tp, struct ccs_lpm_key *key,
				      __u8 family, __u8 decision, __u64 version, __u8 has_table,
				      struct ccs_svc_counters *sc, __u32 service_id)
{
	struct ccs_conn *c;

	if (!sk)
		return;
	cnt(sc, CCS_CNT_LOG_SAMPLED);
	c = bpf_sk_storage_get(&ccs_conns, sk, 0, BPF_SK_STORAGE_GET_F_CREATE);
	if (!c) {
		cnt(sc, CCS_CNT_STORAGE_ERR);
		return;
	}
	c->service_id = service_id;
	if (!tp)
		tp = bpf_skc_to_tcp_sock(sk);
	c->cookie = bpf_get_socket_cookie(skops);
	c->start_boot_ns = bpf_ktime_get_boot_ns();
	c->table_version = version;
	c->has_table = has_table;
	c->family = family;
	c->decision = decision;
	if (family == 4) {
		__builtin_memset(c->addr, 0, sizeof(c->addr));
		__builtin_memcpy(c->addr, &key->addr[12], 4);
	} else {
		__builtin_memcpy(c->addr, key->addr, 16);
	}
	c->client_port = bpf_ntohs(CTX_U32(skops, remote_port) >> 16);
	c->server_port = (__u16)CTX_U32(skops, local_port);
	c->mss_bytes = CTX_U32(skops, mss_cache);
	c->connection_time_us = CTX_U32(skops, srtt_us) >> 3;
	c->min_snd_wnd_bytes = 0xffffffff;
	c->min_rtt_var_us = 0xffffffff;
	c->max_snd_wnd_bytes = 0;
	c->max_rtt_var_us = 0;
	c->min_srtt_us = 0;
	c->max_srtt_us = 0;
	c->min_rto_us = 0;
	c->max_cwnd_segs = 0;
	c->max_inflight_segs = 0;
	c->init_snd_wnd_bytes = tp ? tp->snd_wnd : 0;
	update_stats(c, skops, tp);
	bpf_sock_ops_cb_flags_set(skops, CTX_U32(skops, bpf_sock_ops_cb_flags) |
				  BPF_SOCK_OPS_RTT_CB_FLAG | BPF_SOCK_OPS_STATE_CB_FLAG);
}

/*
 * The expiry check's clock, CLOCK_MONOTONIC in ns. The child socket's tcp_clock_cache
 * (tcp_clock_ns(), ktime_get_ns()) is refreshed by tcp_rcv_state_process for the very segment that
 * completes the handshake, just before it calls this program (PASSIVE_ESTABLISHED from the
 * SYN_RECV state, a request socket's child or a syncookie's): read through the read-only cast, a
 * load instead of a helper call (bpf_ktime_get_coarse_ns cost ~35 ns per connection, measured:
 * export/edge/README.md "What the default costs"), and exact where the coarse clock lags by up to
 * a tick. A Fast Open child (fastopen_rsk set) is created at the SYN, its cache copied from the
 * listener and not refreshed: it, a socket that is not a full one and a cache still 0 take
 * bpf_ktime_get_coarse_ns() as before.
 */
static __always_inline __u64 expiry_now_ns(struct bpf_sock_ops *skops)
{
	struct tcp_sock *tp;
	__u64 t;

	if (skops->sk && CTX_U32(skops, is_fullsock)) {
		tp = bpf_rdonly_cast(skops->sk, bpf_core_type_id_kernel(struct tcp_sock));
		if (!tp->fastopen_rsk) {
			t = tp->tcp_clock_cache;
			if (t)
				return t;
		}
	}
	return bpf_ktime_get_coarse_ns();
}

/* a 32-bit word of an address cut to `bits` of it (0..32), in network order */
static __always_inline __u32 cut_word(__u32 w, int bits)
{
	if (bits <= 0)
		return 0;
	if (bits >= 32)
		return w;
	return w & bpf_htonl(0xffffffffu << (32 - bits));
}

/*
 * The longest entry covering the client (key: its address, family 4 or 6), by binary search on
 * the family's prefix lengths in the slot's hash (ccs.h): at most CCS_LOOKUP_PROBES lookups,
 * one per length probed. NULL: no entry covers it.
 */
static __always_inline struct ccs_lpm_val *lookup(void *map, const struct ccs_meta *meta,
						   const struct ccs_lpm_key *client, __u8 family)
{
	struct ccs_lpm_val *v, *best = NULL;
	struct ccs_lpm_key k;
	int lo = 0, hi, mid, i, plen;
	__u32 idx, base = family == 4 ? 0 : CCS_LEN4_MAX;
	__u32 w0 = *(__u32 *)&client->addr[0], w1 = *(__u32 *)&client->addr[4];
	__u32 w2 = *(__u32 *)&client->addr[8], w3 = *(__u32 *)&client->addr[12];

	hi = (int)(family == 4 ? meta->n_len4 : meta->n_len6) - 1;
	for (i = 0; i < CCS_LOOKUP_PROBES; i++) {
		if (lo > hi)
			break;
		mid = (lo + hi) >> 1;
		idx = (__u32)mid + base;
		if (idx >= CCS_LEN4_MAX + CCS_LEN6_MAX)
			break;
		plen = meta->lens[idx];
		k.prefixlen = plen;
		*(__u32 *)&k.addr[0] = cut_word(w0, plen);
		*(__u32 *)&k.addr[4] = cut_word(w1, plen - 32);
		*(__u32 *)&k.addr[8] = cut_word(w2, plen - 64);
		*(__u32 *)&k.addr[12] = cut_word(w3, plen - 96);
		v = bpf_map_lookup_elem(map, &k);
		if (!v) {
			hi = mid - 1;
			continue;
		}
		if (v->flags & CCS_VAL_ENTRY)
			best = v;
		if (!(v->flags & CCS_VAL_LONGER))
			break;
		lo = mid + 1;
	}
	return best;
}

/*
 * What on_established decided for one connection, filled step by step: the table's answer
 * (table_decide), the flow tree's (flow_decide), the CC set (apply_cc); log_decision reads it.
 */
struct decision {
	struct ccs_lpm_key key;    /* the client's address, prefix length 128 */
	struct ccs_meta *meta;     /* the live slot's meta (NULL: no table) */
	struct ccs_lpm_val *val;   /* the entry that covers the client (NULL: none) */
	struct tcp_sock *tp;       /* the socket, if the flow tree needed it */
	__u64 version;             /* the live table's version (0: none) */
	__u32 slot;                /* the live slot (valid once meta is set) */
	__u16 purity;              /* the entry's purity, per mille */
	__u8 family;               /* 4 (also an IPv4-mapped IPv6 client) or 6 */
	__u8 decision;             /* enum ccs_decision */
	__u8 has_table;
	__u8 table_cc;             /* the table's CC (0: none) */
	__u8 cc;                   /* the CC to set (0: the socket keeps the default) */
	bool looked_up;            /* the index was searched */
};

/* step 1: the client's address as a /128 key (an IPv4 client as ::ffff:a.b.c.d); -1: no IP */
static __always_inline int client_key(struct bpf_sock_ops *skops, struct decision *d)
{
	__u32 a0, a1, a2;

	if (skops->family == AF_INET) {
		d->key.addr[10] = 0xff;
		d->key.addr[11] = 0xff;
		*(__u32 *)&d->key.addr[12] = skops->remote_ip4;
		d->family = 4;
	} else if (skops->family == AF_INET6) {
		a0 = skops->remote_ip6[0];
		a1 = skops->remote_ip6[1];
		a2 = skops->remote_ip6[2];
		*(__u32 *)&d->key.addr[0] = a0;
		*(__u32 *)&d->key.addr[4] = a1;
		*(__u32 *)&d->key.addr[8] = a2;
		*(__u32 *)&d->key.addr[12] = skops->remote_ip6[3];
		d->family = (a0 == 0 && a1 == 0 && a2 == bpf_htonl(0x0000ffff)) ? 4 : 6;
	} else {
		return -1;
	}
	d->key.prefixlen = 128;
	return 0;
}

/*
 * step 2: the live table's answer: none (no table), stale (expired), A/B control, or the index's
 * entry for the client (miss, keep, low confidence: fallback; else the entry's CC). 0: go on to the
 * flow tree; -1: decided without a lookup (d->decision says what).
 */
static __always_inline int table_decide(struct bpf_sock_ops *skops, const struct ccs_policy *pol,
					struct ccs_svc_counters *sc, struct decision *d)
{
	struct ccs_lpm_val *val;
	struct ccs_ctl *ctl;
	void *index_map;
	__u32 zero = 0;

	ctl = bpf_map_lookup_elem(&ccs_ctl, &zero);
	if (!ctl || ctl->live == 0 || ctl->live > CCS_SLOTS) {
		cnt(sc, CCS_CNT_NO_TABLE);
		return -1;
	}
	d->slot = ctl->live - 1;
	d->meta = bpf_map_lookup_elem(&ccs_meta, &d->slot);
	index_map = bpf_map_lookup_elem(&ccs_tables, &d->slot);
	if (!d->meta || !d->meta->valid || !index_map) {
		cnt(sc, CCS_CNT_NO_TABLE);
		return -1;
	}
	d->version = d->meta->version;
	d->has_table = 1;
	if (expiry_now_ns(skops) >= d->meta->expires_mono_ns) {
		cnt(sc, CCS_CNT_EXPIRED);
		d->decision = CCS_DEC_STALE;
		return -1;
	}
	if (pol->ab) {
		__u32 crc = d->family == 4 ? crc32_addr(&d->key.addr[12], 4) : crc32_addr(d->key.addr, 16);

		if (!(crc & 1)) {
			cnt(sc, CCS_CNT_AB_CONTROL);
			d->decision = CCS_DEC_AB_CONTROL;
			return -1;
		}
	}
	cnt(sc, CCS_CNT_LOOKUPS);
	d->looked_up = true;
	val = lookup(index_map, d->meta, &d->key, d->family);
	d->val = val;
	/* an IPv6 entry covering ::ffff:0:0/96 (e.g. ::/0) never decides for an IPv4 client: lookup
	 * searches the IPv4 lengths only */
	if (!val) {
		cnt(sc, CCS_CNT_MISS);
	} else if (val->cc == CCS_CC_KEEP || val->cc > CCS_CC_MAX) {
		cnt(sc, CCS_CNT_HIT_KEEP);
		d->decision = CCS_DEC_FALLBACK;
	} else if (val->flags & CCS_ENTRY_LOW_CONF) {
		cnt(sc, CCS_CNT_HIT_LOWCONF);
		d->decision = CCS_DEC_FALLBACK;
	} else {
		cnt(sc, CCS_CNT_HIT_CUBIC + val->cc - 1);
		d->table_cc = val->cc;
		d->purity = val->purity_permille;
		d->decision = CCS_DEC_TABLE;
	}
	d->cc = d->table_cc;
	return 0;
}

/*
 * step 3: the service's flow mode over the table's answer: the slot's tree, if it belongs to the
 * slot's table (ccs.h struct ccs_flow), evaluated on the handshake as the transport log records it
 * (start_log), may replace d->cc (flow, table+flow).
 */
static __always_inline void flow_decide(struct bpf_sock_ops *skops, const struct ccs_policy *pol,
					struct ccs_svc_counters *sc, struct decision *d)
{
	struct bpf_sock *sk = skops->sk;
	struct ccs_flow *flow;
	void *tree;
	bool confident;
	__u8 mode = pol->flow_mode, leaf_cc = 0;
	__u16 leaf_conf = 0;

	if (mode == CCS_FLOW_OFF || mode > CCS_FLOW__MAX || !sk)
		return;
	flow = bpf_map_lookup_elem(&ccs_flow, &d->slot);
	tree = bpf_map_lookup_elem(&ccs_trees, &d->slot);
	if (!flow || !tree || !flow->n_nodes || flow->version != d->meta->version ||
	    flow->loaded_unix != d->meta->loaded_unix)
		return;
	confident = d->table_cc && d->purity >= flow->min_purity_permille;
	if (mode == CCS_FLOW_FILL && confident)
		return;
	d->tp = bpf_skc_to_tcp_sock(sk);
	fcnt(sc, CCS_FCNT_TREE_EVALS);
	if (!d->tp || tree_leaf(tree, CTX_U32(skops, mss_cache), d->tp->snd_wnd,
				CTX_U32(skops, srtt_us) >> 3, &leaf_cc, &leaf_conf)) {
		fcnt(sc, CCS_FCNT_TREE_NO_LEAF);
	} else if (mode == CCS_FLOW_FLOW || !confident ||
		   (mode == CCS_FLOW_PRIOR && leaf_conf >= flow->min_leaf_permille)) {
		d->cc = leaf_cc;
		d->decision = CCS_DEC_FLOW;
	} else if (mode == CCS_FLOW_COMBINE && leaf_cc != d->table_cc && leaf_conf > d->purity) {
		d->cc = leaf_cc;
		d->decision = CCS_DEC_TABLE_FLOW;
	}
}

/*
 * step 4: set d->cc on the socket (a failure: fallback), then, for a table decision of a service
 * with caps, the entry's pacing rate and cwnd clamp.
 */
static __always_inline void apply_cc(struct bpf_sock_ops *skops, const struct ccs_policy *pol,
				     struct ccs_svc_counters *sc, struct decision *d)
{
	struct ccs_lpm_val *val = d->val;
	int err;

	err = set_cc(skops, cc_routes || !default_cc_id || d->cc == default_cc_id, d->cc);
	if (err == 0 && cc_routes)
		cnt(sc, CCS_CNT_CC_PRESET);
	if (err < 0) {
		cnt(sc, CCS_CNT_SETSOCKOPT_ERR);
		d->decision = CCS_DEC_FALLBACK;
		return;
	}
	if (d->decision != CCS_DEC_TABLE || !pol->caps || !val)
		return;
	if (val->pacing_rate_bps) {
		__u64 bytes = val->pacing_rate_bps / 8;
		int rate = bytes >= 0xfffffffeULL ? (int)0xfffffffe : (int)bytes;

		if (!rate)
			rate = 1;
		if (bpf_setsockopt(skops, SOL_SOCKET, SO_MAX_PACING_RATE, &rate, sizeof(rate)))
			cnt(sc, CCS_CNT_CAPS_ERR);
		else
			cnt(sc, CCS_CNT_PACING_SET);
	}
	if (val->cwnd_clamp_segs) {
		int clamp = (int)val->cwnd_clamp_segs;

		if (bpf_setsockopt(skops, SOL_TCP, TCP_BPF_SNDCWND_CLAMP, &clamp, sizeof(clamp)))
			cnt(sc, CCS_CNT_CAPS_ERR);
		else
			cnt(sc, CCS_CNT_CLAMP_SET);
	}
}

/*
 * step 5, whatever was decided: with route CCs, the default put back where the program decided it
 * (a table decision has set its CC); the decision's source counted for a looked-up connection; the
 * sampled connection's log record started.
 */
static __always_inline void finish_decision(struct bpf_sock_ops *skops, const struct ccs_policy *pol,
					    struct ccs_svc_counters *sc, struct decision *d)
{
	__u8 decision = d->decision;

	if (cc_routes && !d->cc)
		route_default(skops, sc);
	if (d->looked_up)
		fcnt(sc, decision == CCS_DEC_TABLE ? CCS_FCNT_SRC_TABLE :
		     decision == CCS_DEC_FLOW ? CCS_FCNT_SRC_FLOW :
		     decision == CCS_DEC_TABLE_FLOW ? CCS_FCNT_SRC_TABLE_FLOW :
		     decision == CCS_DEC_FALLBACK ? CCS_FCNT_SRC_FALLBACK : CCS_FCNT_SRC_DEFAULT);
	if (sample_thresh && (__u64)bpf_get_prandom_u32() < sample_thresh)
		start_log(skops, skops->sk, d->tp, &d->key, d->family, decision, d->version,
			  d->has_table, sc, pol->service_id);
}

/*
 * A connection accepted: the policy of its port (unserved: counted, the default kept), then the
 * steps above: the client's key, the table's answer, the flow tree's, the CC set, the counts and
 * the log.
 */
static __always_inline int on_established(struct bpf_sock_ops *skops)
{
	struct decision d = { .decision = CCS_DEC_DEFAULT };
	struct ccs_svc_counters *sc;
	struct ccs_policy *pol;
	__u32 port = skops->local_port;

	pol = bpf_map_lookup_elem(&ccs_policy, &port);
	if (!pol || !pol->served) {
		sc = svc_counters(0);
		cnt(sc, CCS_CNT_NOT_SERVED);
		if (cc_routes)
			route_default(skops, sc);
		return 1;
	}
	/* the service's counters, found once: every count below goes to its slot too */
	sc = svc_counters(pol->service_id);
	if (!sc)	/* never: an array's key below max_entries */
		return 1;
	cnt(sc, CCS_CNT_ESTABLISHED);
	if (client_key(skops, &d))
		return 1;
	if (table_decide(skops, pol, sc, &d) == 0) {
		flow_decide(skops, pol, sc, &d);
		if (d.cc) /* else default or fallback: the socket keeps the default CC */
			apply_cc(skops, pol, sc, &d);
	}
	finish_decision(skops, pol, sc, &d);
	return 1;
}

static __always_inline void on_rtt(struct bpf_sock_ops *skops)
{
	struct bpf_sock *sk = skops->sk;
	struct ccs_conn *c;

	if (!sk)
		return;
	c = bpf_sk_storage_get(&ccs_conns, sk, 0, 0);
	if (!c)
		return;
	update_stats(c, skops, bpf_skc_to_tcp_sock(sk));
}

static __always_inline void on_close(struct bpf_sock_ops *skops)
{
	struct ccs_svc_counters *sc;
	struct bpf_sock *sk = skops->sk;
	struct tcp_sock *tp;
	struct ccs_conn *c;

	if (!sk)
		return;
	c = bpf_sk_storage_get(&ccs_conns, sk, 0, 0);
	if (!c)
		return;
	tp = bpf_skc_to_tcp_sock(sk);
	update_stats(c, skops, tp);
	c->end_boot_ns = bpf_ktime_get_boot_ns();
	c->bytes_acked = skops->bytes_acked;
	c->data_segs_out = CTX_U32(skops, data_segs_out);
	c->total_retrans = CTX_U32(skops, total_retrans);
	c->min_rtt_us = CTX_U32(skops, rtt_min);
	if (c->min_rtt_us == 0xffffffff) /* no RTT sample ever: minmax still at its initial ~0 */
		c->min_rtt_us = c->min_srtt_us;
	*(__u64 *)&c->cc[0] = 0;
	*(__u64 *)&c->cc[8] = 0;
	if (tp) {
		const struct tcp_congestion_ops *ops = tp->inet_conn.icsk_ca_ops;

		if (ops) { /* TCP_CA_NAME_MAX is 16 and names are NUL-terminated: direct loads */
			*(__u64 *)&c->cc[0] = *(__u64 *)&ops->name[0];
			*(__u64 *)&c->cc[8] = *(__u64 *)&ops->name[8];
		}
	}
	if (c->min_snd_wnd_bytes == 0xffffffff)
		c->min_snd_wnd_bytes = 0;
	if (c->min_rtt_var_us == 0xffffffff)
		c->min_rtt_var_us = 0;
	/* no wake-up per record: the agent drains in batches; wake it when the ring fills up */
	sc = svc_counters(c->service_id);
	if (bpf_ringbuf_output(&ccs_events, c, sizeof(*c),
			       bpf_ringbuf_query(&ccs_events, BPF_RB_AVAIL_DATA) > RB_WAKE_BYTES ?
			       BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP))
		cnt(sc, CCS_CNT_LOG_DROPPED);
	else
		cnt(sc, CCS_CNT_LOG_EMITTED);
	/* the storage goes with the socket */
	bpf_sock_ops_cb_flags_set(skops, 0);
}

/* whether the socket belongs to the cgroup mark_cgroup_id or one below it (at most 32 levels) */
static __always_inline bool in_mark_cgroup(struct sock *sk)
{
	struct cgroup *cg = sk->sk_cgrp_data.cgroup;
	int i;

	for (i = 0; i < 32 && cg; i++) {
		struct cgroup_subsys_state *parent;

		if (cg->kn && cg->kn->id == mark_cgroup_id)
			return true;
		parent = cg->self.parent;
		cg = parent ? parent->cgroup : NULL;
	}
	return false;
}

/*
 * Route CCs: the listeners of the cgroup that were already listening when the program attached
 * (TCP_LISTEN_CB never comes for them), marked by the rule of mark_listener. The agent runs this
 * iterator once over its network namespace's TCP sockets after each attach with route CCs on
 * (attach.c mark_existing); it writes each listener it marked (its port) to the iterator's output,
 * and counts setsockopt_err for one it could not. bpf_setsockopt is open to iter/tcp programs,
 * with the socket locked by the iterator (net/ipv4/tcp_ipv4.c bpf_iter_tcp_seq_show).
 */
SEC("iter/tcp")
int ccs_mark_listeners(struct bpf_iter__tcp *ctx)
{
	struct sock_common *skc = ctx->sk_common;
	int mark = (int)route_mark;
	struct tcp_sock *tp;
	struct sock *sk;
	__u16 port;

	if (!skc || !route_mark)
		return 0;
	tp = bpf_skc_to_tcp_sock(skc);
	if (!tp)
		return 0;
	sk = &tp->inet_conn.icsk_inet.sk;
	if (sk->__sk_common.skc_state != TCP_LISTEN || sk->sk_mark || ca_chosen(tp) ||
	    !in_mark_cgroup(sk))
		return 0;
	if (bpf_setsockopt(tp, SOL_SOCKET, SO_MARK, &mark, sizeof(mark))) {
		cnt0(CCS_CNT_SETSOCKOPT_ERR);
		return 0;
	}
	port = sk->__sk_common.skc_num;
	bpf_seq_write(ctx->meta->seq, &port, sizeof(port));
	return 0;
}

SEC("sockops")
int ccs_sockops(struct bpf_sock_ops *skops)
{
	switch (skops->op) {
	case BPF_SOCK_OPS_PASSIVE_ESTABLISHED_CB:
		return on_established(skops);
	case BPF_SOCK_OPS_TCP_LISTEN_CB:
		mark_listener(skops);
		break;
	case BPF_SOCK_OPS_RTT_CB:
		on_rtt(skops);
		break;
	case BPF_SOCK_OPS_STATE_CB:
		if (skops->args[1] == BPF_TCP_CLOSE)
			on_close(skops);
		break;
	}
	return 1;
}
