"""torch.save / torch.load of the state bench/checkpoint saves: `layers`
linear layers of width `width` (float32 weight and bias) and Adam's
exp_avg and exp_avg_sq for each, plus the step, in one process. The file is
fsynced after torch.save (troupe's shards are), and read back with
torch.load twice: from the page cache, then with the file's cached pages
dropped (POSIX_FADV_DONTNEED). Prints one JSON line: bytes, save_seconds, load_seconds, cold_load_seconds.

  /usr/bin/python3 bench/peers/checkpoint_torch.py --layers 64 --width 2048 --path /tmp/x.pt
"""
import argparse
import json
import os
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--width", type=int, required=True)
    parser.add_argument("--path", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    model, optimizer = {}, {"step": torch.tensor(1, dtype=torch.int64)}
    total = 0
    for i in range(args.layers):
        for name, shape in ((f"{2 * i}.weight", (args.width, args.width)), (f"{2 * i}.bias", (args.width,))):
            model[name] = torch.randn(shape, generator=generator)
            optimizer[name + ".exp_avg"] = torch.randn(shape, generator=generator)
            optimizer[name + ".exp_avg_sq"] = torch.rand(shape, generator=generator)
            total += 3 * model[name].numel() * 4
    state = {"model": model, "optimizer": optimizer}
    start = time.perf_counter()
    with open(args.path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    saved = time.perf_counter() - start
    start = time.perf_counter()
    loaded = torch.load(args.path)
    load_seconds = time.perf_counter() - start
    assert torch.equal(loaded["model"]["0.weight"], model["0.weight"])
    del loaded
    # Cold: the file's cached pages dropped first, as bench/checkpoint does.
    fd = os.open(args.path, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    start = time.perf_counter()
    loaded = torch.load(args.path)
    cold_load_seconds = time.perf_counter() - start
    assert torch.equal(loaded["model"]["0.weight"], model["0.weight"])
    os.remove(args.path)
    print(json.dumps({"bytes": total, "save_seconds": saved, "load_seconds": load_seconds,
                      "cold_load_seconds": cold_load_seconds}))


if __name__ == "__main__":
    main()
