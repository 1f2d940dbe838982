// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * attach.c - attach, detach, policy: the sock_ops program (from the skeleton) on the cgroup,
 * its maps and link pinned under the pin dir, and the services of the config in ccs_policy
 * (written as a diff: a port that stays served is never touched).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <linux/magic.h>
#include <bpf/bpf.h>
#include <bpf/libbpf.h>

#include "agent.h"
#include "ccs.skel.h"

/* enum ccs_cc_id of net.ipv4.tcp_congestion_control: 0 unknown, 0xff none of ours */
static __u8 sysctl_cc_id(void)
{
	char name[32] = "";
	FILE *f = fopen("/proc/sys/net/ipv4/tcp_congestion_control", "r");

	if (!f)
		return 0;
	if (!fgets(name, sizeof(name), f))
		name[0] = 0;
	fclose(f);
	name[strcspn(name, "\n")] = 0;
	if (!name[0])
		return 0;
	if (!strcmp(name, "cubic"))
		return CCS_CC_CUBIC;
	if (!strcmp(name, "bbr"))
		return CCS_CC_BBR;
	if (!strcmp(name, "reno"))
		return CCS_CC_RENO;
	return 0xff;
}

static int ensure_bpffs(void)
{
	struct statfs st;

	if (statfs("/sys/fs/bpf", &st) == 0 && st.f_type == BPF_FS_MAGIC)
		return 0;
	if (mount("bpf", "/sys/fs/bpf", "bpf", 0, NULL)) {
		print_error("mount bpffs on /sys/fs/bpf: %s", strerror(errno));
		return -1;
	}
	return 0;
}

/*
 * ccs_svc_counters' slots count for a port (a service id is 1 + the service's index in the
 * config): a slot whose port changes (a service added, removed, moved or reordered) starts from
 * zero, so that no service's counters go on with another port's counts. cur: ccs_policy now.
 */
static int reset_moved_slots(const struct config *cfg, const struct ccs_policy *cur, __u32 n)
{
	unsigned before[CCS_SVC_SLOTS] = {}, after[CCS_SVC_SLOTS] = {};
	int fd = open_pinned(cfg->pin_dir, "ccs_svc_counters"), err = 0;
	int ncpu = libbpf_num_possible_cpus();
	struct ccs_svc_counters *zero;
	__u32 port, id;

	if (fd < 0)
		return 0;	/* a program from before the map: nothing counted per service */
	zero = calloc(ncpu > 0 ? ncpu : 1, sizeof(*zero));
	if (!zero) {
		close(fd);
		return -ENOMEM;
	}
	for (port = 0; port < n; port++)
		if (cur[port].served && cur[port].service_id < CCS_SVC_SLOTS)
			before[cur[port].service_id] = port;
	for (id = 1; id <= (__u32)cfg->n_services; id++)
		after[id] = cfg->services[id - 1].port;
	for (id = 1; id < CCS_SVC_SLOTS && !err; id++)
		if (before[id] != after[id] && bpf_map_update_elem(fd, &id, zero, BPF_ANY))
			err = -errno;
	free(zero);
	close(fd);
	return err;
}

/*
 * The config's services into ccs_policy as a diff against what the map holds: only ports whose
 * entry changes are written, services that are (still) served first, then the ports no longer
 * served are cleared. A port served before and after is never written, so re-applying the policy
 * (policy, attach, an agent restart) leaves no moment where it is not enforced. Each write is
 * one element. *changed: the number of ports written.
 */
