// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/* util.c - messages, clocks, files, JSON strings, pinned objects, the link's state, the pin-dir lock. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <bpf/bpf.h>

#include "agent.h"

void print_error(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "ccs-edge: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

uint64_t clock_ns(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

void hex(const unsigned char *b, size_t n, char *out)
{
	size_t i;

	for (i = 0; i < n; i++)
		sprintf(out + 2 * i, "%02x", b[i]);
}

/* the whole file, NUL-terminated (the NUL is not counted in *len) */
int read_file(const char *path, unsigned char **buf, size_t *len)
{
	FILE *f = fopen(path, "rb");
	long n;

	*buf = NULL;
	if (!f)
		return -errno;
	if (fseek(f, 0, SEEK_END) || (n = ftell(f)) < 0 || fseek(f, 0, SEEK_SET)) {
		fclose(f);
		return -EIO;
	}
	*buf = malloc(n + 1);
	if (!*buf) {
		fclose(f);
		return -ENOMEM;
	}
	if (n && fread(*buf, 1, n, f) != (size_t)n) {
		free(*buf);
		*buf = NULL;
		fclose(f);
		return -EIO;
	}
	(*buf)[n] = 0;
	*len = n;
	fclose(f);
	return 0;
}

int pin_path(const char *pin_dir, char *buf, size_t n, const char *name)
{
	int r = snprintf(buf, n, "%s/%s", pin_dir, name);

	return r < 0 || (size_t)r >= n ? -ENAMETOOLONG : 0;
}

int open_pinned(const char *pin_dir, const char *name)
{
	char p[PATH_MAX];
	int fd;

	if (pin_path(pin_dir, p, sizeof(p), name))
		return -ENAMETOOLONG;
	fd = bpf_obj_get(p);
	if (fd < 0)
		return -errno;
	return fd;
}

/* serialises load / rollback / attach between agent processes */
int lock_pin_dir(const char *pin_dir)
{
	int fd = open(pin_dir, O_RDONLY | O_DIRECTORY);

	if (fd < 0)
		return -errno;
	if (flock(fd, LOCK_EX)) {
		close(fd);
		return -errno;
	}
	return fd;
}

/* s as a JSON string (quotes included): quotes, backslashes and control characters escaped */
void json_str(FILE *o, const char *s)
{
	fputc('"', o);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fprintf(o, "\\%c", *s);
		else if ((unsigned char)*s < 0x20 || *s == 0x7f)
			fprintf(o, "\\u%04x", (unsigned char)*s);
		else
			fputc(*s, o);
	}
	fputc('"', o);
}

/* the same into out (n bytes, NUL-terminated; the quotes are not included); -1 if it does not fit */
int json_escape(char *out, size_t n, const char *s)
{
	size_t k = 0;

	for (; *s; s++) {
		char t[8];
		int m;

		if (*s == '"' || *s == '\\')
			m = snprintf(t, sizeof(t), "\\%c", *s);
		else if ((unsigned char)*s < 0x20 || *s == 0x7f)
			m = snprintf(t, sizeof(t), "\\u%04x", (unsigned char)*s);
		else
			m = snprintf(t, sizeof(t), "%c", *s);
		if (k + m >= n)
			return -1;
		memcpy(out + k, t, m);
		k += m;
	}
	out[k] = 0;
	return 0;
}

/*
 * The id of the cgroup (v2) at path as it is now: the kernfs node id, what a cgroup link reports
 * (bpf_link_info.cgroup.cgroup_id); 0 when the path does not exist. A cgroup removed and made
 * again under the same path has a new id.
 */
__u64 cgroup_id_of(const char *path)
{
	struct {
		struct file_handle fh;
		__u64 id;
	} h = { .fh.handle_bytes = sizeof(__u64) };
	int mount_id;
	struct stat st;

	if (!path || !*path)
		return 0;
	if (!name_to_handle_at(AT_FDCWD, path, &h.fh, &mount_id, 0) && h.fh.handle_bytes == 8)
		return h.id;
	if (!stat(path, &st) && S_ISDIR(st.st_mode))
		return st.st_ino;
	return 0;
}

/*
 * The pinned link against the configured cgroup (cfg->cgroup): is the program attached to the
 * cgroup that is there now? ls->fd stays open for the caller (-1 when there is no pinned link).
 */
void link_state(const struct config *cfg, struct link_state *ls)
{
	struct bpf_link_info info = {};
	__u32 len = sizeof(info);

	memset(ls, 0, sizeof(*ls));
	ls->fd = open_pinned(cfg->pin_dir, "link");
	ls->path_id = cgroup_id_of(cfg->cgroup);
	if (ls->fd < 0) {
		ls->state = "none";
		return;
	}
	if (bpf_obj_get_info_by_fd(ls->fd, &info, &len)) {
		ls->state = "unreadable";
		return;
	}
	ls->link_id = info.id;
	ls->prog_id = info.prog_id;
	ls->cgroup_id = info.cgroup.cgroup_id;
	if (!ls->cgroup_id) {
		ls->state = "severed";   /* its cgroup was removed: the program runs nowhere */
	} else if (cfg->cgroup[0] && ls->cgroup_id != ls->path_id) {
		ls->state = "elsewhere"; /* attached, but not to the configured cgroup as it is now */
	} else {
		ls->state = "ok";
		ls->attached = true;
	}
}
