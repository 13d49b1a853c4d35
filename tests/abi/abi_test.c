/* Loads the built plugin the way CRIU does and checks its descriptor against CRIU's plugin ABI. */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <criu/criu-plugin.h>

static int failures;

#define CHECK(cond, ...)                                       \
	do {                                                   \
		if (!(cond)) {                                 \
			fprintf(stderr, "FAIL %s: ", #cond);   \
			fprintf(stderr, __VA_ARGS__);          \
			fputc('\n', stderr);                   \
			failures++;                            \
		}                                              \
	} while (0)

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: %s path/to/cuda_plugin.so\n", argv[0]);
		return 2;
	}
	/* RTLD_NOW: every symbol the plugin needs must resolve without CRIU around it. */
	void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		fprintf(stderr, "FAIL dlopen: %s\n", dlerror());
		return 1;
	}
	cr_plugin_desc_t *d = dlsym(h, "CR_PLUGIN_DESC");
	CHECK(d != NULL, "no CR_PLUGIN_DESC");
	if (!d)
		return 1;
	CHECK(strcmp(d->name, "cuda_plugin") == 0, "name is '%s'", d->name);
	CHECK(d->version == CRIU_PLUGIN_VERSION, "version %#x, CRIU's header says %#x", d->version, CRIU_PLUGIN_VERSION);
	/* CRIU 4.0/4.1 reject max_hooks > 12 ("Corrupted plugin"). */
	CHECK(d->max_hooks == 12, "max_hooks is %u; CRIU 4.0 and 4.1 accept at most 12", d->max_hooks);
	CHECK(d->init != NULL && d->exit != NULL, "init/exit missing");
	for (unsigned i = 0; i < CR_PLUGIN_HOOK__MAX; i++) {
		int ours = i == CR_PLUGIN_HOOK__PAUSE_DEVICES || i == CR_PLUGIN_HOOK__CHECKPOINT_DEVICES ||
			   i == CR_PLUGIN_HOOK__RESUME_DEVICES_LATE || i == CR_PLUGIN_HOOK__DUMP_EXT_FILE ||
			   i == CR_PLUGIN_HOOK__RESTORE_EXT_FILE || i == CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA ||
			   i == CR_PLUGIN_HOOK__UPDATE_VMA_MAP;
		CHECK(!d->hooks[i] == !ours, "hook %u is %s", i, d->hooks[i] ? "set" : "unset");
	}
	/* Outside CRIU, init must fail cleanly (no criu_get_image_dir), never crash. */
	CHECK(d->init(CR_PLUGIN_STAGE__DUMP) != 0, "init outside CRIU succeeded");
	/* Hooks called without init answer "not mine". */
	int (*pause)(int) = (int (*)(int))d->hooks[CR_PLUGIN_HOOK__PAUSE_DEVICES];
	CHECK(pause(1) == -95 /* -ENOTSUP */, "PAUSE_DEVICES without init returned %d", pause(1));
	/* The hooks for what forked children inherited from the driver leave everything else to others. */
	unsetenv("FAKEGPU_DIR");
	int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
	struct stat st;
	CHECK(null_fd >= 0 && fstat(null_fd, &st) == 0, "cannot open /dev/null");
	CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA_t *vma = (CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA_t *)d->hooks[CR_PLUGIN_HOOK__HANDLE_DEVICE_VMA];
	CR_PLUGIN_HOOK__DUMP_EXT_FILE_t *dump_file = (CR_PLUGIN_HOOK__DUMP_EXT_FILE_t *)d->hooks[CR_PLUGIN_HOOK__DUMP_EXT_FILE];
	CR_PLUGIN_HOOK__RESTORE_EXT_FILE_t *restore_file =
		(CR_PLUGIN_HOOK__RESTORE_EXT_FILE_t *)d->hooks[CR_PLUGIN_HOOK__RESTORE_EXT_FILE];
	CR_PLUGIN_HOOK__UPDATE_VMA_MAP_t *update = (CR_PLUGIN_HOOK__UPDATE_VMA_MAP_t *)d->hooks[CR_PLUGIN_HOOK__UPDATE_VMA_MAP];
	uint64_t pgoff = 0;
	int plugin_fd = -1;
	CHECK(vma(null_fd, &st) == -95, "HANDLE_DEVICE_VMA claimed /dev/null");
	CHECK(dump_file(null_fd, 1) == -95, "DUMP_EXT_FILE without init claimed a file");
	CHECK(restore_file(1) == -95, "RESTORE_EXT_FILE without init answered");
	CHECK(update("/dev/nvidia0", 0x200600000, 0, &pgoff, &plugin_fd) == -95 && plugin_fd == -1,
	      "UPDATE_VMA_MAP without init answered");
	close(null_fd);
	d->exit(CR_PLUGIN_STAGE__DUMP, 0);
	dlclose(h);
	if (failures)
		return 1;
	printf("descriptor ok: %s version %#x max_hooks %u\n", d->name, CRIU_PLUGIN_VERSION, 12u);
	return 0;
}
