/* A fake libnvidia-ml.so.1 for Hangar's tests: the NVML calls hangar-gpu makes, answering
 * from a script the test writes: the file `nvml-script` next to this library (found with
 * dladdr), read on every call, so a test changes readings between calls; each line is one of
 *
 *   gpu <index> <used_mib> <total_mib> <name...>
 *   proc <gpu_index> <pid> <used_mib>
 *   fail init        (nvmlInit_v2 answers NVML_ERROR_DRIVER_NOT_LOADED)
 *
 * Device handles are (index + 1) cast to a pointer. Only what NVML's header says of these
 * calls is reproduced: return codes, the INSUFFICIENT_SIZE protocol of the process list, the
 * v2 memory struct. Like the real library, it may be called from several threads at once:
 * every call holds one lock, as the parsed script is shared. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
#define NVML_SUCCESS 0
#define NVML_ERROR_INVALID_ARGUMENT 2
#define NVML_ERROR_INSUFFICIENT_SIZE 7
#define NVML_ERROR_DRIVER_NOT_LOADED 9
#define NVML_ERROR_UNKNOWN 999
#define MIB 1048576ULL

typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
typedef struct { unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId; } nvmlProcessInfo_t;

#define MAX 16
struct gpu { int present; unsigned long long used, total; char name[96]; };
struct proc { unsigned int gpu, pid; unsigned long long used; };
static struct gpu gpus[MAX];
static struct proc procs[64];
static int nprocs, fail_init;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static int load(void) {
    Dl_info self;
    char path[4096], line[256], *slash;
    FILE *f = NULL;
    if (dladdr((void *)&load, &self) && self.dli_fname && strlen(self.dli_fname) < sizeof path - 16) {
        strcpy(path, self.dli_fname);
        slash = strrchr(path, '/');
        strcpy(slash ? slash + 1 : path, "nvml-script");
        f = fopen(path, "r");
    }
    memset(gpus, 0, sizeof gpus);
    nprocs = 0;
    fail_init = 0;
    if (!f) return -1;
    while (fgets(line, sizeof line, f)) {
        unsigned int i, pid;
        unsigned long long used, total;
        int off = 0;
        if (sscanf(line, "gpu %u %llu %llu %n", &i, &used, &total, &off) == 3 && i < MAX) {
            gpus[i].present = 1;
            gpus[i].used = used * MIB;
            gpus[i].total = total * MIB;
            strncpy(gpus[i].name, line + off, sizeof gpus[i].name - 1);
            gpus[i].name[strcspn(gpus[i].name, "\n")] = 0;
        } else if (sscanf(line, "proc %u %u %llu", &i, &pid, &used) == 3 && nprocs < 64) {
            procs[nprocs].gpu = i;
            procs[nprocs].pid = pid;
            procs[nprocs].used = used * MIB;
            nprocs++;
        } else if (strncmp(line, "fail init", 9) == 0) {
            fail_init = 1;
        }
    }
    fclose(f);
    return 0;
}

static int count(void) {
    int n = 0;
    while (n < MAX && gpus[n].present) n++;
    return n;
}

static int index_of(void *device) {
    long i = (long)device - 1;
    return (i >= 0 && i < count()) ? (int)i : -1;
}

static nvmlReturn_t nvmlInit_v2_unlocked(void) {
    if (load() != 0) return NVML_ERROR_UNKNOWN;
    return fail_init ? NVML_ERROR_DRIVER_NOT_LOADED : NVML_SUCCESS;
}

static nvmlReturn_t nvmlShutdown_unlocked(void) { return NVML_SUCCESS; }

const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t nvmlDeviceGetCount_v2_unlocked(unsigned int *n) {
    load();
    *n = (unsigned int)count();
    return NVML_SUCCESS;
}

static nvmlReturn_t nvmlDeviceGetHandleByIndex_v2_unlocked(unsigned int i, void **device) {
    load();
    if ((int)i >= count()) return NVML_ERROR_INVALID_ARGUMENT;
    *device = (void *)(long)(i + 1);
    return NVML_SUCCESS;
}

static nvmlReturn_t nvmlDeviceGetName_unlocked(void *device, char *name, unsigned int length) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(gpus[i].name) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(name, gpus[i].name);
    return NVML_SUCCESS;
}

static nvmlReturn_t nvmlDeviceGetMemoryInfo_v2_unlocked(void *device, nvmlMemory_v2_t *memory) {
    int i = index_of(device);
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    load();
    memory->total = gpus[i].total;
    memory->used = gpus[i].used;
    memory->reserved = 0;
    memory->free = gpus[i].total - gpus[i].used;
    return NVML_SUCCESS;
}

static nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3_unlocked(void *device, unsigned int *n, nvmlProcessInfo_t *out) {
    int i = index_of(device), k, have = 0;
    if (i < 0) return NVML_ERROR_INVALID_ARGUMENT;
    for (k = 0; k < nprocs; k++) have += procs[k].gpu == (unsigned int)i;
    if (out == NULL || *n < (unsigned int)have) {
        *n = (unsigned int)have;
        return have == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    *n = 0;
    for (k = 0; k < nprocs; k++) {
        if (procs[k].gpu != (unsigned int)i) continue;
        out[*n].pid = procs[k].pid;
        out[*n].usedGpuMemory = procs[k].used;
        out[*n].gpuInstanceId = out[*n].computeInstanceId = 0xFFFFFFFF;
        (*n)++;
    }
    return NVML_SUCCESS;
}

/* The exported calls, each under the lock. */
#define LOCKED(call) \
    do { \
        nvmlReturn_t r; \
        pthread_mutex_lock(&lock); \
        r = call; \
        pthread_mutex_unlock(&lock); \
        return r; \
    } while (0)

nvmlReturn_t nvmlInit_v2(void) { LOCKED(nvmlInit_v2_unlocked()); }
nvmlReturn_t nvmlShutdown(void) { LOCKED(nvmlShutdown_unlocked()); }
nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { LOCKED(nvmlDeviceGetCount_v2_unlocked(n)); }
nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **device) { LOCKED(nvmlDeviceGetHandleByIndex_v2_unlocked(i, device)); }
nvmlReturn_t nvmlDeviceGetName(void *device, char *name, unsigned int length) { LOCKED(nvmlDeviceGetName_unlocked(device, name, length)); }
nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void *device, nvmlMemory_v2_t *memory) { LOCKED(nvmlDeviceGetMemoryInfo_v2_unlocked(device, memory)); }
nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void *device, unsigned int *n, nvmlProcessInfo_t *out) { LOCKED(nvmlDeviceGetComputeRunningProcesses_v3_unlocked(device, n, out)); }
