// SPDX-License-Identifier: (LGPL-2.1 OR BSD-2-Clause)
/*
 * ccs-loadgen - connection accept-rate load for bench/kernel.py.
 *
 *   ccs-loadgen --cgroup PATH --enforced-port P1 --plain-port P2 [--seconds S] [--rounds R]
 *               [--net N] [--plain-net N] [--batch B]
 *
 * Creates the P1 listener inside the cgroup (so the sock_ops enforcer runs on its connections)
 * and the P2 listener outside it, then alternates R rounds of S seconds of
 * connect/accept/close on each, from source addresses 127.N.x.y (x, y rotating; SO_LINGER 0 so
 * no TIME_WAIT piles up); --plain-net gives the plain side sources of its own (127.M.x.y: a
 * per-route CC on the enforced side's sources then leaves the plain side as it is). Prints one JSON object: connections per second per round and side.
 * Up to 512 rounds. --batch B interleaves the two sides within each round, B connections at a
 * time, each batch timed (so both sides see the same background load on a shared machine).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int move_to(const char *cgroup)
{
	char p[4096];
	FILE *f;

	snprintf(p, sizeof(p), "%s/cgroup.procs", cgroup);
	f = fopen(p, "w");
	if (!f)
		return -1;
	fprintf(f, "%d\n", getpid());
	return fclose(f);
}

static int make_listener(int port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);

	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1024)) {
		perror("listener");
		exit(1);
	}
	return fd;
}

/* `count` connect/accept/close on one listener; 0, or -1 on a failure */
static int batch(int lfd, int port, int net, int count, unsigned *ctr)
{
	struct sockaddr_in dst = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct linger lg = { 1, 0 };

	dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	{
		for (int i = 0; i < count; i++) {
			struct sockaddr_in src = { .sin_family = AF_INET };
			unsigned c = (*ctr)++;
			int fd = socket(AF_INET, SOCK_STREAM, 0), afd;

			src.sin_addr.s_addr = htonl((127u << 24) | ((unsigned)net << 16) |
						    ((c >> 8) & 0xff) << 8 | (1 + c % 254));
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			if (bind(fd, (struct sockaddr *)&src, sizeof(src)) ||
			    connect(fd, (struct sockaddr *)&dst, sizeof(dst))) {
				perror("connect");
				return -1;
			}
			afd = accept(lfd, NULL, NULL);
			if (afd < 0) {
				perror("accept");
				return -1;
			}
			close(afd);
			close(fd);
		}
	}
	return 0;
}

/* returns connections per second over about `secs` (the time actually taken); -1 on a failure */
static double run(int lfd, int port, int net, double secs, unsigned *ctr)
{
	double start = now_s(), end = start + secs, t;
	long n = 0;

	while (now_s() < end) {
		if (batch(lfd, port, net, 64, ctr))
			return -1;
		n += 64;
	}
	t = now_s() - start;
	return t > 0 ? n / t : 0;
}

/*
 * --batch B: within each round of `secs`, alternate batches of B connections between the two
 * listeners (which side goes first alternates too) and time each batch, so that both sides see
 * the same background load; *a, *b: connections per second of side 1 and side 2.
 */
static int run_interleaved(int lf1, int p1, int lf2, int p2, int net, int net2, double secs,
			   int B, unsigned *ctr, double *a, double *b)
{
	double end = now_s() + secs, t1 = 0, t2 = 0, t;
	long n1 = 0, n2 = 0;
	int k = 0;

	while (now_s() < end) {
		for (int j = 0; j < 2; j++, k++) {
			int one = (k & 2) ? !j : j;	/* order: 1 2 2 1 1 2 2 1 ... */

			t = now_s();
			if (batch(one ? lf1 : lf2, one ? p1 : p2, one ? net : net2, B, ctr))
				return -1;
			t = now_s() - t;
			if (one) {
				t1 += t;
				n1 += B;
			} else {
				t2 += t;
				n2 += B;
			}
		}
	}
	*a = t1 > 0 ? n1 / t1 : 0;
	*b = t2 > 0 ? n2 / t2 : 0;
	return 0;
}

int main(int argc, char **argv)
{
	const char *cgroup = NULL;
	int p1 = 0, p2 = 0, rounds = 3, net = 90, pnet = -1, lf1, lf2, r, B = 0;
	double secs = 2.0;
	unsigned ctr = 0;
	static const struct option opts[] = {
		{ "cgroup", required_argument, NULL, 'c' },
		{ "enforced-port", required_argument, NULL, 'e' },
		{ "plain-port", required_argument, NULL, 'p' },
		{ "seconds", required_argument, NULL, 's' },
		{ "rounds", required_argument, NULL, 'r' },
		{ "net", required_argument, NULL, 'n' },
		{ "batch", required_argument, NULL, 'b' },
		{ "plain-net", required_argument, NULL, 'm' },
		{},
	};
	int c;

	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'c': cgroup = optarg; break;
		case 'e': p1 = atoi(optarg); break;
		case 'p': p2 = atoi(optarg); break;
		case 's': secs = atof(optarg); break;
		case 'r': rounds = atoi(optarg); break;
		case 'n': net = atoi(optarg); break;
		case 'b': B = atoi(optarg); break;
		case 'm': pnet = atoi(optarg); break;
		default: return 2;
		}
	}
	if (pnet < 0)
		pnet = net;
	if (!cgroup || !p1 || !p2) {
		fprintf(stderr, "usage: ccs-loadgen --cgroup PATH --enforced-port P1 --plain-port P2\n");
		return 2;
	}
	{
		/* remember where we were, go into the cgroup for the enforced listener, come back */
		char back[4096] = "/sys/fs/cgroup/unified", line[4096];
		FILE *f = fopen("/proc/self/cgroup", "r");

		while (f && fgets(line, sizeof(line), f))
			if (!strncmp(line, "0::", 3)) {
				line[strcspn(line, "\n")] = 0;
				snprintf(back, sizeof(back), "/sys/fs/cgroup/unified%s", line + 3);
			}
		if (f)
			fclose(f);
		if (move_to(cgroup)) {
			perror("cgroup");
			return 1;
		}
		lf1 = make_listener(p1);
		if (move_to(back)) {
			perror("cgroup back");
			return 1;
		}
		lf2 = make_listener(p2);
	}
	printf("{\"seconds\": %g, \"enforced_cps\": [", secs);
	{
		double e[512], p[512];

		if (rounds > 512)
			rounds = 512;
		for (r = 0; r < rounds; r++) {
			double a, b;

			if (B > 0) {
				if (run_interleaved(lf1, p1, lf2, p2, net, pnet, secs, B, &ctr, &b, &a))
					return 1;
			} else if (r % 2) {
				/* alternate which side goes first, so warm-up favours neither */
				b = run(lf1, p1, net, secs, &ctr);
				a = run(lf2, p2, pnet, secs, &ctr);
			} else {
				a = run(lf2, p2, pnet, secs, &ctr);
				b = run(lf1, p1, net, secs, &ctr);
			}

			if (a < 0 || b < 0)
				return 1;
			p[r] = a;
			e[r] = b;
		}
		for (r = 0; r < rounds; r++)
			printf("%s%.1f", r ? ", " : "", e[r]);
		printf("], \"plain_cps\": [");
		for (r = 0; r < rounds; r++)
			printf("%s%.1f", r ? ", " : "", p[r]);
		printf("]}\n");
	}
	close(lf1);
	close(lf2);
	return 0;
}
