/* Loads the plugin exactly as NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, dlsym of the data
 * symbol ncclNetPlugin_vN) and drives init / devices / getProperties through every ABI
 * version. The structs below are written from NCCL's net_vN.h; every offset and size is
 * checked against the numbers in reference/ncclnet-abi.md §1.3-1.4 (not against mpib's
 * Rust definitions).
 *
 * usage: loader LIB MODE
 *   MODE nodev   init must fail with ncclSystemError and one WARN line saying why
 *   MODE badenv  init must fail with ncclInvalidArgument and a WARN naming MPIB_SPLIT
 *   MODE dev     init succeeds; every device's properties are checked in every version
 *   MODE nics    as dev, with MPIB_NCCL_DEVICES=nics: v9+ show the two NICs, and the loader
 *                fuses them as NCCL does, from the NCCL_NET_FORCE_MERGE the plugin set
 *                (ncclTopoForceMerge: names and ports matched exactly, makeVDevice called)
 * Exit status 0 = all checks passed; every failed check prints "FAIL: ...". */
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int ncclResult_t;
typedef void (*logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);

/* ---- properties, per version --------------------------------------------------------- */
typedef struct { char* name; char* pciPath; uint64_t guid; int ptrSupport; int speed; int port;
  float latency; int maxComms; int maxRecvs; } props_v6;
typedef struct { char* name; char* pciPath; uint64_t guid; int ptrSupport; int speed; int port;
  float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion; } props_v7;
typedef struct { char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int speed;
  int port; float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion; } props_v8;
typedef struct { int ndevs; int devs[4]; } vprops4;
typedef struct { int ndevs; int devs[8]; } vprops8;
typedef struct { char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
  vprops4 vProps; size_t maxP2pBytes; size_t maxCollBytes; } props_v9; /* v10 identical */
typedef struct { char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
  vprops4 vProps; size_t maxP2pBytes; size_t maxCollBytes; int maxMultiRequestSize; } props_v11;
typedef struct { char* name; char* pciPath; uint64_t guid; int ptrSupport; int regIsGlobal; int forceFlush;
  int speed; int port; float latency; int maxComms; int maxRecvs; int netDeviceType; int netDeviceVersion;
  vprops8 vProps; size_t maxP2pBytes; size_t maxCollBytes; int maxMultiRequestSize; int16_t railId;
  int16_t planeId; } props_v12;

#define AT(T, f, off) _Static_assert(offsetof(T, f) == off, #T "." #f " @" #off)
_Static_assert(sizeof(props_v6) == 48, "v6 props"); AT(props_v6, latency, 36); AT(props_v6, maxRecvs, 44);
AT(props_v6, guid, 16); AT(props_v6, ptrSupport, 24); AT(props_v6, speed, 28); AT(props_v6, port, 32);
AT(props_v6, maxComms, 40);
_Static_assert(sizeof(props_v7) == 56, "v7 props"); AT(props_v7, netDeviceType, 48); AT(props_v7, netDeviceVersion, 52);
_Static_assert(sizeof(props_v8) == 64, "v8 props"); AT(props_v8, regIsGlobal, 28); AT(props_v8, speed, 32);
AT(props_v8, port, 36); AT(props_v8, latency, 40); AT(props_v8, maxComms, 44); AT(props_v8, maxRecvs, 48);
AT(props_v8, netDeviceType, 52); AT(props_v8, netDeviceVersion, 56);
_Static_assert(sizeof(props_v9) == 104, "v9 props"); AT(props_v9, forceFlush, 32); AT(props_v9, speed, 36);
AT(props_v9, port, 40); AT(props_v9, latency, 44); AT(props_v9, maxComms, 48); AT(props_v9, maxRecvs, 52);
AT(props_v9, netDeviceType, 56); AT(props_v9, netDeviceVersion, 60); AT(props_v9, vProps, 64);
AT(props_v9, maxP2pBytes, 88); AT(props_v9, maxCollBytes, 96);
_Static_assert(sizeof(props_v11) == 112, "v11 props"); AT(props_v11, maxMultiRequestSize, 104);
_Static_assert(sizeof(props_v12) == 128, "v12 props"); AT(props_v12, vProps, 64); AT(props_v12, maxP2pBytes, 104);
AT(props_v12, maxCollBytes, 112); AT(props_v12, maxMultiRequestSize, 120); AT(props_v12, railId, 124);
AT(props_v12, planeId, 126);

