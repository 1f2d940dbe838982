// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * table.c - load and rollback. load: the manifest (manifest.c), then the sha256 of the .bin,
 * its header against the manifest, the expiry and every entry (address space rule included);
 * then the version rule (ccs_version); only then a new index (ccs.h: the lookup hash) is built, and the idle slot is
 * changed in an order a crash cannot make inconsistent: its meta marked invalid, the index
 * installed, the meta written (valid but staged, with the index's map id), then ccs_ctl.live
 * flipped (one word), then the meta marked made live. The previous table stays in the other
 * slot: rollback flips back to it, if that slot is valid, was made live (not a load killed before
 * its flip) and its index is the one its meta describes.
 *
 * The flow tree (format 2, issue 27) travels the same way: checked with the entries (check_tree:
 * the refusals of table_format.validate_tree, in its words), built into a fresh node array, and
 * installed in ccs_trees[slot] (or the slot's old one removed) with its ccs_flow record while the
 * slot is marked invalid; the flip makes table and tree live together, and a rollback to a table
 * without a tree stops the tree's decisions with that same one-word flip.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <openssl/evp.h>

#include "agent.h"

/* a verified table: the manifest's fields and the .bin they describe */
struct table {
	struct manifest man;
	unsigned char *bin;
	size_t len;
	unsigned char sha256[32];
	const struct ccs_table_header *h;
	const struct ccs_table_entry *ents;
	size_t n;
	const struct ccs_tree_node *nodes;  /* the flow tree, NULL if none */
	size_t n_nodes;
};

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

/* the .bin named by the manifest (beside it) and its sha256 against the manifest's */
static int read_table_bin(const char *manifest_path, struct table *t)
{
	char tab_path[PATH_MAX], sha_hex[65];
	const char *slash = strrchr(manifest_path, '/');
	int dir_len = slash ? (int)(slash - manifest_path + 1) : 0;
	unsigned int dlen = 0;

	snprintf(tab_path, sizeof(tab_path), "%.*s%s", dir_len, manifest_path, t->man.table);
	if (read_file(tab_path, &t->bin, &t->len)) {
		print_error("refused: read %s: %s", tab_path, strerror(errno));
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

/* a new map holding the table's flow tree (ccs.h struct ccs_tree, one value): its fd, or -1 */
static int build_tree(const struct table *t)
{
	struct ccs_tree *tree = calloc(1, sizeof(*tree));
	__u32 zero = 0;
	int fd = -1;

	if (!tree) {
		print_error("tree: out of memory");
		return -1;
	}
	memcpy(tree->nodes, t->nodes, t->n_nodes * sizeof(*t->nodes));
	fd = bpf_map_create(BPF_MAP_TYPE_ARRAY, "ccs_tree", sizeof(__u32), sizeof(*tree), 1, NULL);
	if (fd < 0) {
		print_error("create tree: %s", strerror(errno));
	} else if (bpf_map_update_elem(fd, &zero, tree, BPF_ANY)) {
		print_error("write tree: %s", strerror(errno));
		close(fd);
		fd = -1;
	}
	free(tree);
	return fd;
}

/* one key of the lookup hash while it is built: an entry, a marker, or both (ccs.h) */
struct rec {
	struct ccs_lpm_key k;
	struct ccs_lpm_val v;  /* the entry's, or (a marker) its best match's, when CCS_VAL_ENTRY */
	size_t entry;          /* the table entry's index when it is one (duplicates name it) */
};

static int key_cmp(const struct ccs_lpm_key *a, const struct ccs_lpm_key *b)
{
	if (a->prefixlen != b->prefixlen)
		return a->prefixlen < b->prefixlen ? -1 : 1;
	return memcmp(a->addr, b->addr, 16);
}

static int rec_cmp(const void *a, const void *b)
{
	const struct rec *x = a, *y = b;
	int c = key_cmp(&x->k, &y->k);

	if (c)
		return c;
	/* entries before markers of the same key, then table order */
	if ((x->v.flags & CCS_VAL_ENTRY) != (y->v.flags & CCS_VAL_ENTRY))
		return (x->v.flags & CCS_VAL_ENTRY) ? -1 : 1;
	return x->entry < y->entry ? -1 : x->entry > y->entry;
}

/* the key cut to plen bits (the bits past it zero) */
static void cut(struct ccs_lpm_key *k, const __u8 *addr, unsigned plen)
{
	unsigned i;

	k->prefixlen = plen;
	memset(k->addr, 0, 16);
	for (i = 0; i < 16 && i * 8 < plen; i++)
		k->addr[i] = plen >= (i + 1) * 8 ? addr[i] : addr[i] & (__u8)(0xff << (8 - (plen - i * 8)));
}

/* the distinct key lengths of one family (ascending) in lens: their count */
static unsigned family_lengths(const struct ccs_lpm_key *keys, const struct table *t, __u8 family,
			       __u8 *lens)
{
	bool seen[129] = {};
	unsigned n = 0, p;
	size_t i;

	for (i = 0; i < t->n; i++)
		if (t->ents[i].family == family)
			seen[keys[i].prefixlen] = true;
	for (p = 0; p <= 128; p++)
		if (seen[p])
			lens[n++] = (__u8)p;
	return n;
}

/*
 * The records of one family: each entry, and a marker on every length where the binary search
 * towards the entry's length turns longer (ccs.h). Appended to out; out NULL: only counted.
 */
static size_t family_records(const struct ccs_lpm_key *keys, const struct ccs_lpm_val *vals,
			     const struct table *t, __u8 family, const __u8 *lens, unsigned nl,
			     struct rec *out)
{
	size_t i, m = 0;

	for (i = 0; i < t->n; i++) {
		int lo = 0, hi = (int)nl - 1, mid;

		if (t->ents[i].family != family)
			continue;
		while (lo <= hi) {
			mid = (lo + hi) / 2;
			if (lens[mid] == keys[i].prefixlen) {
				if (out) {
					out[m].k = keys[i];
					out[m].v = vals[i];
					out[m].entry = i;
				}
				m++;
				break;
			}
			if (lens[mid] < keys[i].prefixlen) {
				if (out) {
					cut(&out[m].k, keys[i].addr, lens[mid]);
					memset(&out[m].v, 0, sizeof(out[m].v));
					out[m].v.flags = CCS_VAL_LONGER;
					out[m].entry = (size_t)-1;
				}
				m++;
				lo = mid + 1;
			} else {
				hi = mid - 1;
			}
		}
	}
	return m;
}

/* the entry (a record with CCS_VAL_ENTRY of its own) with key k among the merged records */
static const struct rec *find_entry(const struct rec *r, size_t n, const struct ccs_lpm_key *k)
{
	size_t lo = 0, hi = n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = key_cmp(&r[mid].k, k);

		if (!c)
			return r[mid].entry != (size_t)-1 ? &r[mid] : NULL;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

/*
 * A new lookup hash holding the table (nothing is live yet): its fd, or -1. meta gets the
 * families' lengths (n_len4, n_len6, lens).
 */
static int build_index(const struct table *t, struct ccs_meta *meta)
{
	struct ccs_lpm_key *keys = NULL;
	struct ccs_lpm_val *vals = NULL;
	struct rec *r = NULL;
	size_t i, j, m = 0, u = 0;
	int fd = -1;
	unsigned l;

	keys = calloc(t->n ? t->n : 1, sizeof(*keys));
	vals = calloc(t->n ? t->n : 1, sizeof(*vals));
	if (!keys || !vals) {
		print_error("build the lookup: out of memory");
		goto out;
	}
	for (i = 0; i < t->n; i++) {
		const struct ccs_table_entry *e = &t->ents[i];
		__u8 a[16] = {};

		if (e->family == 4) {
			a[10] = 0xff;
			a[11] = 0xff;
			memcpy(&a[12], e->addr, 4);
			cut(&keys[i], a, 96 + e->prefix_len);
		} else {
			cut(&keys[i], e->addr, e->prefix_len);
		}
		vals[i] = (struct ccs_lpm_val){ .cc = e->cc,
			.flags = (e->flags & CCS_ENTRY_LOW_CONF) | CCS_VAL_ENTRY,
			.purity_permille = e->purity_permille,
			.cwnd_clamp_segs = e->cwnd_clamp_segs,
			.pacing_rate_bps = e->pacing_rate_bps };
	}
	meta->n_len4 = (__u8)family_lengths(keys, t, 4, meta->lens);
	meta->n_len6 = (__u8)family_lengths(keys, t, 6, (meta->lens + CCS_LEN4_MAX));
	/* each entry: itself and at most ceil(log2(129)) = 8 markers; counted first */
	m = family_records(keys, vals, t, 4, meta->lens, meta->n_len4, NULL);
	m += family_records(keys, vals, t, 6, (meta->lens + CCS_LEN4_MAX), meta->n_len6, NULL);
	r = calloc(m ? m : 1, sizeof(*r));
	if (!r) {
		print_error("build the lookup: out of memory (%zu records)", m);
		goto out;
	}
	m = family_records(keys, vals, t, 4, meta->lens, meta->n_len4, r);
	m += family_records(keys, vals, t, 6, (meta->lens + CCS_LEN4_MAX), meta->n_len6, r + m);
	qsort(r, m, sizeof(*r), rec_cmp);
	/* merge each key's records: an entry (the first) takes the markers' LONGER flag */
	for (i = 0; i < m; i = j) {
		r[u] = r[i];
		for (j = i + 1; j < m && !key_cmp(&r[j].k, &r[i].k); j++) {
			if (r[j].entry != (size_t)-1) {
				print_error("refused: entry %zu: duplicate prefix", r[j].entry);
				goto out;
			}
			r[u].v.flags |= r[j].v.flags & CCS_VAL_LONGER;
		}
		u++;
	}
	/* a marker's best match: the longest entry of a shorter length of its family covering it */
	for (i = 0; i < u; i++) {
		const __u8 *lens;
		unsigned nl;
		bool v4;

		if (r[i].entry != (size_t)-1)
			continue;
		v4 = r[i].k.prefixlen >= 96 && !memcmp(r[i].k.addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12);
		lens = v4 ? meta->lens : (meta->lens + CCS_LEN4_MAX);
		nl = v4 ? meta->n_len4 : meta->n_len6;
		for (l = nl; l-- > 0;) {
			struct ccs_lpm_key k;
			const struct rec *e;

			if (lens[l] >= r[i].k.prefixlen)
				continue;
			cut(&k, r[i].k.addr, lens[l]);
			e = find_entry(r, u, &k);
			if (e) {
				r[i].v = e->v;
				r[i].v.flags |= CCS_VAL_LONGER;
				break;
			}
		}
	}
	fd = bpf_map_create(BPF_MAP_TYPE_HASH, "ccs_lookup", sizeof(struct ccs_lpm_key),
			    sizeof(struct ccs_lpm_val), u ? (__u32)u : 1, NULL);
	if (fd < 0) {
		print_error("create the lookup hash: %s", strerror(errno));
		goto out;
	}
	for (i = 0; i < u; i++) {
		if (bpf_map_update_elem(fd, &r[i].k, &r[i].v, BPF_NOEXIST)) {
			print_error("refused: %s %zu: %s", r[i].entry != (size_t)-1 ? "entry" : "marker",
				r[i].entry != (size_t)-1 ? r[i].entry : i, strerror(errno));
			close(fd);
			fd = -1;
			goto out;
		}
	}
out:
	free(keys);
	free(vals);
	free(r);
	return fd;
}

/* the pinned maps a load or rollback reads and writes */
struct slots {
	int ctl_fd;
	int meta_fd;
	int tables_fd;
	int model_fd;    /* -1 while the program attached predates ccs_model: then not recorded */
	int version_fd;  /* -1 while it predates ccs_version: the rule then stands on the slots */
	int trees_fd;    /* ccs_trees and ccs_flow: -1 while it predates the flow tree (a table */
	int flow_fd;     /*   with a tree is then refused; one without loads as before) */
};

/* what the slots hold now */
struct state {
	struct ccs_ctl ctl;
	struct ccs_meta meta[CCS_SLOTS];
	__u32 index_id[CCS_SLOTS];   /* map id of the index in ccs_tables[slot], 0 if none */
	bool ok[CCS_SLOTS];         /* slot_consistent() */
	struct ccs_version ver;
	__u64 floor;                /* the newest version the pinned maps saw made live here */
	struct floor fl;            /* the version rule's floor: the file (floor.c), else seeded from
				     * a pin dir older than it (epoch 0, `floor` above) */
	bool has_floor;             /* a table was made live here before (fl means something) */
};

static void close_slots(struct slots *s)
{
	int *fds[] = { &s->ctl_fd, &s->meta_fd, &s->tables_fd, &s->model_fd, &s->version_fd,
		       &s->trees_fd, &s->flow_fd };
	size_t i;

	for (i = 0; i < sizeof(fds) / sizeof(fds[0]); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

static int open_slots(struct slots *s)
{
	s->ctl_fd = open_pinned("ccs_ctl");
	s->meta_fd = open_pinned("ccs_meta");
	s->tables_fd = open_pinned("ccs_tables");
	s->model_fd = open_pinned("ccs_model");
	s->version_fd = open_pinned("ccs_version");
	s->trees_fd = open_pinned("ccs_trees");
	s->flow_fd = open_pinned("ccs_flow");
	if (s->trees_fd < 0 || s->flow_fd < 0) {
		if (s->trees_fd >= 0)
			close(s->trees_fd);
		if (s->flow_fd >= 0)
			close(s->flow_fd);
		s->trees_fd = s->flow_fd = -1;
	}
	if (s->ctl_fd < 0 || s->meta_fd < 0 || s->tables_fd < 0) {
		print_error("not attached: no pinned maps under %s", cfg.pin_dir);
		close_slots(s);
		return -1;
	}
	return 0;
}

/* the map id of the inner map in ccs_tables[slot] or ccs_trees[slot] (0: none) */
int slot_map_id(int tables_fd, __u32 slot, __u32 *id)
{
	*id = 0;
	if (bpf_map_lookup_elem(tables_fd, &slot, id)) {
		if (errno == ENOENT)
			return 0;
		return -errno;
	}
	return 0;
}

/*
 * A slot is used (rollback, status, the version rule) only when its meta is valid and describes
 * the index that is in it (index_id 0: meta written by an agent before index_id; not checkable).
 */
bool slot_consistent(const struct ccs_meta *m, __u32 index_id)
{
	return m->valid && index_id && (!m->index_id || m->index_id == index_id);
}

static int read_state(const struct slots *s, struct state *st)
{
	__u32 zero = 0, slot;

	memset(st, 0, sizeof(*st));
	if (bpf_map_lookup_elem(s->ctl_fd, &zero, &st->ctl)) {
		print_error("read %s/ccs_ctl: %s", cfg.pin_dir, strerror(errno));
		return -1;
	}
	for (slot = 0; slot < CCS_SLOTS; slot++) {
		if (bpf_map_lookup_elem(s->meta_fd, &slot, &st->meta[slot])) {
			print_error("read %s/ccs_meta[%u]: %s", cfg.pin_dir, slot, strerror(errno));
			return -1;
		}
		if (slot_map_id(s->tables_fd, slot, &st->index_id[slot])) {
			print_error("read %s/ccs_tables[%u]: %s", cfg.pin_dir, slot, strerror(errno));
			return -1;
		}
		st->ok[slot] = slot_consistent(&st->meta[slot], st->index_id[slot]);
	}
	if (s->version_fd >= 0 && bpf_map_lookup_elem(s->version_fd, &zero, &st->ver)) {
		print_error("read %s/ccs_version: %s", cfg.pin_dir, strerror(errno));
		return -1;
	}
	st->floor = st->ver.highest;
	for (slot = 0; slot < CCS_SLOTS; slot++)
		if (st->ok[slot] && st->meta[slot].version > st->floor)
			st->floor = st->meta[slot].version;
	if (floor_read(&st->fl))
		return -1;
	st->has_floor = st->fl.present;
	if (!st->fl.present && st->floor) {
		/* a pin dir from before the floor file: its versions are epoch 0 */
		st->has_floor = true;
		st->fl.version = st->floor;
		memcpy(st->fl.sha256, st->ver.highest_sha256, sizeof(st->fl.sha256));
		for (slot = 0; slot < CCS_SLOTS; slot++)
			if (st->ok[slot] && st->meta[slot].version == st->floor)
				memcpy(st->fl.sha256, st->meta[slot].sha256, sizeof(st->fl.sha256));
		st->fl.overrides = st->ver.overrides;
	}
	return 0;
}

static int live_slot(const struct state *st)
{
	return st->ctl.live >= 1 && st->ctl.live <= CCS_SLOTS ? (int)st->ctl.live - 1 : -1;
}

/*
 * The live slot still marked staged (a load killed between its flip and step 6): its table was
 * made live, so it is marked so before a load or rollback changes what is live.
 */
static int settle_live(const struct slots *s, struct state *st)
{
	int live = live_slot(st);
	__u32 slot = (__u32)live;
	struct ccs_meta m;

	if (live < 0 || !st->ok[live] || st->meta[live].valid != CCS_META_STAGED)
		return 0;
	m = st->meta[live];
	m.valid = CCS_META_LIVE;
	if (bpf_map_update_elem(s->meta_fd, &slot, &m, BPF_ANY)) {
		print_error("mark live slot %u made live (ccs_meta): %s", slot, strerror(errno));
		return -1;
	}
	st->meta[live] = m;
	return 0;
}

/*
 * The pinned ccs_version map: a copy of the floor (its version and sha256, the overrides) for
 * readers of the pin dir; the floor itself is the file (floor.c), written before the flip.
 */
static int record_version(const struct slots *s, const struct floor *f)
{
	struct ccs_version v = {};
	__u32 zero = 0;

	if (s->version_fd < 0)
		return 0;
	v.highest = f->version;
	memcpy(v.highest_sha256, f->sha256, sizeof(v.highest_sha256));
	v.overrides = f->overrides;
	v.override_unix = f->override_unix;
	v.override_from = f->override_from;
	v.override_to = f->override_to;
	if (bpf_map_update_elem(s->version_fd, &zero, &v, BPF_ANY)) {
		print_error("write %s/ccs_version: %s", cfg.pin_dir, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * The floor after making table (epoch, version, sha256) live: a newer table becomes the floor;
 * an older one (an override: load --allow-downgrade, rollback) leaves it and is counted, with
 * the floor it went below and the table it made live, and logged.
 */
static void next_floor(const struct state *st, struct floor *f, __u64 epoch, __u64 version,
		       const __u8 *sha256, bool override, const char *how, __u64 live_before)
{
	__u64 now = (__u64)time(NULL);

	*f = st->fl;
	f->present = true;
	if (override) {
		fprintf(stderr, "ccs-edge: version rule overridden (%s): table %llu (epoch %llu) made "
			"live, older than table %llu (epoch %llu) loaded before (live was %llu)\n", how,
			(unsigned long long)version, (unsigned long long)epoch,
			(unsigned long long)st->fl.version, (unsigned long long)st->fl.epoch,
			(unsigned long long)live_before);
		f->overrides++;
		f->override_unix = now;
		f->override_from_epoch = st->fl.epoch;
		f->override_from = st->fl.version;
		f->override_to_epoch = epoch;
		f->override_to = version;
		return;
	}
	if (st->has_floor && epoch != st->fl.epoch)
		fprintf(stderr, "ccs-edge: epoch %llu opened here by table %llu (the floor was table "
			"%llu of epoch %llu): from now on no table of an older epoch loads without an "
			"override\n", (unsigned long long)epoch, (unsigned long long)version,
			(unsigned long long)st->fl.version, (unsigned long long)st->fl.epoch);
	if (!st->has_floor || epoch != st->fl.epoch || !st->fl.epoch_since_unix)
		f->epoch_since_unix = now;
	f->epoch = epoch;
	f->version = version;
	memcpy(f->sha256, sha256, sizeof(f->sha256));
	f->updated_unix = now;
}

enum rule { RULE_NEWER, RULE_SAME_TABLE, RULE_ALREADY_LIVE, RULE_OVERRIDE, RULE_REFUSED };

/* (epoch, version) order */
static int cmp_serial(__u64 e1, __u64 v1, __u64 e2, __u64 v2)
{
	if (e1 != e2)
		return e1 < e2 ? -1 : 1;
	return v1 < v2 ? -1 : v1 > v2;
}

/* --allow-downgrade [EPOCH:]VERSION; a bare VERSION means the floor's epoch */
static int parse_named(const char *named, const struct state *st, __u64 *e, __u64 *v)
{
	const char *s = named, *colon = strchr(s, ':');
	char *end;

	*e = st->fl.epoch;
	errno = 0;
	if (colon) {
		if (!isdigit((unsigned char)s[0]))
			goto bad;
		*e = strtoull(s, &end, 10);
		if (errno || end != colon)
			goto bad;
		s = colon + 1;
	}
	if (!isdigit((unsigned char)s[0]))
		goto bad;
	*v = strtoull(s, &end, 10);
	if (errno || *end || !*v)
		goto bad;
	return 0;
bad:
	print_error("--allow-downgrade [EPOCH:]VERSION: the manifest's (epoch and) version, not \"%s\"",
		named);
	return -1;
}

/*
 * The version rule (issue 56, item 3), on (epoch, version) against the floor, the newest table
 * made live here (floor.c keeps it on disk, through restarts, `detach --purge` and reboots):
 *   - a newer version of the floor's epoch loads if it passes the floor's by at most
 *     version_max_step (no single table can take the epoch's last versions);
 *   - the next epoch (floor's + 1, never more) loads with a version of at most
 *     version_max_step: an epoch is opened by an operator, one at a time, and its versions
 *     start again (a new lake or store numbers from 1);
 *   - the floor's own table again (same epoch, version, sha256) loads, a no-op if it is live;
 *   - anything older only with --allow-downgrade naming it (an explicit override, logged);
 *   - an agent with no floor yet takes its first table whatever its version, if its epoch is
 *     at most CCS_FIRST_EPOCH_MAX.
 */
static enum rule version_rule(const struct state *st, const struct table *t, const char *allow)
{
	__u64 e = t->man.epoch, v = t->man.version, ne = 0, nv = 0, step = cfg.version_max_step;
	const struct floor *f = &st->fl;
	int live = live_slot(st), c, i;
	bool same = false;

	if (allow && parse_named(allow, st, &ne, &nv))
		return RULE_REFUSED;
	if (!st->has_floor) {
		if (e > CCS_FIRST_EPOCH_MAX) {
			print_error("refused: table %llu is of epoch %llu, and this agent has no floor yet: a "
				"first table's epoch is at most %llu (epochs go up one at a time)",
				(unsigned long long)v, (unsigned long long)e, CCS_FIRST_EPOCH_MAX);
			return RULE_REFUSED;
		}
		return RULE_NEWER;
	}
	c = cmp_serial(e, v, f->epoch, f->version);
	if (c > 0 && e == f->epoch) {
		if (v - f->version <= step)
			return RULE_NEWER;
		print_error("refused: table %llu is %llu versions past table %llu, the newest of epoch %llu "
			"loaded here: more than version_max_step (%llu). One table may not use up an "
			"epoch's versions; if the numbering restarted or jumped on purpose, open the "
			"next epoch (`ccs keys epoch --new`) and sign the table in it",
			(unsigned long long)v, (unsigned long long)(v - f->version),
			(unsigned long long)f->version, (unsigned long long)e,
			(unsigned long long)step);
		return RULE_REFUSED;
	}
	if (c > 0) {
		if (e != f->epoch + 1) {
			print_error("refused: table %llu is of epoch %llu, but this agent is in epoch %llu: "
				"epochs go up by one (an operator opens each: `ccs keys epoch --new`)",
				(unsigned long long)v, (unsigned long long)e, (unsigned long long)f->epoch);
			return RULE_REFUSED;
		}
		if (v > step) {
			print_error("refused: table %llu opens epoch %llu, but a new epoch's versions start "
				"again: at most version_max_step (%llu)", (unsigned long long)v,
				(unsigned long long)e, (unsigned long long)step);
			return RULE_REFUSED;
		}
		return RULE_NEWER;
	}
	if (c == 0) {
		if (!memcmp(f->sha256, t->sha256, 32))
			same = true;
		for (i = 0; i < CCS_SLOTS && !st->fl.present; i++)   /* a pin dir from before the file */
			if (st->ok[i] && st->meta[i].version == v && !memcmp(st->meta[i].sha256, t->sha256, 32))
				same = true;
		if (same && live >= 0 && st->ok[live] && st->meta[live].version == v &&
		    !memcmp(st->meta[live].sha256, t->sha256, 32))
			return RULE_ALREADY_LIVE;
		if (same)
			return RULE_SAME_TABLE;
	}
	if (allow && ne == e && nv == v)
		return RULE_OVERRIDE;
	if (allow)
		print_error("refused: --allow-downgrade %s does not name this manifest's version %llu "
			"(epoch %llu)%s", allow, (unsigned long long)v, (unsigned long long)e,
			e != f->epoch ? ": a table of another epoch than the floor's is named EPOCH:VERSION"
				      : "");
	else if (c == 0)
		print_error("refused: table %llu was loaded here before with another sha256: a version "
			"names one table (load --allow-downgrade %llu:%llu to override)",
			(unsigned long long)v, (unsigned long long)e, (unsigned long long)v);
	else
		print_error("refused: table %llu (epoch %llu) is older than table %llu (epoch %llu), loaded "
			"here before: versions only go forward (replay). To go back: `ccs-edge rollback` "
			"(the previous slot) or `ccs-edge load MANIFEST --allow-downgrade %llu:%llu`",
			(unsigned long long)v, (unsigned long long)e, (unsigned long long)f->version,
			(unsigned long long)f->epoch, (unsigned long long)e, (unsigned long long)v);
	return RULE_REFUSED;
}

/* CLOCK_MONOTONIC ns of the expiry, saturating at U64_MAX (never wrapping into the past) */
static __u64 expiry_mono_ns(__u64 expires_unix, time_t now)
{
	__u64 mono = clock_ns(CLOCK_MONOTONIC), left_s, room_s;

	if (expires_unix <= (__u64)now)
		return mono;
	left_s = expires_unix - (__u64)now;
	room_s = (UINT64_MAX - mono) / 1000000000ull;
	if (left_s >= room_s)
		return UINT64_MAX;
	return mono + left_s * 1000000000ull;
}

/*
 * Fill the idle slot, then flip ctl.live (one word); the old table stays in the other slot.
 * The slot is marked invalid before anything in it changes and valid (with the installed index's
 * map id) only after: a crash anywhere in between leaves an invalid slot, which rollback and
 * status refuse to trust, and the next load overwrites.
 */
static int swap_in(const struct slots *s, const struct state *st, const struct table *t,
		   int index_fd, const struct ccs_meta *lens, int tree_fd, time_t now, __u32 *slotp)
{
	struct ccs_flow flow = {};
	struct bpf_map_info tinfo = {};
	__u32 tlen = sizeof(tinfo);
	struct ccs_ctl ctl = st->ctl;
	struct ccs_meta meta = {};
	struct ccs_model model = {};
	struct bpf_map_info info = {};
	__u32 zero = 0, slot, len = sizeof(info);
	int live = live_slot(st);

	slot = live >= 0 ? (__u32)(live + 1) % CCS_SLOTS : 0;
	/* 1. the slot is about to change: invalid from here until step 4 */
	meta = st->meta[slot];
	meta.valid = 0;
	meta.index_id = 0;
	if (bpf_map_update_elem(s->meta_fd, &slot, &meta, BPF_ANY)) {
		print_error("mark slot %u invalid (ccs_meta): %s", slot, strerror(errno));
		return -1;
	}
	/* 2. the index */
	if (bpf_map_update_elem(s->tables_fd, &slot, &index_fd, BPF_ANY)) {
		print_error("install index in slot %u (ccs_tables): %s", slot, strerror(errno));
		return -1;
	}
	if (bpf_obj_get_info_by_fd(index_fd, &info, &len)) {
		print_error("index map id: %s", strerror(errno));
		return -1;
	}
	/* 2b. the flow tree, or none: the slot must not keep the tree of the table it held before */
	if (tree_fd >= 0) {
		if (bpf_map_update_elem(s->trees_fd, &slot, &tree_fd, BPF_ANY) ||
		    bpf_obj_get_info_by_fd(tree_fd, &tinfo, &tlen)) {
			print_error("install tree in slot %u (ccs_trees): %s", slot, strerror(errno));
			return -1;
		}
	} else if (s->trees_fd >= 0 && bpf_map_delete_elem(s->trees_fd, &slot) && errno != ENOENT) {
		print_error("remove the old tree from slot %u (ccs_trees): %s", slot, strerror(errno));
		return -1;
	}
	/* 3. the model version, for status */
	memset(&meta, 0, sizeof(meta));
	meta.version = t->man.version;
	meta.created_unix = t->man.created;
	meta.expires_unix = t->man.expires;
	meta.expires_mono_ns = expiry_mono_ns(t->man.expires, now);
	meta.loaded_unix = now;
	meta.n_v4 = t->h->n_v4;
	meta.n_v6 = t->h->n_v6;
	meta.valid = CCS_META_STAGED;   /* whole, not live yet: step 6 says it was made live */
	meta.index_id = info.id;
	memcpy(meta.sha256, t->sha256, 32);
	meta.n_len4 = lens->n_len4;
	meta.n_len6 = lens->n_len6;
	memcpy(meta.lens, lens->lens, sizeof(meta.lens));
	model.version = meta.version;
	model.loaded_unix = meta.loaded_unix;
	memcpy(model.model_version, t->man.model_version, sizeof(model.model_version));
	if (s->model_fd >= 0 && bpf_map_update_elem(s->model_fd, &slot, &model, BPF_ANY)) {
		print_error("write slot %u model version (ccs_model): %s", slot, strerror(errno));
		return -1;
	}
	flow.version = meta.version;
	flow.loaded_unix = meta.loaded_unix;
	flow.tree_id = tree_fd >= 0 ? tinfo.id : 0;
	flow.n_nodes = (__u16)t->n_nodes;
	flow.min_purity_permille = t->h->tree_min_purity_permille;
	flow.min_leaf_permille = t->h->tree_min_leaf_permille;
	memcpy(flow.model, t->man.tree_model, sizeof(flow.model));
	if (s->flow_fd >= 0 && bpf_map_update_elem(s->flow_fd, &slot, &flow, BPF_ANY)) {
		print_error("write slot %u flow tree record (ccs_flow): %s", slot, strerror(errno));
		return -1;
	}
	/* 4. the meta: the slot is valid again (staged), describing the index now in it */
	if (bpf_map_update_elem(s->meta_fd, &slot, &meta, BPF_ANY)) {
		print_error("write slot %u metadata (ccs_meta): %s", slot, strerror(errno));
		return -1;
	}
	/* 5. the swap */
	ctl.live = slot + 1;
	ctl.generation++;
	if (bpf_map_update_elem(s->ctl_fd, &zero, &ctl, BPF_ANY)) {
		print_error("swap (ccs_ctl): %s", strerror(errno));
		return -1;
	}
	*slotp = slot;
	/* 6. the slot's table was made live: from now on a table rollback may go back to. Not
	 * fatal (the table is live): settle_live() marks it at the next load or rollback */
	meta.valid = CCS_META_LIVE;
	if (bpf_map_update_elem(s->meta_fd, &slot, &meta, BPF_ANY))
		fprintf(stderr, "ccs-edge: table %llu is live; marking slot %u live (ccs_meta) failed: "
			"%s (the next load or rollback marks it)\n", (unsigned long long)meta.version,
			slot, strerror(errno));
	return 0;
}

int cmd_load(const char *manifest_path, bool json, const char *allow_downgrade)
{
	struct floor nf;
	int live;
	struct slots s = { -1, -1, -1, -1, -1, -1, -1 };
	struct state st;
	struct table t = {};
	__u64 t0, t1, t2, t3, t4 = 0;
	int n_routes = 0;
	int index_fd = -1, tree_fd = -1, lock_fd = -1, err = -1;
	struct ccs_meta lens = {};
	enum rule rule;
	__u32 slot = 0;
	time_t now = time(NULL);

	t0 = clock_ns(CLOCK_MONOTONIC);
	/* 1. signature over the exact manifest bytes, then its fields; 2. the .bin's sha256;
	 * 3. header against the manifest, expiry, every entry */
	if (manifest_read(manifest_path, &t.man) || read_table_bin(manifest_path, &t) ||
	    check_table(&t, now))
		goto cleanup;
	t1 = clock_ns(CLOCK_MONOTONIC);
	if (open_slots(&s))
		goto cleanup;
	if (t.n_nodes && s.trees_fd < 0) {
		print_error("refused: table %llu carries a flow tree, but the program attached under %s "
			"predates it (no ccs_trees): run `ccs-edge attach` first",
			(unsigned long long)t.man.version, cfg.pin_dir);
		goto cleanup;
	}
	lock_fd = lock_pin_dir();
	if (lock_fd < 0) {
		print_error("lock %s: %s", cfg.pin_dir, strerror(-lock_fd));
		goto cleanup;
	}
	/* 4. the version rule, against what the slots hold now */
	if (read_state(&s, &st) || settle_live(&s, &st))
		goto cleanup;
	rule = version_rule(&st, &t, allow_downgrade);
	if (rule == RULE_REFUSED)
		goto cleanup;
	if (rule == RULE_ALREADY_LIVE) {
		slot = (__u32)live_slot(&st);
		err = 0;
		/* a pin dir from before the floor file: its floor goes to disk now, so that a purge
		 * or reboot from here on keeps it */
		if (!st.fl.present) {
			st.fl.present = true;
			st.fl.updated_unix = st.fl.epoch_since_unix = (__u64)now;
			if (floor_write(&st.fl))
				err = -1;
		}
		/* route CCs: the live table's routes written again (an agent restarted, or routes
		 * turned on since it was loaded) */
		if (routes_enabled() && routes_sync(t.ents, t.n) < 0) {
			print_error("load: table %llu is live, but step 7 (write its route CCs) failed",
				(unsigned long long)t.man.version);
			err = -1;
		}
		if (json)
			printf("{\"loaded\": true, \"unchanged\": true, \"epoch\": %llu, \"version\": %llu, "
			       "\"slot\": %u, \"entries\": {\"v4\": %u, \"v6\": %u}}\n",
			       (unsigned long long)t.man.epoch, (unsigned long long)t.man.version,
			       slot, t.h->n_v4, t.h->n_v6);
		else
			printf("table %llu is already live (slot %u): nothing to do\n",
			       (unsigned long long)t.man.version, slot);
		goto cleanup;
	}
	/* 5. build the new lookup hash (nothing is live yet); 6. swap it in */
	index_fd = build_index(&t, &lens);
	if (index_fd < 0)
		goto cleanup;
	if (t.n_nodes) {
		tree_fd = build_tree(&t);
		if (tree_fd < 0)
			goto cleanup;
	}
	t2 = clock_ns(CLOCK_MONOTONIC);
	/* the floor on disk first: a crash after the flip must not leave it below the live table */
	live = live_slot(&st);
	next_floor(&st, &nf, t.man.epoch, t.man.version, t.sha256, rule == RULE_OVERRIDE,
		   "load --allow-downgrade", live >= 0 && st.ok[live] ? st.meta[live].version : 0);
	if (floor_write(&nf)) {
		print_error("refused: table %llu not made live: the version floor could not be kept (%s)",
			(unsigned long long)t.man.version, cfg.state_dir);
		goto cleanup;
	}
	if (swap_in(&s, &st, &t, index_fd, &lens, tree_fd, now, &slot))
		goto cleanup;
	record_version(&s, &nf);
	t3 = clock_ns(CLOCK_MONOTONIC);
	err = 0;
	/* 7. route CCs for the new live table (routes.c): a head start only, so after the swap; a
	 * failure does not undo the swap (a missing route costs a switch in the program), but the
	 * load exits 1 naming the step */
	if (routes_enabled()) {
		n_routes = routes_sync(t.ents, t.n);
		t4 = clock_ns(CLOCK_MONOTONIC);
		if (n_routes < 0) {
			print_error("load: table %llu is live, but step 7 (write its route CCs) failed: the "
				"program switches the connections of the missing routes itself",
				(unsigned long long)t.man.version);
			err = -1;
		}
	}
	if (json)
		printf("{\"loaded\": true, \"epoch\": %llu, \"version\": %llu, \"slot\": %u, \"override\": %s, "
		       "\"entries\": {\"v4\": %u, \"v6\": %u}, \"tree_nodes\": %zu, \"verify_ms\": %.3f, "
		       "\"build_ms\": %.3f, \"swap_us\": %.3f, \"total_ms\": %.3f, \"routes\": %d, "
		       "\"routes_ms\": %.3f}\n",
		       (unsigned long long)t.man.epoch, (unsigned long long)t.man.version, slot,
		       rule == RULE_OVERRIDE ? "true" : "false", t.h->n_v4, t.h->n_v6, t.n_nodes, (t1 - t0) / 1e6,
		       (t2 - t1) / 1e6, (t3 - t2) / 1e3, (t3 - t0) / 1e6, n_routes,
		       t4 ? (t4 - t3) / 1e6 : 0.0);
	else
		printf("loaded table %llu (%u v4 + %u v6 entries) into slot %u\n",
		       (unsigned long long)t.man.version, t.h->n_v4, t.h->n_v6, slot);
cleanup:
	if (index_fd >= 0)
		close(index_fd);
	if (tree_fd >= 0)
		close(tree_fd);
	close_slots(&s);
	if (lock_fd >= 0)
		close(lock_fd);
	free(t.bin);
	return err ? 1 : 0;
}

/*
 * Make the previous table live again: only a slot that is valid and holds the index its meta
 * describes (a load that died half-way left it invalid), and not expired. Going back to an older
 * version is the rollback's own override of the version rule: logged and recorded.
 */
int cmd_rollback(void)
{
	struct slots s = { -1, -1, -1, -1, -1, -1, -1 };
	struct ccs_flow flow = {};
	__u32 tree_id = 0;
	struct state st;
	struct ccs_ctl ctl;
	const struct ccs_meta *m;
	int lock_fd = -1, err = 1, live;
	__u32 zero = 0, prev;
	__u64 live_before;
	struct floor nf;
	bool override;

	if (open_slots(&s))
		goto cleanup;
	lock_fd = lock_pin_dir();
	if (lock_fd < 0) {
		print_error("lock %s: %s", cfg.pin_dir, strerror(-lock_fd));
		goto cleanup;
	}
	if (read_state(&s, &st) || settle_live(&s, &st))
		goto cleanup;
	live = live_slot(&st);
	if (live < 0) {
		print_error("rollback: no live table");
		goto cleanup;
	}
	prev = (__u32)(live + 1) % CCS_SLOTS;
	m = &st.meta[prev];
	if (!m->valid) {
		print_error("rollback: no previous table (slot %u is empty, or a load changing it did not "
			"finish: its metadata is marked invalid)", prev);
		goto cleanup;
	}
	if (!st.ok[prev]) {
		print_error("rollback: slot %u is inconsistent: its index (map id %u) is not the one its "
			"metadata describes (table %llu, map id %u); refusing", prev, st.index_id[prev],
			(unsigned long long)m->version, m->index_id);
		goto cleanup;
	}
	if (m->valid == CCS_META_STAGED) {
		print_error("rollback: slot %u holds table %llu, whose load did not finish: it was never "
			"made live (killed between its metadata and the flip); refusing. Load it again "
			"to make it live", prev, (unsigned long long)m->version);
		goto cleanup;
	}
	if (m->expires_mono_ns <= clock_ns(CLOCK_MONOTONIC)) {
		print_error("rollback: previous table %llu has expired", (unsigned long long)m->version);
		goto cleanup;
	}
	/* the slot's flow tree must be the one its table's record names (or none, with none) */
	if (s.flow_fd >= 0 && !bpf_map_lookup_elem(s.flow_fd, &prev, &flow) &&
	    flow.version == m->version && flow.loaded_unix == m->loaded_unix &&
	    (slot_map_id(s.trees_fd, prev, &tree_id) || tree_id != flow.tree_id)) {
		print_error("rollback: slot %u is inconsistent: its flow tree (map id %u) is not the one "
			"its table's record names (map id %u); refusing", prev, tree_id, flow.tree_id);
		goto cleanup;
	}
	live_before = st.ok[live] ? st.meta[live].version : 0;
	/* going back is the rollback's own override, unless the slot holds the floor's table; the
	 * floor on disk first (it does not move down: the override is counted) */
	override = !st.has_floor || m->version != st.fl.version ||
		   memcmp(m->sha256, st.fl.sha256, sizeof(m->sha256));
	next_floor(&st, &nf, st.fl.epoch, m->version, m->sha256, override, "rollback", live_before);
	if (override) {   /* the slot's epoch is not kept: the override names the floor's */
		nf.override_to_epoch = st.fl.epoch;
	}
	if (floor_write(&nf)) {
		print_error("rollback: refused: the version floor could not be kept (%s)", cfg.state_dir);
		goto cleanup;
	}
	ctl = st.ctl;
	ctl.live = prev + 1;
	ctl.generation++;
	if (bpf_map_update_elem(s.ctl_fd, &zero, &ctl, BPF_ANY)) {
		print_error("rollback: swap (ccs_ctl): %s", strerror(errno));
		goto cleanup;
	}
	printf("rolled back to table %llu (slot %u)\n", (unsigned long long)m->version, prev);
	err = record_version(&s, &nf) ? 1 : 0;
	/* route CCs: the table rolled back from is not in memory here: its routes go, and the
	 * program switches every connection itself until the next load writes routes again. If
	 * they stay, they are stale: the rollback fails, naming the step */
	if (routes_enabled() && routes_flush()) {
		print_error("rollback: table %llu is live, but step 2 (flush the route CCs of table %llu) "
			"failed: its routes stay, stale, until a load or detach (the program corrects "
			"their connections' CCs)", (unsigned long long)m->version,
			(unsigned long long)live_before);
		err = 1;
	}
cleanup:
	close_slots(&s);
	if (lock_fd >= 0)
		close(lock_fd);
	return err;
}
