"""Stands in for ci/torch_collectives_worker.py where there is no GPU or torch (CPU tests):
selected with PROOF_WORKER=fake_worker. It does what the real worker does around NCCL:
writes the rank's NCCL log (a recorded fixture) to NCCL_DEBUG_FILE, the plugin's statistics to
MPIB_STATS_FILE, and rank 0 the result JSON. FAKE_MODE: ok | corrupt (wrong elements through
the plugin) | no-channels (plugin log without "via NET/MPIB") | crash (rank 1 exits 7) |
hang (rank 1 never returns)."""
import json
import os
import shutil
import time

from torch_collectives import SCHEMA, make_row

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "fixtures")


def worker(args):
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    mode = os.environ.get("FAKE_MODE", "ok")
    plugin = os.environ.get("NCCL_NET") == "MPIB"
    log = f"2.30-{'plugin' if plugin else 'baseline'}.rank{rank}.log"
    if plugin and mode == "no-channels":
        log = "2.30-no-channels.rank0.log"
    if os.environ.get("NCCL_DEBUG_FILE"):
        shutil.copy(os.path.join(FIXTURES, "nccl", log), os.environ["NCCL_DEBUG_FILE"])
    if plugin and os.environ.get("MPIB_STATS_FILE"):
        shutil.copy(os.path.join(FIXTURES, "mpib-stats", "plugin.rank0.stats"), os.environ["MPIB_STATS_FILE"])
    if rank == 1 and mode == "crash":
        return 7
    if rank == 1 and mode == "hang":
        time.sleep(3600)
    rows = []
    for op in args.ops:
        for size in args.sizes:
            seconds = 20e-6 + size / (2.5e9 if plugin else 1.25e9)
            wrong = 5 if (mode == "corrupt" and plugin and op == args.ops[0] and size == args.sizes[-1]) else 0
            rows.append(make_row(op, size, seconds, n, wrong, args.iters or 5))
    wrong_total = sum(r["wrong"] for r in rows)
    if rank == 0 and args.json:
        env = {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "MPIB_"))}
        result = {"schema": SCHEMA, "label": args.label, "nranks": n, "rows": rows, "wrong_total": wrong_total, "env": env}
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f)
    with open(os.path.join(args.out_dir, f"{args.label}.rank{rank}.env.json"), "w", encoding="utf-8") as f:
        json.dump({k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "MPIB_"))}, f)
    return 1 if wrong_total else 0
