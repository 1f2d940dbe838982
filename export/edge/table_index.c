// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * table_index.c - a load's build step, nothing live yet: the lookup index, a hash of the entries
 * plus a marker for each shorter length a longer entry sits under (ccs.h: the binary search on
 * prefix lengths of Waldvogel et al., SIGCOMM '97), and the flow tree's one-value array.
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

#include "table.h"

/* a new map holding the table's flow tree (ccs.h struct ccs_tree, one value): its fd, or -1 */
int build_tree(const struct table *t)
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

/* each entry's key (an IPv4 prefix as ::ffff:a.b.c.d/96+len) and value, in table order */
static void entry_keys(const struct table *t, struct ccs_lpm_key *keys, struct ccs_lpm_val *vals)
{
	size_t i;

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
}

/*
 * The m records sorted, each key's merged into one (an entry, the first, takes the markers'
 * LONGER flag): -> how many keys, or (size_t)-1 after refusing a duplicate prefix.
 */
static size_t merge_records(struct rec *r, size_t m)
{
	size_t i, j, u = 0;

	qsort(r, m, sizeof(*r), rec_cmp);
	for (i = 0; i < m; i = j) {
		r[u] = r[i];
		for (j = i + 1; j < m && !key_cmp(&r[j].k, &r[i].k); j++) {
			if (r[j].entry != (size_t)-1) {
				print_error("refused: entry %zu: duplicate prefix", r[j].entry);
				return (size_t)-1;
			}
			r[u].v.flags |= r[j].v.flags & CCS_VAL_LONGER;
		}
		u++;
	}
	return u;
}

/* each marker's value: its best match's, the longest entry of a shorter length of its family
 * covering it (none: the marker stays a marker only) */
static void marker_values(struct rec *r, size_t u, const struct ccs_meta *meta)
{
	size_t i;
	unsigned l;

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
}

/* a new hash map holding the u records: its fd, or -1 after printing why */
static int write_hash(const struct rec *r, size_t u)
{
	size_t i;
	int fd;

	fd = bpf_map_create(BPF_MAP_TYPE_HASH, "ccs_lookup", sizeof(struct ccs_lpm_key),
			    sizeof(struct ccs_lpm_val), u ? (__u32)u : 1, NULL);
	if (fd < 0) {
		print_error("create the lookup hash: %s", strerror(errno));
		return -1;
	}
	for (i = 0; i < u; i++) {
		if (bpf_map_update_elem(fd, &r[i].k, &r[i].v, BPF_NOEXIST)) {
			print_error("refused: %s %zu: %s", r[i].entry != (size_t)-1 ? "entry" : "marker",
				r[i].entry != (size_t)-1 ? r[i].entry : i, strerror(errno));
			close(fd);
			return -1;
		}
	}
	return fd;
}

/*
 * A new lookup hash holding the table (nothing is live yet): its fd, or -1. meta gets the
 * families' lengths (n_len4, n_len6, lens). By step: the entries' keys, each family's lengths,
 * its records (the entries and their markers), merged by key, the markers' values, the map.
 */
int build_index(const struct table *t, struct ccs_meta *meta)
{
	struct ccs_lpm_key *keys = NULL;
	struct ccs_lpm_val *vals = NULL;
	struct rec *r = NULL;
	size_t m = 0, u;
	int fd = -1;

	keys = calloc(t->n ? t->n : 1, sizeof(*keys));
	vals = calloc(t->n ? t->n : 1, sizeof(*vals));
	if (!keys || !vals) {
		print_error("build the lookup: out of memory");
		goto out;
	}
	entry_keys(t, keys, vals);
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
	u = merge_records(r, m);
	if (u == (size_t)-1)
		goto out;
	marker_values(r, u, meta);
	fd = write_hash(r, u);
out:
	free(keys);
	free(vals);
	free(r);
	return fd;
}