/* ---- function tables: slot names in NCCL's order; only the called slots are typed ---- */
typedef void* fp;
typedef struct { const char* name; ncclResult_t (*init)(logger_t); ncclResult_t (*devices)(int*);
  ncclResult_t (*getProperties)(int, void*); fp listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend,
  irecv, iflush, test, closeSend, closeRecv, closeListen; } net_v6;
typedef struct { const char* name; ncclResult_t (*init)(logger_t); ncclResult_t (*devices)(int*);
  ncclResult_t (*getProperties)(int, void*); fp listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend,
  irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed; } net_v7; /* = v8 */
typedef struct { const char* name; ncclResult_t (*init)(logger_t); ncclResult_t (*devices)(int*);
  ncclResult_t (*getProperties)(int, void*); fp listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend,
  irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed, makeVDevice; } net_v9;
typedef struct { const char* name; ncclResult_t (*init)(logger_t, void*); ncclResult_t (*devices)(int*);
  ncclResult_t (*getProperties)(int, void*); fp listen, connect, accept, regMr, regMrDmaBuf, deregMr, isend,
  irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr, irecvConsumed, makeVDevice; } net_v10;
typedef struct { int trafficClass; } comm_config;
typedef struct { const char* name; ncclResult_t (*init)(void**, uint64_t, comm_config*, logger_t, void*);
  ncclResult_t (*devices)(int*); ncclResult_t (*getProperties)(int, void*); fp listen, connect, accept, regMr,
  regMrDmaBuf, deregMr, isend, irecv, iflush, test, closeSend, closeRecv, closeListen, getDeviceMr,
  irecvConsumed, makeVDevice; ncclResult_t (*finalize)(void*); fp setNetAttr; } net_v11; /* = v12 */

_Static_assert(sizeof(net_v6) == 136, "v6 table"); _Static_assert(sizeof(net_v7) == 152, "v7 table");
_Static_assert(sizeof(net_v9) == 160, "v9 table"); _Static_assert(sizeof(net_v10) == 160, "v10 table");
_Static_assert(sizeof(net_v11) == 176, "v11 table");
AT(net_v6, closeListen, 128); AT(net_v7, irecvConsumed, 144); AT(net_v9, makeVDevice, 152);
AT(net_v11, finalize, 160); AT(net_v11, setNetAttr, 168); AT(net_v6, regMr, 56); AT(net_v6, isend, 80);
AT(net_v6, test, 104);

/* ---- the logger ----------------------------------------------------------------------- */
static char log_text[1 << 16];
static int warn_lines, info_lines;
static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  (void)flags;
  if (level == 2) warn_lines++;
  if (level == 3) info_lines++;
  fprintf(stderr, "[nccl log level %d %s:%d] %s\n", level, file ? file : "?", line, buf);
  strncat(log_text, buf, sizeof log_text - strlen(log_text) - 2);
  strcat(log_text, "\n");
}

static int failures;
#define CHECK(cond, ...) do { if (!(cond)) { failures++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* getProperties into a buffer guarded on both sides: the plugin must write exactly `size`. */
static void* props_call(ncclResult_t (*gp)(int, void*), int dev, size_t size, ncclResult_t* rc) {
  static unsigned char buf[64 + 256 + 64];
  memset(buf, 0xAB, sizeof buf);
  *rc = gp(dev, buf + 64);
  for (size_t i = 0; i < 64; i++) CHECK(buf[i] == 0xAB, "dev %d: byte before the props struct overwritten", dev);
  for (size_t i = 64 + size; i < sizeof buf; i++)
    if (buf[i] != 0xAB) { CHECK(0, "dev %d: wrote past the %zu-byte props struct (offset %zu)", dev, size, i - 64); break; }
  return buf + 64;
}

