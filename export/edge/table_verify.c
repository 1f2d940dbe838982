// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * table_verify.c - a load's first step: the table the manifest names, verified before anything
 * else happens: the manifest's signature and fields (manifest.c), the sha256 of the .bin, its
 * header against the manifest, the expiry, every entry (the address space rule included) and
 * the flow tree (check_tree: the refusals of table_format.validate_tree, in its words); and the
 * config's caps on entries, tree nodes and bytes (check_caps, issue 58).
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <openssl/evp.h>

#include "table.h"

/* an IPv6 prefix inside ::ffff:0:0/96 (IPv4-mapped space): an IPv4 prefix in disguise */
static bool in_v4_mapped_space(const struct ccs_table_entry *e)
{
	static const __u8 mapped[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	return e->family == 6 && e->prefix_len >= 96 && !memcmp(e->addr, mapped, sizeof(mapped));
}

static int validate_entry(const struct ccs_table_entry *e, __u8 want_family, size_t i)
{
	int bytes = want_family == 4 ? 4 : 16, b;

	if (e->family != want_family) {
		print_error("refused: entry %zu: family %u where %u expected", i, e->family, want_family);
		return -1;
	}
	if (e->prefix_len > bytes * 8) {
		print_error("refused: entry %zu: prefix length %u too long", i, e->prefix_len);
		return -1;
	}
	if (e->cc > CCS_CC_MAX) {
		print_error("refused: entry %zu: unknown cc id %u", i, e->cc);
		return -1;
	}
	for (b = 0; b < 16; b++) {
		int bit0 = b * 8;
		__u8 mask;

		if (b >= bytes) {
			mask = 0xff;
		} else if (bit0 >= e->prefix_len) {
			mask = 0xff;
		} else if (bit0 + 8 <= e->prefix_len) {
			mask = 0;
		} else {
			mask = 0xff >> (e->prefix_len - bit0);
		}
		if (e->addr[b] & mask) {
			print_error("refused: entry %zu: address bits set beyond the prefix", i);
			return -1;
		}
	}
	if (in_v4_mapped_space(e)) {
		print_error("refused: entry %zu: IPv6 prefix ::ffff:%u.%u.%u.%u/%u lies inside "
			"::ffff:0:0/96 (IPv4-mapped addresses are IPv4 clients: write an IPv4 entry)",
			i, e->addr[12], e->addr[13], e->addr[14], e->addr[15], e->prefix_len);
		return -1;
	}
	return 0;
}

/*
 * The caps of the config (issue 58: export.guards, as the deployment wrote them) on what the
 * signed manifest says the table holds, before its .bin is read: entries, flow-tree nodes. The
 * same refusals, in the same order, as guards.check_size.
 */
static int check_caps(const struct config *cfg, const struct manifest *m)
{
	__u64 n = m->n_v4 + m->n_v6;

	if (n > cfg->max_entries) {
		print_error("refused: table %llu: %llu entries, over the cap of %llu (max_entries)",
			(unsigned long long)m->version, (unsigned long long)n,
			(unsigned long long)cfg->max_entries);
		return -1;
	}
	if (m->tree_nodes >= cfg->max_tree_nodes) {
		print_error("refused: table %llu: a flow tree of %llu nodes reached the cap of %u "
			"(max_tree_nodes): its generator ran into its limit",
			(unsigned long long)m->version, (unsigned long long)m->tree_nodes,
			cfg->max_tree_nodes);
		return -1;
	}
	return 0;
}

/* the .bin named by the manifest (beside it), its size within the cap, and its sha256 against
 * the manifest's */
static int read_table_bin(const struct config *cfg, const char *manifest_path, struct table *t)
{
	char tab_path[PATH_MAX], sha_hex[65];
	const char *slash = strrchr(manifest_path, '/');
	int dir_len = slash ? (int)(slash - manifest_path + 1) : 0;
	unsigned int dlen = 0;
	struct stat sb;

	snprintf(tab_path, sizeof(tab_path), "%.*s%s", dir_len, manifest_path, t->man.table);
	if (stat(tab_path, &sb) == 0 && S_ISREG(sb.st_mode) &&
	    (__u64)sb.st_size > cfg->max_artifact_bytes) {
		print_error("refused: table %llu: %llu bytes, over the cap of %llu (max_artifact_bytes)",
			(unsigned long long)t->man.version, (unsigned long long)sb.st_size,
			(unsigned long long)cfg->max_artifact_bytes);
		return -1;
	}
	if (read_file(tab_path, &t->bin, &t->len)) {
		print_error("refused: read %s: %s", tab_path, strerror(errno));
		return -1;
	}
	if ((__u64)t->len > cfg->max_artifact_bytes) {   /* it grew between the stat and the read */
		print_error("refused: table %llu: %zu bytes, over the cap of %llu (max_artifact_bytes)",
			(unsigned long long)t->man.version, t->len,
			(unsigned long long)cfg->max_artifact_bytes);
		return -1;
	}
	if (EVP_Digest(t->bin, t->len, t->sha256, &dlen, EVP_sha256(), NULL) != 1 || dlen != 32)
		return -1;
	hex(t->sha256, 32, sha_hex);
	if (strcmp(sha_hex, t->man.sha256)) {
		print_error("refused: sha256 of %s is %s, manifest says %s", tab_path, sha_hex,
			t->man.sha256);
		return -1;
	}
	return 0;
}

/*
 * The flow tree: a tree the program's bounded walk can take (ccs_table.h). The same checks, in
 * the same order and words, as table_format.validate_tree.
 */
static int check_tree(const struct ccs_tree_node *nodes, size_t n, __u16 min_purity, __u16 min_leaf)
{
	unsigned char parents[CCS_TREE_MAX_NODES] = {}, depth[CCS_TREE_MAX_NODES] = {};
	size_t i, k;

	if (n < 1 || n > CCS_TREE_MAX_NODES) {
		print_error("refused: tree: %zu nodes (1..%d)", n, CCS_TREE_MAX_NODES);
		return -1;
	}
	if (min_purity > 1000) {
		print_error("refused: tree: min_purity_permille %u out of 0..1000", min_purity);
		return -1;
	}
	if (min_leaf > 1000) {
		print_error("refused: tree: min_leaf_permille %u out of 0..1000", min_leaf);
		return -1;
	}
	for (i = 0; i < n; i++) {
		const struct ccs_tree_node *nd = &nodes[i];
		__u16 child[2] = { nd->left, nd->right };

		if (nd->reserved) {
			print_error("refused: tree node %zu: nonzero reserved bytes", i);
			return -1;
		}
		if (nd->feature == CCS_TREE_LEAF) {
			if (nd->cc < 1 || nd->cc > CCS_CC_MAX) {
				print_error("refused: tree node %zu: leaf with unknown cc id %u", i, nd->cc);
				return -1;
			}
			if (nd->conf_permille > 1000) {
				print_error("refused: tree node %zu: leaf confidence %u out of 0..1000", i,
					nd->conf_permille);
				return -1;
			}
			if (nd->left || nd->right || nd->threshold) {
				print_error("refused: tree node %zu: leaf with children or a threshold", i);
				return -1;
			}
			continue;
		}
		if (nd->feature >= CCS_FEAT__MAX) {
			print_error("refused: tree node %zu: bad feature id %u", i, nd->feature);
			return -1;
		}
		if (nd->cc || nd->conf_permille) {
			print_error("refused: tree node %zu: split with a cc", i);
			return -1;
		}
		for (k = 0; k < 2; k++) {
			if (child[k] >= n) {
				print_error("refused: tree node %zu: child %u out of range (0..%zu)", i, child[k],
					n - 1);
				return -1;
			}
			if (child[k] <= i) {
				print_error("refused: tree node %zu: child %u not after its parent (a cycle)", i,
					child[k]);
				return -1;
			}
			parents[child[k]]++;
			depth[child[k]] = depth[i] + 1;
			if (depth[child[k]] > CCS_TREE_MAX_DEPTH) {
				print_error("refused: tree node %u: depth %u over the bound %d", child[k],
					depth[child[k]], CCS_TREE_MAX_DEPTH);
				return -1;
			}
		}
	}
	for (i = 1; i < n; i++)
		if (parents[i] != 1) {
			print_error("refused: tree node %zu: %u parents (a tree has exactly one)", i, parents[i]);
			return -1;
		}
	return 0;
}

/* the header against the manifest, the expiry, every entry, the tree */
static int check_table(struct table *t, time_t now)
{
	const struct ccs_table_header *h = (const struct ccs_table_header *)t->bin;
	const struct manifest *m = &t->man;
	size_t i;

	if (t->len < sizeof(*h)) {
		print_error("refused: short table");
		return -1;
	}
	t->h = h;
	t->ents = (const struct ccs_table_entry *)(t->bin + sizeof(*h));
	t->n = (size_t)h->n_v4 + h->n_v6;
	t->n_nodes = h->tree_nodes;
	if (h->magic == CCS_TABLE_MAGIC && h->format != CCS_TABLE_FORMAT) {
		print_error("refused: unsupported table format %u: this agent reads format %d (tables with "
			"the flow tree) only", h->format, CCS_TABLE_FORMAT);
		return -1;
	}
	if (h->magic != CCS_TABLE_MAGIC || h->header_size != sizeof(*h) ||
	    h->entry_size != sizeof(*t->ents) ||
	    h->tree_node_size != (t->n_nodes ? sizeof(struct ccs_tree_node) : 0) ||
	    t->len != sizeof(*h) + t->n * sizeof(*t->ents) + t->n_nodes * sizeof(*t->nodes) ||
	    t->n > CCS_MAX_ENTRIES) {
		print_error("refused: bad table header or size");
		return -1;
	}
	t->nodes = t->n_nodes ? (const struct ccs_tree_node *)(t->ents + t->n) : NULL;
	if (h->version != m->version || h->expires_unix != m->expires ||
	    h->created_unix != m->created || h->n_v4 != m->n_v4 || h->n_v6 != m->n_v6 ||
	    h->tree_nodes != m->tree_nodes) {
		print_error("refused: table header disagrees with the manifest");
		return -1;
	}
	if (m->expires <= (__u64)now) {
		print_error("refused: table %llu expired at %llu (now %lld)",
			(unsigned long long)m->version, (unsigned long long)m->expires, (long long)now);
		return -1;
	}
	for (i = 0; i < t->n; i++)
		if (validate_entry(&t->ents[i], i < h->n_v4 ? 4 : 6, i))
			return -1;
	if (t->n_nodes)
		return check_tree(t->nodes, t->n_nodes, h->tree_min_purity_permille, h->tree_min_leaf_permille);
	if (h->tree_min_purity_permille || h->tree_min_leaf_permille || m->tree_model[0]) {
		print_error("refused: a tree's min purity, min leaf confidence or model without a tree");
		return -1;
	}
	return 0;
}

int table_read(const struct config *cfg, const char *manifest_path, struct table *t, time_t now)
{
	/* 1. signature over the exact manifest bytes, then its fields, then the config's caps on
	 * them; 2. the .bin's size cap and sha256; 3. header against the manifest, expiry, every
	 * entry */
	if (manifest_read(cfg->public_key, manifest_path, &t->man) || check_caps(cfg, &t->man) ||
	    read_table_bin(cfg, manifest_path, t) || check_table(t, now))
		return -1;
	return 0;
}

