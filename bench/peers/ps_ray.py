"""ps_ray.py -- Ray's parameter-server pattern doing the tutorial topology's work.

Ray's documented parameter server (docs.ray.io, "Parameter Server" example):
a ParameterServer actor holds the model and applies gradients; DataWorker
actors compute gradients on their batches from the weights they are given.
Synchronous: each iteration both workers compute from the current weights
and the server applies their gradients together. Asynchronous: the server
applies each worker's gradients as they arrive and hands that worker the new
weights. The model and data are the DDP + RPC tutorial's (EmbeddingBag(100,
16, sum) + Linear(16, 8), SGD 0.05, 20..50 ids in bags of 1..10, 8 classes),
2 workers, one thread each.

Also: a Ray actor call's round trip (a method with no arguments, ray.get).

Prints one JSON line. Run with the Python of the bench's virtual
environment (scripts/setup.sh bench creates it, with Ray from PyPI):
    .peers-venv/bin/python bench/peers/ps_ray.py [--iters 300] [--calls 2000]
"""
import os

for _k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_k] = "1"
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import argparse
import json
import random
import statistics
import sys
import time

import ray
import torch


def make_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({"emb": torch.nn.EmbeddingBag(100, 16, mode="sum"), "fc": torch.nn.Linear(16, 8)})


def forward(model, indices, offsets):
    return model["fc"](model["emb"](indices, offsets))


def next_batch(rng):
    n = rng.randint(20, 50)
    indices = torch.tensor([rng.randrange(100) for _ in range(n)])
    offsets, start = [], 0
    while start < n:
        offsets.append(start)
        start += rng.randint(1, 10)
    target = torch.tensor([rng.randrange(8) for _ in offsets])
    return indices, torch.tensor(offsets), target


@ray.remote(num_cpus=0)
class ParameterServer:
    def __init__(self):
        torch.set_num_threads(1)
        self.model = make_model()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def apply_gradients(self, *gradients):
        summed = [torch.stack(g).mean(0) for g in zip(*gradients)]
        self.optimizer.zero_grad()
        for p, g in zip(self.model.parameters(), summed):
            p.grad = g
        self.optimizer.step()
        return self.get_weights()

    def get_weights(self):
        return [p.detach().clone() for p in self.model.parameters()]


@ray.remote(num_cpus=0)
class DataWorker:
    def __init__(self, seed):
        torch.set_num_threads(1)
        self.model = make_model()
        self.rng = random.Random(seed)
        self.loss = torch.nn.CrossEntropyLoss()

    def compute_gradients(self, weights):
        with torch.no_grad():
            for p, w in zip(self.model.parameters(), weights):
                p.copy_(w)
        self.model.zero_grad()
        indices, offsets, target = next_batch(self.rng)
        self.loss(forward(self.model, indices, offsets), target).backward()
        return [p.grad for p in self.model.parameters()]


@ray.remote(num_cpus=0)
class Echo:
    def ping(self):
        return None


def synchronous(ps, workers, iters):
    weights = ps.get_weights.remote()
    ray.get(weights)
    start = time.perf_counter()
    for _ in range(iters):
        gradients = [w.compute_gradients.remote(weights) for w in workers]
        weights = ps.apply_gradients.remote(*gradients)
    ray.get(weights)
    return len(workers) * iters / (time.perf_counter() - start)


def asynchronous(ps, workers, iters):
    weights = ray.get(ps.get_weights.remote())
    start = time.perf_counter()
    pending = {w.compute_gradients.remote(weights): w for w in workers}
    for _ in range(iters * len(workers)):
        ready, _ = ray.wait(list(pending))
        worker = pending.pop(ready[0])
        weights = ps.apply_gradients.remote(ready[0])
        pending[worker.compute_gradients.remote(weights)] = worker
    ray.get(list(pending))
    return len(workers) * iters / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--iters", type=int, default=300, help="iterations per worker")
    ap.add_argument("--calls", type=int, default=2000, help="actor calls for the round trip")
    a = ap.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        ps = ParameterServer.remote()
        workers = [DataWorker.remote(1000 + i) for i in range(2)]
        synchronous(ps, workers, 10)  # warm-up: actors started, code loaded
        sync_rate = synchronous(ps, workers, a.iters)
        async_rate = asynchronous(ps, workers, a.iters)
        echo = Echo.remote()
        ray.get(echo.ping.remote())
        times = []
        for _ in range(a.calls):
            t0 = time.perf_counter()
            ray.get(echo.ping.remote())
            times.append(time.perf_counter() - t0)
        print(json.dumps({"bench": "ps_ray", "ray": ray.__version__, "torch": torch.__version__,
                          "iters_per_worker": a.iters, "sync_iters_per_s": sync_rate,
                          "async_iters_per_s": async_rate,
                          "actor_call_round_trip_us": statistics.median(times) * 1e6}), flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