static int apply_policy(const struct config *cfg, int policy_fd, int *changed)
{
	const __u32 n = 65536;
	struct ccs_policy *cur = calloc(n, sizeof(*cur)), *want = calloc(n, sizeof(*want));
	__u32 *keys = calloc(n, sizeof(*keys)), count = n, out_batch = 0, port;
	LIBBPF_OPTS(bpf_map_batch_opts, bopts);
	int i, pass, err = 0;

	*changed = 0;
	if (!cur || !want || !keys) {
		err = -ENOMEM;
		goto out;
	}
	/* what the map holds: one batch read (the whole array), else element by element */
	if (bpf_map_lookup_batch(policy_fd, NULL, &out_batch, keys, cur, &count, &bopts) &&
	    errno != ENOENT) {
		count = 0;
	}
	if (count != n) {
		for (port = 0; port < n; port++) {
			if (bpf_map_lookup_elem(policy_fd, &port, &cur[port])) {
				err = -errno;
				goto out;
			}
		}
	} else {
		/* the batch came back in key order for an array, but do not rely on it */
		struct ccs_policy *tmp = calloc(n, sizeof(*tmp));

		if (!tmp) {
			err = -ENOMEM;
			goto out;
		}
		for (i = 0; i < (int)n; i++)
			tmp[keys[i] % n] = cur[i];
		memcpy(cur, tmp, n * sizeof(*cur));
		free(tmp);
	}
	for (i = 0; i < cfg->n_services; i++) {
		port = cfg->services[i].port;
		want[port] = (struct ccs_policy){ .served = 1, .ab = cfg->services[i].ab,
						  .caps = cfg->services[i].caps,
						  .flow_mode = cfg->services[i].flow_mode,
						  .service_id = i + 1 };
	}
	err = reset_moved_slots(cfg, cur, n);
	if (err)
		goto out;
	for (pass = 0; pass < 2; pass++) {
		for (port = 0; port < n; port++) {
			if (!memcmp(&cur[port], &want[port], sizeof(want[port])))
				continue;
			if ((pass == 0) != (want[port].served != 0))
				continue;
			if (bpf_map_update_elem(policy_fd, &port, &want[port], BPF_ANY)) {
				err = -errno;
				goto out;
			}
			(*changed)++;
		}
	}
out:
	free(cur);
	free(want);
	free(keys);
	return err;
}

/* open the skeleton with its maps pinned (reused) under the pin dir, set the tunables, load */
static int open_and_load(const struct config *cfg, struct ccs_bpf **skelp)
{
	LIBBPF_OPTS(bpf_object_open_opts, oopts, .pin_root_path = cfg->pin_dir);
	struct ccs_bpf *skel;
	__u64 thresh;
	int err, changed;

	*skelp = skel = ccs_bpf__open_opts(&oopts);
	if (!skel) {
		err = errno ? -errno : -ENOMEM;
		print_error("open BPF object: %s", strerror(-err));
		return err;
	}
	if (cfg->sample_rate <= 0)
		thresh = 0;
	else if (cfg->sample_rate >= 1)
		thresh = 1ull << 32;
	else
		thresh = (__u64)(cfg->sample_rate * 4294967296.0);
	skel->rodata->sample_thresh = thresh;
	skel->rodata->default_cc_id = sysctl_cc_id();
	/* route CCs on by default where the namespace can carry them (routes.c resolve) */
	if (cfg->route_ccs == ROUTE_CCS_ON && !routes_enabled(cfg)) {
		print_error("attach: route_ccs: on, but this namespace cannot carry them: %s", routes_why(cfg));
		ccs_bpf__destroy(skel);
		*skelp = NULL;
		return -EOPNOTSUPP;
	}
	if (cfg->route_ccs == ROUTE_CCS_AUTO && routes_why(cfg)[0])
		fprintf(stderr, "ccs-edge: attach: route CCs %s: %s%s\n",
			routes_enabled(cfg) ? "on for one family only" : "off",
			routes_why(cfg), routes_enabled(cfg) ? "" : " (the program switches every connection)");
	skel->rodata->cc_routes = routes_enabled(cfg);
	/* the mark of the agent's ip rule: only this cgroup's listeners' connections see its routes */
	skel->rodata->route_mark = routes_mark(cfg);
	skel->rodata->mark_cgroup_id = cgroup_id_of(cfg->cgroup);
	/* the iterator that marks the listeners already listening: loaded only with route CCs on */
	bpf_program__set_autoload(skel->progs.ccs_mark_listeners, routes_enabled(cfg));
	err = ccs_bpf__load(skel);
	if (!err && !routes_enabled(cfg))
		routes_flush(cfg); /* route CCs turned off: none of ours may outlive them */
	if (err) {
		print_error("load BPF object: %s", strerror(-err));
		return err;
	}
	err = apply_policy(cfg, bpf_map__fd(skel->maps.ccs_policy), &changed);
	if (err)
		print_error("policy: %s", strerror(-err));
	return err;
}

