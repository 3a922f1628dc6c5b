#!/usr/bin/python3
"""ps_zipf_torch.py -- the scaled sparse parameter-server case in PyTorch RPC.

5 processes: trainers 0 and 1 (a DDP Linear(64, 8), gloo), a master, and two
parameter servers ps0 and ps1, each holding half of a 10M x 64 float32
EmbeddingBag table (mode "sum", sparse=True) as a RemoteModule: id i lives
on ps(i % 2) as row i // 2 (the hashed sharding troupe's side uses). Each
iteration of a trainer: 512 bags of 20 ids drawn from Zipf(1.1) over the
10M ids, split by server, both remote forwards in flight together, summed;
CrossEntropy over 8 classes; dist_autograd.backward (sparse gradients to the
servers, DDP allreduce of the dense grads); DistributedOptimizer(SGD 0.05)
steps both servers' tables and the local layer.

Prints one JSON line: aggregate iterations/s of both trainers (each times
its loop after the warm-up), ids looked up per second, and each server's
resident memory after the run. Run with /usr/bin/python3.
    ps_zipf_torch.py [--rows 10000000] [--dim 64] [--iters 20] [--warmup 3]
"""
import os

for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_k] = "1"
os.environ["TP_SOCKET_IFNAME"] = "lo"
os.environ["GLOO_SOCKET_IFNAME"] = "lo"
os.environ.setdefault("GLOG_minloglevel", "1")

import argparse
import json
import multiprocessing
import socket
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
from torch.distributed.nn import RemoteModule
from torch.distributed.optim import DistributedOptimizer
from torch.distributed.rpc import RRef
from torch.nn.parallel import DistributedDataParallel as DDP

BAGS, BAG_SIZE, CLASSES, ZIPF = 512, 20, 8, 1.1


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def zipf_sampler(rows, seed):
    """Ids by rank: P(id = r) proportional to 1 / (r + 1)^1.1."""
    cdf = np.cumsum(1.0 / np.power(np.arange(1, rows + 1, dtype=np.float64), ZIPF))
    cdf /= cdf[-1]
    rng = np.random.default_rng(seed)
    return lambda n: np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1).astype(np.int64)


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def _run_trainer(shards, rank, c):
    torch.manual_seed(0)
    dense = DDP(torch.nn.Linear(c["dim"], CLASSES))
    params = [p for s in shards for p in s.remote_parameters()] + [RRef(p) for p in dense.parameters()]
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.05)
    criterion = torch.nn.CrossEntropyLoss()
    draw = zipf_sampler(c["rows"], 1000 + rank)
    gen = torch.Generator().manual_seed(1000 + rank)
    bag_of = torch.arange(BAGS).repeat_interleave(BAG_SIZE)

    # Batches are drawn before the loop: it times the servers and training.
    batches = [torch.from_numpy(draw(BAGS * BAG_SIZE)) for _ in range(c["warmup"] + c["iters"])]

    def one_iter():
        ids = batches.pop(0)
        target = torch.randint(0, CLASSES, (BAGS,), generator=gen)
        with dist_autograd.context() as cid:
            futures = []
            for k in range(2):
                mask = (ids % 2) == k
                local = ids[mask] // 2
                counts = torch.bincount(bag_of[mask], minlength=BAGS)
                offsets = torch.cumsum(counts, 0) - counts
                futures.append(shards[k].forward_async(local, offsets))
            pooled = futures[0].wait() + futures[1].wait()
            loss = criterion(dense(pooled), target)
            dist_autograd.backward(cid, [loss])
            opt.step(cid)
        return loss.item()

    for _ in range(c["warmup"]):
        one_iter()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(c["iters"]):
        one_iter()
    return {"rank": rank, "wall_s": time.perf_counter() - t0, "iters": c["iters"]}


def _server_rss():
    return rss_mib()


def worker(rank, c, q):
    torch.set_num_threads(1)
    opts = rpc.TensorPipeRpcBackendOptions(init_method=f"tcp://127.0.0.1:{c['rpc_port']}", rpc_timeout=600)
    names = {0: "trainer0", 1: "trainer1", 2: "master", 3: "ps0", 4: "ps1"}
    if rank <= 1:
        dist.init_process_group(backend="gloo", rank=rank, world_size=2,
                                init_method=f"tcp://127.0.0.1:{c['pg_port']}")
    rpc.init_rpc(names[rank], rank=rank, world_size=5, rpc_backend_options=opts)
    if rank == 2:
        shards = [RemoteModule(f"ps{k}", torch.nn.EmbeddingBag, args=((c["rows"] + 1 - k) // 2, c["dim"]),
                               kwargs={"mode": "sum", "sparse": True}) for k in range(2)]
        futs = [rpc.rpc_async(f"trainer{r}", _run_trainer, args=(shards, r, c)) for r in (0, 1)]
        res = [f.wait() for f in futs]
        rss = [rpc.rpc_sync(f"ps{k}", _server_rss) for k in range(2)]
        rate = sum(r["iters"] / r["wall_s"] for r in res)
        q.put({"bench": "ps_zipf_torch", "name": "scaled_sparse",
               "params": {"rows": c["rows"], "dim": c["dim"], "bags": BAGS, "bag_size": BAG_SIZE, "zipf": ZIPF,
                          "servers": 2, "trainers": 2, "optimizer": "SGD 0.05", "iters": c["iters"]},
               "aggregate_iters_per_s": rate, "ids_per_s": rate * BAGS * BAG_SIZE,
               "server_rss_mib": rss, "torch": torch.__version__})
        del shards
    rpc.shutdown()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=400.0)
    a = ap.parse_args()
    c = {"rows": a.rows, "dim": a.dim, "iters": a.iters, "warmup": a.warmup,
         "rpc_port": free_port(), "pg_port": free_port()}
    ctx = multiprocessing.get_context("spawn")
    q = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, c, q)) for r in range(5)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + a.timeout
    result = None
    while any(p.is_alive() for p in procs) and time.monotonic() < deadline:
        if not q.empty():
            result = q.get()
        if any(p.exitcode not in (None, 0) for p in procs):
            break
        time.sleep(0.1)
    for p in procs:
        if p.is_alive() and time.monotonic() >= deadline:
            p.kill()
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    if result is None and not q.empty():
        result = q.get()
    if result is None:
        print("# ps_zipf_torch: no result (exit codes %s)" % [p.exitcode for p in procs], file=sys.stderr)
        sys.exit(1)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
