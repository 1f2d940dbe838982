// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * floor.c - the version rule's floor, kept on disk: the (epoch, version) and sha256 of the newest
 * table made live here, and the overrides. It lives in <state_dir>/version-floor.json (state_dir:
 * config, default /var/lib/ccs-edge/<the pin dir's name>), outside the pin dir, so that neither
 * `detach --purge` (which unpins every map) nor a reboot (which empties the bpffs) reopens the
 * replay of an older table. The pinned ccs_version map is only its copy for an older status
 * reader; a pin dir from before this file seeds it (epoch 0, the map's highest version).
 *
 * Written whole or not at all: a temporary file beside it, fsync, rename, fsync of the folder.
 * A floor file the agent cannot read or parse stops every load (it never falls back to "no
 * floor": that would be the replay this file exists to stop); the message names the file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cjson/cJSON.h>

#include "agent.h"

#define FLOOR_NAME "version-floor.json"

int floor_path(const char *state_dir, char *buf, size_t n)
{
	if (!state_dir[0]) {
		print_error("no state_dir: the version floor has nowhere to live");
		return -1;
	}
	if ((size_t)snprintf(buf, n, "%s/%s", state_dir, FLOOR_NAME) >= n) {
		print_error("state_dir %s: path too long", state_dir);
		return -1;
	}
	return 0;
}

/* a JSON integer 0..CCS_SERIAL_MAX (cJSON keeps doubles: exact up to 2^53) */
static int get_u(const cJSON *o, const char *k, __u64 *out, const char *path)
{
	const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, k);
	double d;

	if (!cJSON_IsNumber(it)) {
		print_error("version floor %s: field \"%s\" missing or not a number: the file is damaged; "
			"no table loads until it is put right (`ccs-edge floor` shows what it holds)",
			path, k);
		return -1;
	}
	d = it->valuedouble;
	if (d < 0 || d > (double)CCS_SERIAL_MAX || d != (double)(__u64)d) {
		print_error("version floor %s: field \"%s\" = %g is not an integer in 0..%llu", path, k, d,
			(unsigned long long)CCS_SERIAL_MAX);
		return -1;
	}
	*out = (__u64)d;
	return 0;
}

static int unhex(const char *s, __u8 *out, size_t n)
{
	size_t i;
	unsigned v;

	if (strlen(s) != 2 * n)
		return -1;
	for (i = 0; i < n; i++) {
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		out[i] = (__u8)v;
	}
	return 0;
}

int floor_read(const char *state_dir, struct floor *f)
{
	char path[PATH_MAX];
	unsigned char *buf = NULL;
	size_t len = 0;
	cJSON *root = NULL;
	const cJSON *sha;
	int err = -1, rc;

	memset(f, 0, sizeof(*f));
	if (floor_path(state_dir, path, sizeof(path)))
		return -1;
	rc = read_file(path, &buf, &len);
	if (rc) {
		if (rc == -ENOENT)
			return 0;          /* no floor yet */
		print_error("version floor %s: %s (no table loads without it)", path, strerror(-rc));
		return -1;
	}
	root = cJSON_ParseWithLength((const char *)buf, len);
	if (!cJSON_IsObject(root)) {
		print_error("version floor %s is not a JSON object: the file is damaged; no table loads "
			"until it is put right", path);
		goto cleanup;
	}
	if (get_u(root, "epoch", &f->epoch, path) || get_u(root, "version", &f->version, path) ||
	    get_u(root, "updated_unix", &f->updated_unix, path) ||
	    get_u(root, "epoch_since_unix", &f->epoch_since_unix, path) ||
	    get_u(root, "overrides", &f->overrides, path) ||
	    get_u(root, "override_unix", &f->override_unix, path) ||
	    get_u(root, "override_from_epoch", &f->override_from_epoch, path) ||
	    get_u(root, "override_from", &f->override_from, path) ||
	    get_u(root, "override_to_epoch", &f->override_to_epoch, path) ||
	    get_u(root, "override_to", &f->override_to, path))
		goto cleanup;
	sha = cJSON_GetObjectItemCaseSensitive(root, "sha256");
	if (!cJSON_IsString(sha) || unhex(sha->valuestring, f->sha256, sizeof(f->sha256))) {
		print_error("version floor %s: field \"sha256\" is not 64 hex digits", path);
		goto cleanup;
	}
	f->present = true;
	err = 0;
cleanup:
	cJSON_Delete(root);
	free(buf);
	return err;
}

static int mkdirs(const char *dir)
{
	char p[PATH_MAX], *s;

	snprintf(p, sizeof(p), "%s", dir);
	for (s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = 0;
		if (mkdir(p, 0700) && errno != EEXIST)
			return -1;
		*s = '/';
	}
	return mkdir(p, 0700) && errno != EEXIST ? -1 : 0;
}

int floor_write(const char *state_dir, const struct floor *f)
{
	char path[PATH_MAX], tmp[PATH_MAX + 8], sha[65];
	FILE *o = NULL;
	int fd = -1, dfd = -1, err = -1;

	if (floor_path(state_dir, path, sizeof(path)))
		return -1;
	if (mkdirs(state_dir)) {
		print_error("version floor: create %s: %s", state_dir, strerror(errno));
		return -1;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	hex(f->sha256, sizeof(f->sha256), sha);
	sha[64] = 0;
	fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || !(o = fdopen(fd, "w"))) {
		print_error("version floor: open %s: %s", tmp, strerror(errno));
		goto cleanup;
	}
	fd = -1;
	fprintf(o, "{\"epoch\": %llu, \"version\": %llu, \"sha256\": \"%s\", \"updated_unix\": %llu, "
		"\"epoch_since_unix\": %llu, \"overrides\": %llu, \"override_unix\": %llu, "
		"\"override_from_epoch\": %llu, \"override_from\": %llu, \"override_to_epoch\": %llu, "
		"\"override_to\": %llu}\n", (unsigned long long)f->epoch,
		(unsigned long long)f->version, sha, (unsigned long long)f->updated_unix,
		(unsigned long long)f->epoch_since_unix, (unsigned long long)f->overrides,
		(unsigned long long)f->override_unix, (unsigned long long)f->override_from_epoch,
		(unsigned long long)f->override_from, (unsigned long long)f->override_to_epoch,
		(unsigned long long)f->override_to);
	if (fflush(o) || fsync(fileno(o))) {
		print_error("version floor: write %s: %s", tmp, strerror(errno));
		goto cleanup;
	}
	if (fclose(o)) {
		o = NULL;
		print_error("version floor: close %s: %s", tmp, strerror(errno));
		goto cleanup;
	}
	o = NULL;
	if (rename(tmp, path)) {
		print_error("version floor: rename %s: %s", tmp, strerror(errno));
		goto cleanup;
	}
	dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd)) {
		print_error("version floor: fsync %s: %s", state_dir, strerror(errno));
		goto cleanup;
	}
	err = 0;
cleanup:
	if (o)
		fclose(o);
	if (fd >= 0)
		close(fd);
	if (dfd >= 0)
		close(dfd);
	if (err)
		unlink(tmp);
	return err;
}

