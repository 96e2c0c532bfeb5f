// The reference for gpudoc's per-sample cost: a raw C loop calling nvmlDeviceGetMemoryInfo (v1 and v2)
// on GPU 0. Loads NVML with dlopen, so it builds without NVML's headers.
//   cc -O2 -o nvml_loop bench/nvml_loop.c -ldl && ./nvml_loop 200000
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct { unsigned long long total, free, used; } mem_v1;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } mem_v2;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 100000;
    const char *lib = getenv("GPUDOC_NVML_LIB") ? getenv("GPUDOC_NVML_LIB") : "libnvidia-ml.so.1";
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*init)(void) = dlsym(h, "nvmlInit_v2");
    int (*handle)(unsigned, void **) = dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*v1)(void *, mem_v1 *) = dlsym(h, "nvmlDeviceGetMemoryInfo");
    int (*v2)(void *, mem_v2 *) = dlsym(h, "nvmlDeviceGetMemoryInfo_v2");
    void *dev;
    if (init() || handle(0, &dev)) { fprintf(stderr, "nvml init failed\n"); return 1; }
    mem_v1 m1; mem_v2 m2;
    unsigned long long sink = 0;
    for (int i = 0; i < 1000; i++) { v1(dev, &m1); }
    double t0 = now();
    for (long i = 0; i < n; i++) { v1(dev, &m1); sink += m1.used; }
    double t1 = now();
    for (long i = 0; i < n; i++) {
        m2.version = (unsigned)(sizeof(mem_v2) | (2u << 24));
        v2(dev, &m2); sink += m2.used;
    }
    double t2 = now();
    printf("c_v1_ns %.0f\nc_v2_ns %.0f\nsink %llu\n", (t1 - t0) / n * 1e9, (t2 - t1) / n * 1e9, sink & 1);
    return 0;
}
