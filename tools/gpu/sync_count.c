/* Counts a program's host synchronisations with the GPU: an LD_PRELOAD shim over the CUDA
 * runtime's blocking calls (step T5 of scripts/gpu_first_run.sh, for when no nsys is there).
 *
 *   gcc -shared -fPIC -O2 -o build-gpu/libsync_count.so tools/gpu/sync_count.c -ldl
 *   SYNC_COUNT_OUT=counts.txt LD_PRELOAD=$PWD/build-gpu/libsync_count.so build-gpu/grass train ...
 *
 * At exit it appends one line to $SYNC_COUNT_OUT (stderr without it):
 *   sync_count: cudaStreamSynchronize N cudaDeviceSynchronize N cudaEventSynchronize N
 *               cudaMemcpy N total N
 * Only calls the program makes through the shared libcudart are seen (grass links it
 * dynamically; the libraries' own internal calls are not counted). Two runs that differ only in
 * their step count give the syncs per step: (total(6 steps) - total(3 steps)) / 3.
 * Declared without the CUDA headers (the handles are pointers, the error an int), so it builds
 * with a plain C compiler. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

static unsigned long n_stream, n_device, n_event, n_memcpy;

static void* next(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) {
    fprintf(stderr, "sync_count: %s not found after the shim\n", name);
    abort();
  }
  return f;
}

int cudaStreamSynchronize(void* stream) {
  static int (*real)(void*);
  if (!real) real = (int (*)(void*))next("cudaStreamSynchronize");
  __atomic_add_fetch(&n_stream, 1, __ATOMIC_RELAXED);
  return real(stream);
}

int cudaDeviceSynchronize(void) {
  static int (*real)(void);
  if (!real) real = (int (*)(void))next("cudaDeviceSynchronize");
  __atomic_add_fetch(&n_device, 1, __ATOMIC_RELAXED);
  return real();
}

int cudaEventSynchronize(void* event) {
  static int (*real)(void*);
  if (!real) real = (int (*)(void*))next("cudaEventSynchronize");
  __atomic_add_fetch(&n_event, 1, __ATOMIC_RELAXED);
  return real(event);
}

/* cudaMemcpy (not the Async form) blocks the host */
int cudaMemcpy(void* dst, const void* src, size_t bytes, int kind) {
  static int (*real)(void*, const void*, size_t, int);
  if (!real) real = (int (*)(void*, const void*, size_t, int))next("cudaMemcpy");
  __atomic_add_fetch(&n_memcpy, 1, __ATOMIC_RELAXED);
  return real(dst, src, bytes, kind);
}

__attribute__((destructor)) static void report(void) {
  const char* path = getenv("SYNC_COUNT_OUT");
  FILE* f = path ? fopen(path, "a") : NULL;
  fprintf(f ? f : stderr,
          "sync_count: cudaStreamSynchronize %lu cudaDeviceSynchronize %lu cudaEventSynchronize %lu "
          "cudaMemcpy %lu total %lu\n",
          n_stream, n_device, n_event, n_memcpy, n_stream + n_device + n_event + n_memcpy);
  if (f) fclose(f);
}