#define CHECK_COMMON(p, dev, v) do { \
  CHECK(p->name && strlen(p->name) > 0, "v%d dev %d: empty name", v, dev); \
  CHECK(p->ptrSupport & 1, "v%d dev %d: ptrSupport 0x%x lacks NCCL_PTR_HOST", v, dev, p->ptrSupport); \
  CHECK(p->speed > 0, "v%d dev %d: speed %d", v, dev, p->speed); \
  CHECK(p->maxRecvs == 8, "v%d dev %d: maxRecvs %d", v, dev, p->maxRecvs); \
  CHECK(p->maxComms > 0, "v%d dev %d: maxComms %d", v, dev, p->maxComms); \
  printf("v%d dev %d: name=%s pciPath=%s guid=0x%llx ptrSupport=0x%x speed=%d port=%d maxRecvs=%d\n", v, dev, \
         p->name, p->pciPath ? p->pciPath : "(null)", (unsigned long long)p->guid, p->ptrSupport, p->speed, p->port, p->maxRecvs); \
} while (0)

/* vProps: the device itself, or (a device makeVDevice made) the earlier devices it fuses. */
static void check_vprops(int v, int dev, int ndevs, const int* devs) {
  int ok = ndevs == 1 ? devs[0] <= dev : ndevs == 2 ? devs[0] < dev && devs[1] < dev && devs[0] != devs[1] : 0;
  CHECK(ok, "v%d dev %d: vProps {%d, %d, %d}", v, dev, ndevs, devs[0], devs[1]);
}

static void check_v9_tail(int v, int dev, const vprops4* vp, size_t p2p, int type) {
  check_vprops(v, dev, vp->ndevs, vp->devs);
  CHECK(p2p > 0 && p2p <= (1ull << 40), "v%d dev %d: maxP2pBytes %zu", v, dev, p2p);
  CHECK(type == 0, "v%d dev %d: netDeviceType %d (must be HOST)", v, dev, type);
}

static void check_devices(int v, ncclResult_t (*devices)(int*), ncclResult_t (*gp)(int, void*)) {
  int n = -1;
  ncclResult_t rc = devices(&n);
  CHECK(rc == 0 && n >= 1, "v%d: devices -> rc %d, n %d", v, rc, n);
  CHECK(devices(NULL) == 4, "v%d: devices(NULL) must return ncclInvalidArgument", v);
  for (int dev = 0; dev < n; dev++) {
    if (v == 6) { props_v6* p = props_call(gp, dev, sizeof *p, &rc); CHECK(rc == 0, "v6 getProperties rc %d", rc); CHECK_COMMON(p, dev, 6); }
    if (v == 7) { props_v7* p = props_call(gp, dev, sizeof *p, &rc); CHECK(rc == 0, "v7 rc %d", rc); CHECK_COMMON(p, dev, 7); CHECK(p->netDeviceType == 0, "v7 type"); }
    if (v == 8) { props_v8* p = props_call(gp, dev, sizeof *p, &rc); CHECK(rc == 0, "v8 rc %d", rc); CHECK_COMMON(p, dev, 8); CHECK(p->netDeviceType == 0, "v8 type"); }
    if (v == 9 || v == 10) { props_v9* p = props_call(gp, dev, sizeof *p, &rc); CHECK(rc == 0, "v%d rc %d", v, rc); CHECK_COMMON(p, dev, v);
      check_v9_tail(v, dev, &p->vProps, p->maxP2pBytes, p->netDeviceType); }
    if (v == 11) { props_v11* p = props_call(gp, dev, sizeof *p, &rc); CHECK(rc == 0, "v11 rc %d", rc); CHECK_COMMON(p, dev, 11);
      check_v9_tail(v, dev, &p->vProps, p->maxP2pBytes, p->netDeviceType); CHECK(p->maxMultiRequestSize >= 1, "v11 maxMultiRequestSize"); }
    if (v == 12) { props_v12* p = props_call(gp, dev, sizeof *p, &rc); CHECK(rc == 0, "v12 rc %d", rc); CHECK_COMMON(p, dev, 12);
      check_vprops(v, dev, p->vProps.ndevs, p->vProps.devs); CHECK(p->maxP2pBytes > 0, "v12 maxP2pBytes");
      CHECK(p->railId == -1 && p->planeId == -1, "v12 railId %d planeId %d", p->railId, p->planeId); }
  }
  /* A device that does not exist is an error, not a crash. */
  props_call(gp, n + 7, 0, &rc); /* size 0: nothing may be written at all */
  CHECK(rc == 4, "v%d: getProperties(bad dev) -> %d, want ncclInvalidArgument", v, rc);
}

