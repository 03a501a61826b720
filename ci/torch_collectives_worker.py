"""The GPU side of ci/torch_collectives.py: one rank of the run (imports torch).

Each (collective, size) is run once on fresh data and every element compared with the exact
expected value, then timed (warm-up, then `iters` back-to-back calls, wall clock around them
with a device synchronize, as nccl-tests does), then run and compared once more on fresh data
(corruption under load shows there). Data are float32 holding integers below 2^24 that depend
on rank, collective and size, so sums are exact and a stale or misplaced chunk is a mismatch.
"""
from __future__ import annotations

import faulthandler
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


def _lifecycle(torch, dist, args, rank, n, device) -> int:
    """Rounds of what a job's restarts and sub-groups do to the plugin: a second communicator
    (its own connections) carrying traffic interleaved with the default one, both destroyed
    (after the last one NCCL finalizes and unloads the plugin), the default one set up again on
    a new rendezvous port. Returns the wrong elements seen over all rounds (summed over ranks)."""
    base_port = int(os.environ["MASTER_PORT"])
    wrong_total = 0
    for k in range(args.lifecycle):
        side = dist.new_group(ranks=list(range(n)))
        big, small = 1 << 18, 1 << 14
        want_big = sum(_pattern(torch, big, r, k, device) for r in range(n))
        want_small = sum(_pattern(torch, small, r, k + 1, device) for r in range(n))
        wrong = 0
        for _ in range(4):
            a, b = _pattern(torch, big, rank, k, device), _pattern(torch, small, rank, k + 1, device)
            dist.all_reduce(a)
            dist.all_reduce(b, group=side)
            torch.cuda.synchronize(device)
            wrong += int((a != want_big).sum().item()) + int((b != want_small).sum().item())
        w = torch.tensor([wrong], dtype=torch.int64, device=device)
        dist.all_reduce(w)
        wrong_total += int(w.item())
        dist.destroy_process_group(side)
        dist.destroy_process_group()
        os.environ["MASTER_PORT"] = str(base_port + 1 + k)
        dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=n)
        if rank == 0:
            print(
                f"[{args.label}] lifecycle round {k + 1}/{args.lifecycle}: two communicators checked, "
                f"destroyed, set up again  #wrong {int(w.item())}",
                flush=True,
            )
    return wrong_total


def _abort_in_flight(torch, dist, args, rank, n, device) -> int:
    """ncclCommAbort as a failing job does it: a second communicator aborted while rank 0's
    receive on it is in flight (rank 1 never sends), then the default communicator must still
    carry exact data. Returns the wrong elements afterwards (summed over ranks), -1 where this
    torch cannot abort one group."""
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    if abort is None:
        if rank == 0:
            print(f"[{args.label}] abort: skipped, torch {torch.__version__} has no _abort_process_group", flush=True)
        return -1
    side = dist.new_group(ranks=list(range(n)))
    warm = torch.ones(1024, device=device)
    dist.all_reduce(warm, group=side)  # the side communicator's connections exist and carry data
    # NCCL sets up point-to-point connections per peer and direction on first use, with both
    # ranks taking part (torch may also give point-to-point a communicator of its own): one
    # matched exchange each way first, so the receive below waits in the plugin, not in set-up.
    for src, dst in ((0, 1), (1, 0)):
        if rank == src:
            dist.send(warm, dst=dst, group=side)
        elif rank == dst:
            dist.recv(warm, src=src, group=side)
    torch.cuda.synchronize(device)
    if rank == 0:
        stuck = torch.zeros(1 << 20, device=device)
        dist.irecv(stuck, src=1, group=side)
    time.sleep(2.0)  # the proxy has posted the receive to the plugin
    t0 = time.perf_counter()
    abort(side)
    took = time.perf_counter() - t0
    count = 1 << 16
    a = _pattern(torch, count, rank, 7, device)
    dist.all_reduce(a)
    torch.cuda.synchronize(device)
    wrong = int((a != sum(_pattern(torch, count, r, 7, device) for r in range(n))).sum().item())
    w = torch.tensor([wrong], dtype=torch.int64, device=device)
    dist.all_reduce(w)
    if rank == 0:
        print(
            f"[{args.label}] abort: a communicator with a receive in flight aborted in {took:.2f} s; "
            f"the default one then exact  #wrong {int(w.item())}",
            flush=True,
        )
    return int(w.item())


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
    # A rank still running shortly before the launcher's limit prints every thread's stack: where
    # it waits (NCCL set-up, a collective, the plugin) is the first question about a hang.
    faulthandler.dump_traceback_later(max(args.timeout - 10.0, 5.0), exit=False)
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
    lifecycle_wrong = _lifecycle(torch, dist, args, rank, n, device) if args.lifecycle else 0
    wrong_total += lifecycle_wrong
    abort_wrong = _abort_in_flight(torch, dist, args, rank, n, device) if args.abort else 0
    wrong_total += max(abort_wrong, 0)
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
            "lifecycle_rounds": args.lifecycle,
            "lifecycle_wrong": lifecycle_wrong,
            "abort_wrong": abort_wrong,
        }
        if args.json:
            tmp = args.json + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1)
            os.replace(tmp, args.json)
        if os.environ.get("PROOF_CHILD") != "1":  # under torchrun nobody else prints it
            print(format_table(rows, labels=(args.label, "baseline")))
    dist.destroy_process_group()  # closes the comms: the plugin writes its final statistics
    return 1 if wrong_total else 0
