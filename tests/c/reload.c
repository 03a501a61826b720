/* NCCL 2.28+ dlclose the plugin after the last communicator's finalize and may dlopen it
 * again for the next one. The plugin has threads of its own (the soft fabric's helper), so
 * its code must stay mapped (linked -z nodelete): this program sets up and tears down a
 * connection, finalizes, dlcloses and loads the library again, several times, through v12
 * (a context per init) and v8, and must survive. Usage: reload LIB ROUNDS */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "mpib.h"

static int fail(const char* what, int round) {
  printf("FAIL: round %d: %s\n", round, what);
  return 1;
}

/* One connection over the plugin's first device, up and closed again. */
#define CONNECT_AND_CLOSE(T, ...)                                                           \
  do {                                                                                      \
    char handle[NCCL_NET_HANDLE_MAXSIZE];                                                   \
    memset(handle, 0, sizeof handle);                                                       \
    void *lc = NULL, *sc = NULL, *rc = NULL;                                                \
    ncclNetDeviceHandle_v8_t* dh = NULL;                                                    \
    if (T->listen(__VA_ARGS__ 0, handle, &lc) != 0) return fail("listen", round);    \
    char h2[NCCL_NET_HANDLE_MAXSIZE];                                                       \
    memcpy(h2, handle, sizeof h2);                                                          \
    for (int i = 0; i < 200000 && (!sc || !rc); i++) {                                      \
      if (!sc && T->connect(__VA_ARGS__ 0, h2, &sc, (void*)&dh) != 0)                \
        return fail("connect", round);                                                      \
      if (!rc && T->accept(lc, &rc, (void*)&dh) != 0) return fail("accept", round); \
      if (!sc || !rc) usleep(50);                                                           \
    }                                                                                       \
    if (!sc || !rc) return fail("connect/accept did not finish", round);                    \
    if (T->closeSend(sc) != 0 || T->closeRecv(rc) != 0 || T->closeListen(lc) != 0) return fail("close", round); \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 3) { printf("usage: reload LIB ROUNDS\n"); return 2; }
  int rounds = atoi(argv[2]);
  for (int round = 0; round < rounds; round++) {
    void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) { printf("FAIL: dlopen: %s\n", dlerror()); return 1; }
    if (round % 2 == 0) {
      const ncclNet_v12_t* t = (const ncclNet_v12_t*)dlsym(lib, "ncclNetPlugin_v12");
      if (!t) return fail("no ncclNetPlugin_v12", round);
      void* ctx = NULL;
      ncclNetCommConfig_v11_t cfg = { .trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF };
      if (t->init(&ctx, (uint64_t)round + 1, &cfg, NULL, NULL) != 0) return fail("init", round);
      CONNECT_AND_CLOSE(t, ctx,);
      if (t->finalize(ctx) != 0) return fail("finalize", round);
    } else {
      const ncclNet_v8_t* t = (const ncclNet_v8_t*)dlsym(lib, "ncclNetPlugin_v8");
      if (!t) return fail("no ncclNetPlugin_v8", round);
      if (t->init(NULL) != 0) return fail("init", round);
      CONNECT_AND_CLOSE(t, );
    }
    if (dlclose(lib) != 0) { printf("FAIL: dlclose: %s\n", dlerror()); return 1; }
    /* The helper threads keep running: give them time to touch the plugin's code. */
    usleep(200000);
    printf("round %d: loaded, connected, closed, unloaded\n", round);
  }
  printf("PASS\n");
  return 0;
}