/* NCCL's fusion of the NICs (ncclTopoForceMerge + ncclTopoMakeVnic, src/graph/topo.cc):
 * each ';' group of NCCL_NET_FORCE_MERGE names devices by exact name and port; makeVDevice
 * gets the matching device indices; the new device's properties list them in vProps. */
typedef ncclResult_t (*make_vdevice_t)(int*, vprops8*);
static int fused_dev = -1; /* what check_fusion made (NCCL fuses once per process) */
static void check_fusion(int v, make_vdevice_t make, ncclResult_t (*devices)(int*), ncclResult_t (*gp)(int, void*)) {
  const char* merge = getenv("NCCL_NET_FORCE_MERGE");
  CHECK(merge != NULL, "v%d: the plugin did not set NCCL_NET_FORCE_MERGE", v);
  if (!merge) return;
  int n = 0, groups = 0;
  devices(&n);
  char buf[256];
  snprintf(buf, sizeof buf, "%s", merge);
  for (char* g = strtok(buf, ";"); g; g = strtok(NULL, ";")) {
    vprops8 vp = { 0, { 0 } };
    char want[2][64]; int nwant = 0;
    for (char* e = g; e && nwant < 2; ) { char* c = strchr(e, ','); if (c) *c = 0; snprintf(want[nwant++], 64, "%s", e); e = c ? c + 1 : NULL; }
    for (int d = 0; d < n; d++) {
      /* name and port lie at the same offsets in props v9 ... v12 */
      ncclResult_t rc; props_v9* p = props_call(gp, d, v == 12 ? sizeof(props_v12) : v == 11 ? sizeof(props_v11) : sizeof(props_v9), &rc);
      char np[80]; snprintf(np, sizeof np, "%s:%d", p->name, p->port);
      for (int w = 0; w < nwant; w++) if (strcmp(np, want[w]) == 0 && vp.ndevs < 8) vp.devs[vp.ndevs++] = d;
    }
    CHECK(vp.ndevs == 2, "v%d: NCCL_NET_FORCE_MERGE group %s matched %d devices", v, g, vp.ndevs);
    int made = -1;
    ncclResult_t rc = make(&made, &vp);
    CHECK(rc == 0 && made >= n, "v%d: makeVDevice(%d, %d) -> rc %d, dev %d", v, vp.devs[0], vp.devs[1], rc, made);
    int n2 = 0; devices(&n2);
    CHECK(n2 == made + 1, "v%d: devices() %d after makeVDevice made %d", v, n2, made);
    if (groups == 0) fused_dev = made;
    groups++;
  }
  CHECK(groups >= 1, "v%d: NCCL_NET_FORCE_MERGE names no group", v);
  /* A group that is not a rail pair is refused (NCCL then keeps the devices apart). */
  vprops8 bad = { 2, { 0, 0 } };
  int d = -1;
  CHECK(make(&d, &bad) != 0, "v%d: makeVDevice of one device twice must fail", v);
  vprops8 one = { 1, { 0 } };
  CHECK(make(&d, &one) == 0, "v%d: makeVDevice of one device (NCCL 2.24-2.27 does that) must succeed", v);
}

