/* Stands in for an nccl-tests binary built with MPI=1 (CPU tests): linked against a stand-in
 * libmpi.so so `ldd` shows it; copies FAKE_NCCL_LOG to NCCL_DEBUG_FILE and, on rank 0,
 * $FAKE_TESTS_DIR/<program name>.out to stdout; writes its arguments and environment to
 * NCCL_DEBUG_FILE.args. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void copy(const char *from, FILE *to) {
  FILE *f = from ? fopen(from, "r") : NULL;
  char buf[4096];
  size_t n;
  if (!f) return;
  while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, to);
  fclose(f);
}

int main(int argc, char **argv) {
  const char *log = getenv("NCCL_DEBUG_FILE");
  const char *rank = getenv("OMPI_COMM_WORLD_RANK");
  if (log) {
    char args[4096];
    FILE *f = fopen(log, "w");
    if (f) { copy(getenv("FAKE_NCCL_LOG"), f); fclose(f); }
    snprintf(args, sizeof args, "%s.args", log);
    f = fopen(args, "w");
    if (f) {
      fprintf(f, "NCCL_HOSTID=%s NCCL_TESTS_DEVICE=%s NCCL_NET=%s", getenv("NCCL_HOSTID") ? getenv("NCCL_HOSTID") : "",
              getenv("NCCL_TESTS_DEVICE") ? getenv("NCCL_TESTS_DEVICE") : "", getenv("NCCL_NET") ? getenv("NCCL_NET") : "");
      for (int i = 1; i < argc; i++) fprintf(f, " %s", argv[i]);
      fprintf(f, "\n");
      fclose(f);
    }
  }
  if (rank && strcmp(rank, "0") == 0 && getenv("FAKE_TESTS_DIR")) {
    const char *name = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];
    char out[4096];
    snprintf(out, sizeof out, "%s/%s.out", getenv("FAKE_TESTS_DIR"), name);
    copy(out, stdout);
  }
  return 0;
}
