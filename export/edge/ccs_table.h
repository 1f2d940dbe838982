/* SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause) */
/*
 * ccs_table.h - THE ccselect prefix-table format, shared by the C side (the ccs-edge agent)
 * and the Python side (export/artifact/table_format.py mirrors every struct here; a test
 * compiles a tiny C program and checks sizeof/offsetof against the Python struct formats).
 *
 * An exported table is three files in one directory:
 *
 *   table-<version>.bin              the binary table described below
 *   table-<version>.manifest.json    JSON manifest (UTF-8, one object):
 *        {"format": 2, "version": <u64>, "model_version": "<str>",
 *         "created": <unix s>, "expires": <unix s>,
 *         "entries": {"v4": <n>, "v6": <n>},
 *         "table": "table-<version>.bin",   (file name, relative to the manifest)
 *         "sha256": "<64 lowercase hex of the .bin file>",
 *         "tree": {"model": "<str>", "nodes": <n>}}   (the flow tree: its model, at most 63
 *                                                      bytes, "" without a tree; its node count)
 *   table-<version>.manifest.json.sig  detached Ed25519 signature: exactly 64 raw bytes, over
 *        the exact bytes of the manifest file (no canonicalisation: what was signed is what is
 *        read). The public key is an Ed25519 SubjectPublicKeyInfo PEM file.
 *
 * The manifest is read with a JSON parser (the agent: cJSON, see manifest.c): the fields above
 * are required, <u64>/<unix s>/<n> are JSON integers (not 5.0 or 5e0), model_version (at most
 * 63 bytes), table and sha256 are strings, and no key may repeat in any object. Other keys
 * (export details) are allowed and ignored.
 *
 * Verification order (agent): signature over the manifest bytes, then the manifest's sha256 over
 * the .bin bytes, then the binary header against the manifest (version, expiry, counts, tree
 * nodes), then every entry, then the tree. Nothing reaches the kernel before all of it passed.
 *
 * Format 2 (issue 27) adds the flow tree; format 1 tables are refused by this agent and format 2
 * tables by a format 1 agent ("unsupported format"), so neither side half-reads the other and
 * the live table stays.
 *
 * Binary table: little-endian, packed, no padding.
 *   struct ccs_table_header   (64 bytes)
 *   struct ccs_table_entry    x (n_v4 + n_v6)   (40 bytes each; all IPv4 entries first, then IPv6)
 *   struct ccs_tree_node      x tree_nodes      (16 bytes each; none when the table has no tree)
 *
 * The flow tree: node 0 is the root. An internal node (feature = CCS_FEAT_*) sends a flow whose
 * feature value v (u32, what the program reads at PASSIVE_ESTABLISHED) with v <= threshold to
 * node `left`, else to `right`; a leaf (feature = CCS_TREE_LEAF) names a CC (1..CCS_CC_MAX) and
 * its confidence in permille. Refused at load (table_format.validate_tree, table.c check_tree):
 * a child index out of range, a child not after its parent (so no cycle), a node with other than
 * one parent, depth over CCS_TREE_MAX_DEPTH, a bad feature id, a leaf with an unknown CC, a leaf
 * with children, a split with a CC. An entry's purity_permille below tree_min_purity_permille
 * makes it "mixed" for the service's flow mode (export/edge/README.md).
 *
 * Addresses are in network byte order. An IPv4 entry keeps its 4 address bytes in addr[0..3]
 * and zeros in addr[4..15]. Bits beyond prefix_len must be zero.
 *
 * In the kernel both families share ONE lookup index (ccs.h: a hash searched by
 * prefix length) with 16-byte keys: an IPv4 prefix a.b.c.d/n is
 * stored as the IPv4-mapped IPv6 prefix ::ffff:a.b.c.d/(96+n), so a v4 client seen on a
 * dual-stack (AF_INET6) listener matches the same entries, and one map swap replaces both
 * families at once.
 *
 * Address space rule (one for both families): an IPv4 client (also an IPv4-mapped IPv6 peer) is
 * decided only by IPv4 entries, an IPv6 client only by IPv6 entries. Hence an IPv6 entry may not
 * lie inside ::ffff:0:0/96 (it would be an IPv4 prefix in disguise): such a table is refused by
 * table_format/signing.write_table and by the agent at load. An IPv6 entry that covers
 * ::ffff:0:0/96 (::/0, ::/8, ...) is allowed and applies to IPv6 clients only; an IPv4 client
 * that no IPv4 entry matches is a miss, whatever IPv6 entry covers the mapped space
 * (table_format.lookup and the kernel agree).
 *
 * A/B bucket (ALICCS section 5.3): crc = CRC-32/IEEE (zlib.crc32) over the client address bytes
 * in network order: the 4 bytes for IPv4 (also for an IPv4-mapped IPv6 peer), the 16 bytes for
 * IPv6. Even crc -> control (default CC), odd crc -> treatment (the table).
 */