int main(int argc, char** argv) {
  if (argc != 3) { fprintf(stderr, "usage: %s LIB nodev|badenv|dev\n", argv[0]); return 2; }
  const char* mode = argv[2];
  void* lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  if (!lib) { printf("FAIL: dlopen: %s\n", dlerror()); return 1; }
  int nics = strcmp(mode, "nics") == 0;
  int expect = strcmp(mode, "dev") == 0 || nics ? 0 : strcmp(mode, "badenv") == 0 ? 4 : 2;

  for (int v = 6; v <= 12; v++) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", v);
    void* t = dlsym(lib, sym);
    CHECK(t != NULL, "dlsym(%s) failed", sym);
    if (!t) continue;
    const char* name = *(const char* const*)t;
    CHECK(name && strcmp(name, "MPIB") == 0, "%s: name is %s", sym, name ? name : "(null)");
    warn_lines = 0;
    ncclResult_t rc;
    void* ctx = NULL;
    ncclResult_t (*devices)(int*) = NULL;
    ncclResult_t (*gp)(int, void*) = NULL;
    make_vdevice_t make = NULL;
    if (v == 6) { net_v6* n = t; rc = n->init(logger); devices = n->devices; gp = n->getProperties;
      CHECK(n->listen && n->connect && n->accept && n->regMr && n->isend && n->irecv && n->iflush && n->test &&
            n->closeSend && n->closeRecv && n->closeListen && n->deregMr, "v6: a mandatory slot is NULL"); }
    else if (v <= 8) { net_v7* n = t; rc = n->init(logger); devices = n->devices; gp = n->getProperties;
      CHECK(n->getDeviceMr == NULL && n->irecvConsumed == NULL, "v%d: offload slots must be NULL", v);
      CHECK(n->listen && n->regMr && n->isend && n->test && n->closeListen, "v%d: a mandatory slot is NULL", v); }
    else if (v == 9) { net_v9* n = t; rc = n->init(logger); devices = n->devices; gp = n->getProperties;
      make = (make_vdevice_t)n->makeVDevice; }
    else if (v == 10) { net_v10* n = t; rc = n->init(logger, NULL); devices = n->devices; gp = n->getProperties;
      make = (make_vdevice_t)n->makeVDevice; }
    else { net_v11* n = t; comm_config cfg = { -1 }; rc = n->init(&ctx, 0x1234 + v, &cfg, logger, NULL);
      devices = n->devices; gp = n->getProperties; make = (make_vdevice_t)n->makeVDevice;
      CHECK(n->finalize != NULL, "v%d: finalize is NULL", v); }
    /* v9+: NCCL fuses each rail pair's NICs through makeVDevice (plugin/table.rs). */
    if (v >= 9) CHECK(make != NULL, "v%d: makeVDevice is NULL", v);
    printf("v%d: init -> %d\n", v, rc);
    CHECK(rc == expect, "v%d: init returned %d, expected %d", v, rc, expect);
    if (expect != 0) {
      CHECK(warn_lines >= 1, "v%d: failed init logged no WARN line", v);
      CHECK(ctx == NULL, "v%d: failed init returned a context", v);
      continue;
    }
    check_devices(v, devices, gp);
    if (nics && v >= 9 && make && fused_dev < 0) check_fusion(v, make, devices, gp);
    if (nics && v == 12 && fused_dev >= 0) {
      ncclResult_t prc;
      props_v12* p = props_call(gp, fused_dev, sizeof *p, &prc);
      CHECK(prc == 0 && p->vProps.ndevs == 2 && p->vProps.devs[0] == 0 && p->vProps.devs[1] == 1, "v12 fused vProps");
      CHECK(strchr(p->name, '+') != NULL, "v12 fused name %s", p->name);
      printf("v12 fused dev %d: name=%s speed=%d vProps={%d,%d}\n", fused_dev, p->name, p->speed, p->vProps.devs[0],
             p->vProps.devs[1]);
    }
    if (nics && v < 9) { int n = 0; devices(&n); CHECK(n == 1, "v%d: %d devices; a rail pair is one device before v9", v, n); }
    if (v >= 11) {
      net_v11* n = t;
      CHECK(n->finalize(ctx) == 0, "v%d: finalize failed", v);
      CHECK(n->finalize(ctx) == 4, "v%d: a second finalize of the same ctx must be ncclInvalidArgument", v);
    }
  }
  if (strcmp(mode, "nodev") == 0)
    CHECK(strstr(log_text, "no usable network device") != NULL, "no line says why there is no device");
  if (strcmp(mode, "badenv") == 0)
    CHECK(strstr(log_text, "MPIB_SPLIT") != NULL, "no WARN names MPIB_SPLIT");
  if (expect == 0 && getenv("NCCL_DEBUG") && strcmp(getenv("NCCL_DEBUG"), "INFO") == 0) {
    CHECK(strstr(log_text, "MPIB: mpib ") && strstr(log_text, "(commit "), "no banner line with the version and commit");
    CHECK(strstr(log_text, "MPIB: Using [0]soft-sout:1/TCP+soft-sup:1/TCP") != NULL, "no banner line for rail pair 0");
  }
  printf("%s: %d failure(s)\n", failures ? "FAILED" : "OK", failures);
  return failures ? 1 : 0;
}