/* a new link on the cgroup (created if missing), pinned at lp */
static int attach_new(const struct config *cfg, struct ccs_bpf *skel, const char *lp)
{
	struct bpf_link *link = NULL;
	int cg_fd = -1, err = 0;

	if (mkdir(cfg->cgroup, 0755) && errno != EEXIST) {
		err = -errno;
		print_error("create cgroup %s: %s", cfg->cgroup, strerror(-err));
		goto cleanup;
	}
	cg_fd = open(cfg->cgroup, O_RDONLY | O_DIRECTORY);
	if (cg_fd < 0) {
		err = -errno;
		print_error("open cgroup %s: %s", cfg->cgroup, strerror(-err));
		goto cleanup;
	}
	link = bpf_program__attach_cgroup(skel->progs.ccs_sockops, cg_fd);
	if (!link) {
		err = -errno;
		print_error("attach to %s: %s", cfg->cgroup, strerror(-err));
		goto cleanup;
	}
	unlink(lp);  /* a pin left by an attach that died before its rename */
	err = bpf_link__pin(link, lp);
	if (err)
		print_error("pin link %s: %s", lp, strerror(-err));
cleanup:
	if (link) {
		if (!err)
			bpf_link__disconnect(link); /* the pinned link keeps it attached */
		bpf_link__destroy(link);
	}
	if (cg_fd >= 0)
		close(cg_fd);
	return err;
}

/*
 * Route CCs: mark the cgroup's listeners that were listening before this attach (the program
 * marks a listener at TCP_LISTEN_CB, which came before it for them): one pass of the iterator
 * ccs_mark_listeners over this network namespace's TCP sockets. Its output is the port of each
 * listener it marked. A failure is said, not fatal: an unmarked listener's connections are
 * switched by the program, as with route CCs off. -> listeners marked, or -1.
 */
static int mark_existing(struct ccs_bpf *skel)
{
	struct bpf_link *link;
	__u16 ports[256];
	ssize_t n;
	int fd, marked = 0;

	link = bpf_program__attach_iter(skel->progs.ccs_mark_listeners, NULL);
	if (!link) {
		fprintf(stderr, "ccs-edge: attach: route CCs: the listeners already listening stay "
			"unmarked (iter/tcp: %s); the program switches their connections\n",
			strerror(errno));
		return -1;
	}
	fd = bpf_iter_create(bpf_link__fd(link));
	if (fd < 0) {
		fprintf(stderr, "ccs-edge: attach: route CCs: iterator: %s\n", strerror(errno));
		bpf_link__destroy(link);
		return -1;
	}
	while ((n = read(fd, ports, sizeof(ports))) > 0)
		marked += (int)(n / (ssize_t)sizeof(ports[0]));
	if (n < 0)
		fprintf(stderr, "ccs-edge: attach: route CCs: iterator read: %s\n", strerror(errno));
	close(fd);
	bpf_link__destroy(link);
	return n < 0 ? -1 : marked;
}

/*
 * attach: load the program with the pinned maps (tables, counters kept), apply the policy as a
 * diff, then, by the state of the pinned link against the configured cgroup as it is now:
 *   none       a new link on the cgroup, pinned;
 *   ok         the program replaced in place on the link (no gap in enforcement);
 *   severed    the link's cgroup was removed (a service restart recreates it): a new link on the
 *              cgroup now at that path, pinned over the dead one;
 *   elsewhere  attached to another cgroup than the one asked for: a new link on the asked one,
 *              pinned over the old, then the old one detached (the program moves).
 */