/* `ccs-edge floor [--json]`: what the floor file holds (nothing else: no pin dir needed) */
int cmd_floor(const struct config *cfg, bool json)
{
	struct floor f;
	char path[PATH_MAX], sha[65];

	if (floor_path(cfg->state_dir, path, sizeof(path)) || floor_read(cfg->state_dir, &f))
		return 1;
	hex(f.sha256, sizeof(f.sha256), sha);
	sha[64] = 0;
	if (json) {
		printf("{\"path\": ");
		json_str(stdout, path);
		if (!f.present) {
			printf(", \"present\": false}\n");
			return 0;
		}
		printf(", \"present\": true, \"epoch\": %llu, \"version\": %llu, \"sha256\": \"%s\", "
		       "\"updated_unix\": %llu, \"epoch_since_unix\": %llu, \"overrides\": %llu, "
		       "\"version_max_step\": %llu}\n", (unsigned long long)f.epoch,
		       (unsigned long long)f.version, sha, (unsigned long long)f.updated_unix,
		       (unsigned long long)f.epoch_since_unix, (unsigned long long)f.overrides,
		       (unsigned long long)cfg->version_max_step);
	} else if (!f.present) {
		printf("no version floor yet (%s): the first table sets it\n", path);
	} else {
		printf("version floor: epoch %llu, table %llu (sha256 %s), %llu overrides (%s)\n",
		       (unsigned long long)f.epoch, (unsigned long long)f.version, sha,
		       (unsigned long long)f.overrides, path);
	}
	return 0;
}
