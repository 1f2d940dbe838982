// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * table_slots.c - the pinned maps a load or rollback reads and writes: the two slots (ccs_meta,
 * ccs_tables, ccs_trees, ccs_flow, ccs_model), ccs_ctl.live and ccs_version. swap_in changes
 * the idle slot in an order a crash cannot make inconsistent: its meta marked invalid, the index
 * installed, the meta written (valid but staged, with the index's map id), then ccs_ctl.live
 * flipped (one word), then the meta marked made live.
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

void close_slots(struct slots *s)
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

int open_slots(const char *pin_dir, struct slots *s)
{
	s->pin_dir = pin_dir;
	s->ctl_fd = open_pinned(pin_dir, "ccs_ctl");
	s->meta_fd = open_pinned(pin_dir, "ccs_meta");
	s->tables_fd = open_pinned(pin_dir, "ccs_tables");
	s->model_fd = open_pinned(pin_dir, "ccs_model");
	s->version_fd = open_pinned(pin_dir, "ccs_version");
	s->trees_fd = open_pinned(pin_dir, "ccs_trees");
	s->flow_fd = open_pinned(pin_dir, "ccs_flow");
	if (s->trees_fd < 0 || s->flow_fd < 0) {
		if (s->trees_fd >= 0)
			close(s->trees_fd);
		if (s->flow_fd >= 0)
			close(s->flow_fd);
		s->trees_fd = s->flow_fd = -1;
	}
	if (s->ctl_fd < 0 || s->meta_fd < 0 || s->tables_fd < 0) {
		print_error("not attached: no pinned maps under %s", pin_dir);
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

int read_state(const struct slots *s, const char *state_dir, struct state *st)
{
	__u32 zero = 0, slot;

	memset(st, 0, sizeof(*st));
	if (bpf_map_lookup_elem(s->ctl_fd, &zero, &st->ctl)) {
		print_error("read %s/ccs_ctl: %s", s->pin_dir, strerror(errno));
		return -1;
	}
	for (slot = 0; slot < CCS_SLOTS; slot++) {
		if (bpf_map_lookup_elem(s->meta_fd, &slot, &st->meta[slot])) {
			print_error("read %s/ccs_meta[%u]: %s", s->pin_dir, slot, strerror(errno));
			return -1;
		}
		if (slot_map_id(s->tables_fd, slot, &st->index_id[slot])) {
			print_error("read %s/ccs_tables[%u]: %s", s->pin_dir, slot, strerror(errno));
			return -1;
		}
		st->ok[slot] = slot_consistent(&st->meta[slot], st->index_id[slot]);
	}
	if (s->version_fd >= 0 && bpf_map_lookup_elem(s->version_fd, &zero, &st->ver)) {
		print_error("read %s/ccs_version: %s", s->pin_dir, strerror(errno));
		return -1;
	}
	st->floor = st->ver.highest;
	for (slot = 0; slot < CCS_SLOTS; slot++)
		if (st->ok[slot] && st->meta[slot].version > st->floor)
			st->floor = st->meta[slot].version;
	if (floor_read(state_dir, &st->fl))
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

int live_slot(const struct state *st)
{
	return st->ctl.live >= 1 && st->ctl.live <= CCS_SLOTS ? (int)st->ctl.live - 1 : -1;
}

/*
 * The live slot still marked staged (a load killed between its flip and step 6): its table was
 * made live, so it is marked so before a load or rollback changes what is live.
 */
int settle_live(const struct slots *s, struct state *st)
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
int record_version(const struct slots *s, const struct floor *f)
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
		print_error("write %s/ccs_version: %s", s->pin_dir, strerror(errno));
		return -1;
	}
	return 0;
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

/* step 2: the index, and the flow tree or none (the slot must not keep the tree of the table it
 * held before), in the slot; their map ids (tree: 0 for none). 0, or -1 after printing why */
static int install_maps(const struct slots *s, __u32 slot, int index_fd, int tree_fd,
			__u32 *index_id, __u32 *tree_id)
{
	struct bpf_map_info info = {}, tinfo = {};
	__u32 len = sizeof(info), tlen = sizeof(tinfo);

	if (bpf_map_update_elem(s->tables_fd, &slot, &index_fd, BPF_ANY)) {
		print_error("install index in slot %u (ccs_tables): %s", slot, strerror(errno));
		return -1;
	}
	if (bpf_obj_get_info_by_fd(index_fd, &info, &len)) {
		print_error("index map id: %s", strerror(errno));
		return -1;
	}
	*index_id = info.id;
	*tree_id = 0;
	if (tree_fd >= 0) {
		if (bpf_map_update_elem(s->trees_fd, &slot, &tree_fd, BPF_ANY) ||
		    bpf_obj_get_info_by_fd(tree_fd, &tinfo, &tlen)) {
			print_error("install tree in slot %u (ccs_trees): %s", slot, strerror(errno));
			return -1;
		}
		*tree_id = tinfo.id;
	} else if (s->trees_fd >= 0 && bpf_map_delete_elem(s->trees_fd, &slot) && errno != ENOENT) {
		print_error("remove the old tree from slot %u (ccs_trees): %s", slot, strerror(errno));
		return -1;
	}
	return 0;
}

/* the slot's meta for table t, whole but staged (not live yet: step 6 says it was made live) */
static void staged_meta(const struct table *t, const struct ccs_meta *lens, __u32 index_id,
			time_t now, struct ccs_meta *meta)
{
	memset(meta, 0, sizeof(*meta));
	meta->version = t->man.version;
	meta->created_unix = t->man.created;
	meta->expires_unix = t->man.expires;
	meta->expires_mono_ns = expiry_mono_ns(t->man.expires, now);
	meta->loaded_unix = now;
	meta->n_v4 = t->h->n_v4;
	meta->n_v6 = t->h->n_v6;
	meta->valid = CCS_META_STAGED;
	meta->index_id = index_id;
	memcpy(meta->sha256, t->sha256, 32);
	meta->n_len4 = lens->n_len4;
	meta->n_len6 = lens->n_len6;
	memcpy(meta->lens, lens->lens, sizeof(meta->lens));
}

/* step 3: the slot's model version (for status) and flow tree record (ccs.h struct ccs_flow),
 * where the program has those maps. 0, or -1 after printing why */
static int write_records(const struct slots *s, __u32 slot, const struct table *t,
			 const struct ccs_meta *meta, __u32 tree_id)
{
	struct ccs_model model = {};
	struct ccs_flow flow = {};

	model.version = meta->version;
	model.loaded_unix = meta->loaded_unix;
	memcpy(model.model_version, t->man.model_version, sizeof(model.model_version));
	if (s->model_fd >= 0 && bpf_map_update_elem(s->model_fd, &slot, &model, BPF_ANY)) {
		print_error("write slot %u model version (ccs_model): %s", slot, strerror(errno));
		return -1;
	}
	flow.version = meta->version;
	flow.loaded_unix = meta->loaded_unix;
	flow.tree_id = tree_id;
	flow.n_nodes = (__u16)t->n_nodes;
	flow.min_purity_permille = t->h->tree_min_purity_permille;
	flow.min_leaf_permille = t->h->tree_min_leaf_permille;
	memcpy(flow.model, t->man.tree_model, sizeof(flow.model));
	if (s->flow_fd >= 0 && bpf_map_update_elem(s->flow_fd, &slot, &flow, BPF_ANY)) {
		print_error("write slot %u flow tree record (ccs_flow): %s", slot, strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * Fill the idle slot, then flip ctl.live (one word); the old table stays in the other slot.
 * The slot is marked invalid before anything in it changes and valid (with the installed index's
 * map id) only after: a crash anywhere in between leaves an invalid slot, which rollback and
 * status refuse to trust, and the next load overwrites.
 */
int swap_in(const struct slots *s, const struct state *st, const struct table *t,
	    int index_fd, const struct ccs_meta *lens, int tree_fd, time_t now, __u32 *slotp)
{
	struct ccs_ctl ctl = st->ctl;
	struct ccs_meta meta;
	__u32 zero = 0, slot, index_id, tree_id;
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
	/* 2. the index and the tree; 3. the model version and the flow record */
	if (install_maps(s, slot, index_fd, tree_fd, &index_id, &tree_id))
		return -1;
	staged_meta(t, lens, index_id, now, &meta);
	if (write_records(s, slot, t, &meta, tree_id))
		return -1;
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
