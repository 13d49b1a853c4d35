/*
 * A GPU monitor that uses NVML alone, as nvidia-smi, DCGM exporters and pynvml loops do: no libcuda,
 * no CUDA state, yet NVIDIA device files open (NVML opens them at nvmlInit). It polls the device count
 * every 100 ms and counts the polls in the file given as its argument.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: nvml_monitor STATE_FILE\n");
		return 2;
	}
	void *nvml = dlopen("libnvidia-ml.so.1", RTLD_NOW);
	if (!nvml) {
		fprintf(stderr, "nvml_monitor: %s\n", dlerror());
		return 1;
	}
	int (*init)(void) = (int (*)(void))dlsym(nvml, "nvmlInit_v2");
	int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(nvml, "nvmlDeviceGetCount_v2");
	if (!init || !count || init() != 0) {
		fprintf(stderr, "nvml_monitor: nvmlInit_v2 failed\n");
		return 1;
	}
	for (unsigned long polls = 1;; polls++) {
		unsigned n = 0;
		if (count(&n) != 0)
			return 1;
		FILE *f = fopen(argv[1], "w");
		if (f) {
			fprintf(f, "%lu %u\n", polls, n);
			fclose(f);
		}
		usleep(100000);
	}
}
