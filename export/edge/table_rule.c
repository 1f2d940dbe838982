// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * table_rule.c - the version rule (issue 56): whether a verified table may be made live, on its
 * (epoch, version) against the floor (floor.c), and the floor after it is.
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

/*
 * The floor after making table (epoch, version, sha256) live: a newer table becomes the floor;
 * an older one (an override: load --allow-downgrade, rollback) leaves it and is counted, with
 * the floor it went below and the table it made live, and logged.
 */
void next_floor(const struct state *st, struct floor *f, __u64 epoch, __u64 version,
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
enum rule version_rule(const struct state *st, const struct table *t, const char *allow,
		       __u64 max_step)
{
	__u64 e = t->man.epoch, v = t->man.version, ne = 0, nv = 0, step = max_step;
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
