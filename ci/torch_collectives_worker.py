"""The GPU side of ci/torch_collectives.py: one rank of the run (imports torch).

Each (collective, size) is run once on fresh data and every element compared with the exact
expected value, then timed (warm-up, then `iters` back-to-back calls, wall clock around them
with a device synchronize, as nccl-tests does), then run and compared once more on fresh data
(corruption under load shows there). Data are float32 holding integers below 2^24 that depend
on rank, collective and size, so sums are exact and a stale or misplaced chunk is a mismatch.
"""
from __future__ import annotations

import json
import os
import sys
import time

from torch_collectives import OPS, SCHEMA, format_table, make_row, rank_env

MOD = 1021  # pattern period (prime, so chunks of power-of-two sizes differ)
RANK_STEP = 1024  # rank r adds r*1024: sums stay exact integers in float32


def _pattern(torch, count, rank, salt, device):
    idx = torch.arange(count, device=device, dtype=torch.int32)
    return (((idx % MOD) * 7 + salt) % MOD + rank * RANK_STEP).to(torch.float32)


def _case(torch, dist, op, size, rank, n, device, salt):
    """(run, prepare, output, expected): `prepare` resets inputs and poisons the output."""
    count = size // 4
    pat = lambda c, r: _pattern(torch, c, r, salt, device)  # noqa: E731
    if op == "all_reduce":
        buf = pat(count, rank)
        expected = sum(pat(count, r) for r in range(n))
        return (lambda: dist.all_reduce(buf)), (lambda: buf.copy_(pat(count, rank))), buf, expected
    if op == "all_gather":
        c = count // n
        inp, out = pat(c, rank), torch.empty(count, device=device)
        expected = torch.cat([pat(c, r) for r in range(n)])
        gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
        return (lambda: gather(out, inp)), (lambda: out.fill_(-1)), out, expected
    if op == "reduce_scatter":
        c = count // n
        inp, out = pat(count, rank), torch.empty(c, device=device)
        expected = sum(pat(count, r) for r in range(n))[rank * c : (rank + 1) * c].clone()
        scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
        return (lambda: scatter(out, inp)), (lambda: out.fill_(-1)), out, expected
    if op == "all_to_all":
        c = count // n
        inp, out = pat(count, rank), torch.empty(count, device=device)
        expected = torch.cat([pat(count, r)[rank * c : (rank + 1) * c] for r in range(n)])
        return (lambda: dist.all_to_all_single(out, inp)), (lambda: out.fill_(-1)), out, expected
    if op == "sendrecv":  # as nccl-tests: send to rank+1 and receive from rank-1 at once
        send, recv = pat(count, rank), torch.empty(count, device=device)
        expected = pat(count, (rank - 1) % n)

        def run():
            ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

        return run, (lambda: recv.fill_(-1)), recv, expected
    raise ValueError(op)


def _checked(torch, run, prepare, out, expected, device):
    prepare()
    run()
    torch.cuda.synchronize(device)
    return int((out != expected).sum().item())


def _timed(torch, dist, run, iters, warmup, device, n):
    for _ in range(warmup):
        run()
    torch.cuda.synchronize(device)
    dist.barrier(device_ids=[device.index])
    t0 = time.perf_counter()
    for _ in range(iters):
        run()
    torch.cuda.synchronize(device)
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.item() / n


def _nccl_version(torch):
    v = torch.cuda.nccl.version()
    if isinstance(v, tuple):
        return ".".join(str(x) for x in v)
    return f"{v // 1000}.{v % 1000 // 100}.{v % 100}" if v < 10000 else f"{v // 10000}.{v % 10000 // 100}.{v % 100}"


def worker(args) -> int:
    rank, n = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # Before torch (and so NCCL) starts: this rank's host id, log file and statistics file.
    os.environ.update(rank_env(rank, args.label, args.out_dir, args.fake_hosts, args.hostid_prefix, args.stats))
    import torch
    import torch.distributed as dist

    from torch_collectives import auto_iters, human_size

    if not torch.cuda.is_available() or not dist.is_nccl_available():
        print(f"rank {rank}: torch {torch.__version__} has no CUDA device or no NCCL", file=sys.stderr)
        return 3
    dev = int(os.environ.get("LOCAL_RANK", "0")) if args.gpu == "local" else int(args.gpu)
    torch.cuda.set_device(dev)
    device = torch.device("cuda", dev)
    dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=n)
    started = time.time()
    rows, wrong_total = [], 0
    for op in args.ops:
        for si, size in enumerate(args.sizes):
            salt = (OPS.index(op) * 131 + si * 17) % MOD
            run, prepare, out, expected = _case(torch, dist, op, size, rank, n, device, salt)
            iters = args.iters or auto_iters(size)
            wrong = _checked(torch, run, prepare, out, expected, device)
            seconds = _timed(torch, dist, run, iters, args.warmup, device, n)
            wrong += _checked(torch, run, prepare, out, expected, device)
            w = torch.tensor([wrong], dtype=torch.int64, device=device)
            dist.all_reduce(w)
            row = make_row(op, size, seconds, n, int(w.item()), iters)
            wrong_total += row["wrong"]
            rows.append(row)
            if rank == 0:
                print(
                    f"[{args.label}] {op:<15} {human_size(size):>8}: {row['time_us']:10.1f} us"
                    f"  algbw {row['algbw']:8.3f}  busbw {row['busbw']:8.3f} GB/s  #wrong {row['wrong']}",
                    flush=True,
                )
            del run, prepare, out, expected
    if rank == 0:
        result = {
            "schema": SCHEMA,
            "label": args.label,
            "nranks": n,
            "nccl_version": _nccl_version(torch),
            "torch_version": torch.__version__,
            "device": torch.cuda.get_device_name(dev),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "MPIB_"))},
            "seconds": round(time.time() - started, 1),
            "rows": rows,
            "wrong_total": wrong_total,
        }
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
            os.replace(tmp, args.json)
        if os.environ.get("MPIB_PROOF_CHILD") != "1":  # under torchrun nobody else prints it
            print(format_table(rows, labels=(args.label, "baseline")))
    dist.destroy_process_group()  # closes the comms: the plugin writes its final statistics
    return 1 if wrong_total else 0
