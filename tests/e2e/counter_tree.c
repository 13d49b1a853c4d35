/* A plain (non-CUDA) process tree for end-to-end tests: every process counts in memory and writes its
 * count to STATE.<index> every 10 ms, so a test can tell a restored process (which continues from the
 * saved count) from a restarted one (which would start again at 0).
 *   counter_tree --state FILE [--children K] */
#define _GNU_SOURCE
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void write_state(const char *base, int index, unsigned long count)
{
	char path[4096], tmp[4200];
	snprintf(path, sizeof(path), "%s.%d", base, index);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	FILE *f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "count=%lu\npid=%d\n", count, getpid());
	fclose(f);
	rename(tmp, path);
}

static void count_forever(const char *state, int index)
{
	unsigned long count = 0;
	struct timespec tick = {0, 10 * 1000 * 1000};
	for (;;) {
		write_state(state, index, ++count);
		nanosleep(&tick, NULL);
	}
}

int main(int argc, char **argv)
{
	const char *state = NULL;
	int children = 0;
	static const struct option opts[] = {
		{ "state", required_argument, NULL, 's' },
		{ "children", required_argument, NULL, 'c' },
		{ NULL, 0, NULL, 0 },
	};
	int o, bad = 0;
	while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (o == 's')
			state = optarg;
		else if (o == 'c')
			children = atoi(optarg);
		else
			bad = 1;
	}
	if (bad || optind != argc) {
		fprintf(stderr, "usage: %s --state FILE [--children K]\n", argv[0]);
		return 2;
	}
	if (!state) {
		fprintf(stderr, "counter_tree: --state is required\n");
		return 2;
	}
	for (int k = 1; k <= children; k++) {
		pid_t pid = fork();
		if (pid < 0) {
			perror("counter_tree: fork");
			return 1;
		}
		if (pid == 0)
			count_forever(state, k);
	}
	count_forever(state, 0);
}