int cmd_attach(const struct config *cfg)
{
	struct ccs_bpf *skel = NULL;
	struct link_state ls = { .fd = -1 };
	char lp[PATH_MAX], tmp[PATH_MAX];
	int lock_fd = -1, err = 0;

	if (!cfg->cgroup[0]) {
		print_error("attach: no cgroup (--cgroup or config cgroup:)");
		return 1;
	}
	if (ensure_bpffs())
		return 1;
	if (mkdir(cfg->pin_dir, 0700) && errno != EEXIST) {
		print_error("mkdir %s: %s", cfg->pin_dir, strerror(errno));
		return 1;
	}
	lock_fd = lock_pin_dir(cfg->pin_dir);
	if (lock_fd < 0) {
		err = lock_fd;
		print_error("lock %s: %s", cfg->pin_dir, strerror(-err));
		goto cleanup;
	}
	err = open_and_load(cfg, &skel);
	if (err)
		goto cleanup;
	pin_path(cfg->pin_dir, lp, sizeof(lp), "link");
	link_state(cfg, &ls);
	if (ls.fd < 0) {
		err = attach_new(cfg, skel, lp);
		if (!err)
			printf("attached to %s, pinned under %s (sample rate %g)\n", cfg->cgroup,
			       cfg->pin_dir, cfg->sample_rate);
		goto cleanup;
	}
	if (ls.attached) {
		/* already attached here: replace the program in place, no gap in enforcement */
		if (bpf_link_update(ls.fd, bpf_program__fd(skel->progs.ccs_sockops), NULL)) {
			err = -errno;
			print_error("replace program in %s: %s", lp, strerror(-err));
			goto cleanup;
		}
		printf("replaced program on existing link %s (cgroup %s)\n", lp, cfg->cgroup);
		goto cleanup;
	}
	/* severed or elsewhere: a new link where it belongs, pinned over the old one (rename is
	 * atomic on bpffs: the pin always names a link), then the old one leaves its cgroup */
	snprintf(tmp, sizeof(tmp), "%s_new", lp);  /* bpffs refuses a dot in a name */
	err = attach_new(cfg, skel, tmp);
	if (err)
		goto cleanup;
	if (rename(tmp, lp)) {
		err = -errno;
		print_error("rename %s to %s: %s", tmp, lp, strerror(-err));
		unlink(tmp);
		goto cleanup;
	}
	if (!strcmp(ls.state, "severed")) {
		printf("re-attached to %s (cgroup id %llu): the pinned link was severed, its cgroup "
		       "was removed or recreated\n", cfg->cgroup,
		       (unsigned long long)cgroup_id_of(cfg->cgroup));
	} else {
		if (bpf_link_detach(ls.fd) && errno != EINVAL && errno != ENOLINK)
			print_error("detach the old link (cgroup id %llu): %s",
				(unsigned long long)ls.cgroup_id, strerror(errno));
		printf("moved to %s (cgroup id %llu) from cgroup id %llu\n", cfg->cgroup,
		       (unsigned long long)cgroup_id_of(cfg->cgroup), (unsigned long long)ls.cgroup_id);
	}
cleanup:
	if (!err && skel && routes_enabled(cfg)) {
		int m = mark_existing(skel);

		if (m >= 0)
			printf("route CCs on (table %s, mark 0x%x): %d listener%s already listening marked\n",
			       routes_table(cfg), routes_mark(cfg), m, m == 1 ? "" : "s");
	}
	if (ls.fd >= 0)
		close(ls.fd);
	ccs_bpf__destroy(skel);
	if (lock_fd >= 0)
		close(lock_fd);
	return err ? 1 : 0;
}

int cmd_detach(const struct config *cfg, bool purge)
{
	char p[PATH_MAX];
	int fd, err = 0;
	DIR *d;
	struct dirent *de;

	/*
	 * 1. route CCs first: without the program they would be enforcement without its checks. If
	 * they cannot be flushed the program stays (it corrects every connection a route gets
	 * wrong) and detach fails, naming the step. With route CCs off none should exist: a failed
	 * flush is only said.
	 */
	if (routes_flush(cfg)) {
		if (routes_enabled(cfg)) {
			print_error("detach: step 1 (flush the route CCs) failed: the program stays attached "
				"(it corrects the routes' CCs); nothing detached");
			return 1;
		}
		fprintf(stderr, "ccs-edge: detach: route CCs are off, but the flush of any left failed\n");
	}
	/* 2. the link */
	fd = open_pinned(cfg->pin_dir, "link");
	if (fd >= 0) {
		if (bpf_link_detach(fd) && errno != EINVAL && errno != ENOLINK)
			fprintf(stderr, "ccs-edge: link detach: %s\n", strerror(errno));
		close(fd);
		pin_path(cfg->pin_dir, p, sizeof(p), "link");
		unlink(p);
	}
	if (!purge)
		return err;
	d = opendir(cfg->pin_dir);
	if (!d)
		return errno == ENOENT ? 0 : 1;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.')
			continue;
		pin_path(cfg->pin_dir, p, sizeof(p), de->d_name);
		if (unlink(p)) {
			fprintf(stderr, "ccs-edge: unlink %s: %s\n", p, strerror(errno));
			err = 1;
		}
	}
	closedir(d);
	if (rmdir(cfg->pin_dir) && errno != ENOENT)
		err = 1;
	return err;
}

int cmd_policy(const struct config *cfg)
{
	int fd = open_pinned(cfg->pin_dir, "ccs_policy"), lock_fd, err, changed = 0;

	if (fd < 0) {
		print_error("not attached (no %s/ccs_policy)", cfg->pin_dir);
		return 1;
	}
	lock_fd = lock_pin_dir(cfg->pin_dir);
	err = apply_policy(cfg, fd, &changed);
	close(fd);
	if (lock_fd >= 0)
		close(lock_fd);
	if (err) {
		print_error("policy: %s", strerror(-err));
		return 1;
	}
	printf("policy: %d services, %d ports changed\n", cfg->n_services, changed);
	return 0;
}