#ifndef CCS_TABLE_H
#define CCS_TABLE_H

#ifdef __BPF__
/* types come from vmlinux.h */
#else
#include <linux/types.h>
#endif

#define CCS_TABLE_MAGIC 0x31534343u /* bytes "CCS1" read as a little-endian u32 */
#define CCS_TABLE_FORMAT 2

/* the flow tree (format 2): the handshake features, in contract.HANDSHAKE_FEATURES order */
enum ccs_feature {
	CCS_FEAT_MSS = 0,          /* mss_bytes: tcp_sock.mss_cache */
	CCS_FEAT_INIT_SND_WND = 1, /* init_snd_wnd_bytes: tcp_sock.snd_wnd (the handshake's last ACK) */
	CCS_FEAT_CONN_TIME = 2,    /* connection_time_us: srtt_us >> 3, the SYN-ACK -> ACK sample */
	CCS_FEAT__MAX = 3,
};
#define CCS_TREE_LEAF 0xff
#define CCS_TREE_MAX_DEPTH 8    /* leaves at depth <= 8 (root: 0): the program's loop bound */
#define CCS_TREE_MAX_NODES 511  /* a full tree of that depth */

/* CC ids (entry.cc); 0 means "keep the default CC" */
enum ccs_cc_id {
	CCS_CC_KEEP = 0,
	CCS_CC_CUBIC = 1,
	CCS_CC_BBR = 2,
	CCS_CC_RENO = 3,
	CCS_CC_MAX = 3,
};

/* entry.flags */
#define CCS_ENTRY_LOW_CONF 0x01 /* low confidence: the prefix keeps the default CC (decision fallback) */

struct ccs_table_header {
	__u32 magic;          /*  0: CCS_TABLE_MAGIC */
	__u16 format;         /*  4: CCS_TABLE_FORMAT */
	__u16 header_size;    /*  6: sizeof(struct ccs_table_header) = 64 */
	__u16 entry_size;     /*  8: sizeof(struct ccs_table_entry) = 40 */
	__u16 reserved0;      /* 10: 0 */
	__u32 flags;          /* 12: 0 (reserved) */
	__u64 version;        /* 16: table version, as in the manifest */
	__u64 created_unix;   /* 24: creation time, unix seconds */
	__u64 expires_unix;   /* 32: expiry, unix seconds: past it the table is not enforced */
	__u32 n_v4;           /* 40: number of IPv4 entries (they come first) */
	__u32 n_v6;           /* 44: number of IPv6 entries */
	__u16 tree_nodes;     /* 48: flow tree nodes after the entries, 0 = no tree */
	__u16 tree_node_size; /* 50: sizeof(struct ccs_tree_node) = 16, 0 without a tree */
	__u16 tree_min_purity_permille; /* 52: entries below it are mixed (0 without a tree) */
	__u16 tree_min_leaf_permille; /* 54: flow mode prior: a leaf below it is unsure, a confident
				       * entry decides there instead (0 without a tree) */
	__u8 reserved[8];     /* 56: zeros */
} __attribute__((packed)); /* 64 bytes */

struct ccs_table_entry {
	__u8 family;             /*  0: 4 or 6 */
	__u8 prefix_len;         /*  1: 0..32 (v4), 0..128 (v6) */
	__u8 cc;                 /*  2: enum ccs_cc_id */
	__u8 flags;              /*  3: CCS_ENTRY_* */
	__u16 purity_permille;   /*  4: share of the prefix's requests agreeing with cc, 0..1000 */
	__u16 reserved;          /*  6: 0 */
	__u32 requests;          /*  8: request count behind the entry (informational) */
	__u32 cwnd_clamp_segs;   /* 12: AutoPlex cwnd clamp in segments, 0 = none */
	__u8 addr[16];           /* 16: network byte order; v4 in addr[0..3] */
	__u64 pacing_rate_bps;   /* 32: AutoPlex max pacing rate, bits per second, 0 = none */
} __attribute__((packed)); /* 40 bytes */

struct ccs_tree_node {
	__u8 feature;            /*  0: enum ccs_feature, or CCS_TREE_LEAF */
	__u8 cc;                 /*  1: leaf: enum ccs_cc_id (1..CCS_CC_MAX); split: 0 */
	__u16 conf_permille;     /*  2: leaf: the leaf's confidence in its CC; split: 0 */
	__u16 left;              /*  4: split: node index when value <= threshold; leaf: 0 */
	__u16 right;             /*  6: split: node index otherwise; leaf: 0 */
	__u32 threshold;         /*  8: split: compared unsigned; leaf: 0 */
	__u32 reserved;          /* 12: 0 */
} __attribute__((packed, aligned(4))); /* 16 bytes; aligned: the program loads fields whole */

#endif /* CCS_TABLE_H */
