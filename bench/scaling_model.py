#!/usr/bin/env python3
"""The scaling model of docs/scaling.md, checked against bench/links.sh.

    python3 bench/scaling_model.py LINKS_OUTPUT            # measured vs predicted, with errors
    python3 bench/scaling_model.py --extrapolate           # 64 and 256 hosts
    python3 bench/scaling_model.py --self-test             # the played schedule against closed forms

Reads the "hosts=N rate=R what=W value=V unit=U" lines of bench/links.sh
(allreduce_* rows are the ring's, allreduce_auto_* the default algorithm's),
calibrates the machine's three constants from the unshaped 2-host run and
the cores' rate also from the 25 Gbit/s one (so those rows are fits, not
predictions, and are left out of the errors), and
predicts every other row from the link's iperf3 rate measured in the same
cluster run.
"""
import re
import statistics
import sys

ALPHA_S = 100e-6  # per ring step beyond this machine: data-plane one-way latency plus a handoff (docs/scaling.md)
ALPHA_FLOOR_S = 20e-6  # the least a fitted step may take: one way of the data plane's TCP round trip (~40 us)
CORES = 2  # this machine: every rank of every host shares them
CORES_BOUND_LINKS = ("none", "25gbit")  # 2-host links where the cores, not the link, bind the 16 MiB ring
DP_BATCH = 16  # data_parallel_demo: samples per rank per step
DP_GRAD_BYTES = 215168 * 4  # its GPT's gradients, float32
DP_HIDDEN = 0.5  # share of the allreduce hidden behind backward (the demo prints 22-100%)
PP_BATCH, PP_MICRO = 32, 4  # pipeline_demo: samples per step, micro-batches (1F1B)
PP_ACT_BYTES = (PP_BATCH // PP_MICRO) * 64 * 64 * 4  # one micro-batch's activations: 8 x 64 tokens x width 64
PP_BACKWARD_SHARE = 2 / 3  # of a layer's forward + backward (two matrix products to the forward's one)
# From a stage sending its result to the next stage's handler starting on it,
# beyond the bytes' time on the link: on this machine every stage's thread
# shares the two cores with the others' compute, so the receiving threads
# wait to be scheduled. The median of the gradient edges (stage k+1 -> k,
# which their receiver waits for) in troupe-trace summary of pipeline_demo
# on 2 and 4 unshaped namespace hosts: 1.6-1.8 ms (docs/scaling.md).
PP_HANDOFF_S = 1.5e-3


def ring_time(size, n, rate_bps, alpha=ALPHA_S):
    """Ring allreduce of `size` bytes over n ranks, each sending at rate_bps."""
    return 2 * (n - 1) * alpha + 2 * (n - 1) / n * size * 8 / rate_bps


def busbw(size, n, rate_bps, alpha=ALPHA_S):
    return 2 * (n - 1) / n * size * 8 / ring_time(size, n, rate_bps, alpha)


def halving_doubling_time(size, n, rate_bps, alpha=ALPHA_S):
    """Recursive halving then doubling (reducer_group_options::messages):
    2 log2 n' exchanges over the largest power of two n' <= n, the same
    bytes per rank as the ring; on other n the extra ranks first hand their
    whole vector to a partner and take the result back."""
    p = 1 << (n.bit_length() - 1)
    t = 2 * (p.bit_length() - 1) * alpha + 2 * (p - 1) / p * size * 8 / rate_bps
    return t if p == n else t + 2 * (alpha + size * 8 / rate_bps)


def automatic_time(size, n, rate_bps, alpha=ALPHA_S):
    """The default, `automatic`: halving-doubling up to 256 KiB on a
    power-of-two group (up to 64 KiB on others), the ring above."""
    bound = (256 << 10) if n & (n - 1) == 0 else (64 << 10)
    return halving_doubling_time(size, n, rate_bps, alpha) if size <= bound else ring_time(size, n, rate_bps, alpha)


def per_rank_rate(link_bps, n, machine_bps):
    """A rank sends at the link's rate unless the machine's cores, shared by
    all n ranks, cannot move n such streams."""
    return min(link_bps, machine_bps / n)


def dp_samples(n, rank_rate, t_fb, alpha):
    share = max(1.0, n / CORES)
    return DP_BATCH * n / (t_fb * share + (1 - DP_HIDDEN) * ring_time(DP_GRAD_BYTES, n, rank_rate, alpha))


def one_f_one_b(p, m, stage):
    """Stage `stage`'s operations in 1F1B order: p - stage - 1 forwards to
    fill the pipeline, then one forward and one backward in turn, then the
    backwards left."""
    warm = min(p - stage - 1, m)
    ops = [("F", i) for i in range(warm)]
    forwards, backwards = warm, 0
    while forwards < m:
        ops += [("F", forwards), ("B", backwards)]
        forwards, backwards = forwards + 1, backwards + 1
    return ops + [("B", i) for i in range(backwards, m)]


def pipeline_step(p, m, w, cores, hop=0.0, backward_share=PP_BACKWARD_SHARE):
    """One 1F1B step over p balanced stages (work w per micro-batch through
    all of them) whose runnable stages share `cores` equally, as the
    kernel's scheduler shares them, with `hop` seconds between a stage
    finishing an operation and the next stage being able to start on its
    result (the activation or gradient crossing a link). With p <= cores
    and no hop this is the textbook (m + p - 1) w / p; with more stages
    than cores it lies between the cores' bound m w / cores and
    (m + p - 1) w / cores, because a stage idle in the bubble leaves its
    core to the others."""
    cost = {"F": w / p * (1 - backward_share), "B": w / p * backward_share}
    order = [one_f_one_b(p, m, s) for s in range(p)]
    at = [0] * p  # each stage's next operation
    left = [None] * p  # work left in it, once started
    finished = {}  # (kind, stage, micro-batch) -> when

    def ready_at(s):
        """When stage s's next operation can start (None: not yet known)."""
        if at[s] == len(order[s]):
            return None
        kind, i = order[s][at[s]]
        if kind == "F":
            return 0.0 if s == 0 else (finished[("F", s - 1, i)] + hop if ("F", s - 1, i) in finished else None)
        if s == p - 1:
            return finished.get(("F", s, i))
        return finished[("B", s + 1, i)] + hop if ("B", s + 1, i) in finished else None

    t = 0.0
    while any(at[s] < len(order[s]) for s in range(p)):
        starts = {s: ready_at(s) for s in range(p)}
        running = [s for s, r in starts.items() if r is not None and r <= t + 1e-15]
        arriving = [r for r in starts.values() if r is not None and r > t + 1e-15]
        if not running:
            t = min(arriving)
            continue
        speed = min(1.0, cores / len(running))
        for s in running:
            if left[s] is None:
                left[s] = cost[order[s][at[s]][0]]
        step = min(left[s] for s in running) / speed
        if arriving:
            step = min(step, min(arriving) - t)  # another stage joins: the shares change
        t += step
        for s in running:
            left[s] -= step * speed
            if left[s] <= 1e-12 * w:
                kind, i = order[s][at[s]]
                finished[(kind, s, i)] = t
                at[s], left[s] = at[s] + 1, None
    return t


def pp_samples(p, rank_rate, w):
    return PP_BATCH / pipeline_step(p, PP_MICRO, w, CORES, hop=PP_ACT_BYTES * 8 / rank_rate + PP_HANDOFF_S)


def read_passes(path):
    """Each row's values, one per pass (links.sh --repeats)."""
    passes = {}
    for line in open(path):
        m = re.match(r"hosts=(\d+) rate=(\S+) what=(\S+) value=([0-9.]+)", line)
        if m:
            passes.setdefault((int(m[1]), m[2], m[3]), []).append(float(m[4]))
    return passes


def spread(values):
    """How far a row's passes lie apart: the largest over the smallest, less 1."""
    return max(values) / min(values) - 1 if min(values) > 0 else float("inf")


def pass_ratios(values, iperf3):
    """Each pass's figure over the iperf3 of the same pass (links.sh runs a
    cluster's measurements in turn, pass after pass); none unless every pass
    has its iperf3."""
    return [v / i for v, i in zip(values, iperf3)] if len(values) == len(iperf3) and min(iperf3, default=0) > 0 else []


def cores_rate(passes):
    """K, bits/s: what this machine's cores move through the data plane, all
    ranks together, from the 16 MiB ring on 2 hosts. The cores bind it behind
    25 Gbit/s as well as unshaped (busbw a third of the link), so K is the
    median of both links' passes: one row alone carried its minute's noise
    into every cores-bound prediction (docs/scaling.md, "The cores' rate
    from two rows")."""
    values = [v for link in CORES_BOUND_LINKS for v in passes.get((2, link, "allreduce_16777216B_busbw"), [])]
    return 2 * statistics.median(values) * 1e6


def check(path):
    passes = read_passes(path)
    rows = {key: statistics.median(values) for key, values in passes.items()}
    # Calibration, from the unshaped 2-host run: the machine's aggregate
    # data-plane rate (two ranks streaming at once), the data-parallel
    # demo's forward+backward per rank, the pipeline's work per micro-batch.
    machine_bps = cores_rate(passes)
    dp2 = rows[(2, "none", "data_parallel_samples")]
    t_fb = DP_BATCH * 2 / dp2  # two ranks, a core each, the allreduce nearly free
    pp2 = rows[(2, "none", "pipeline_samples")]
    hop2 = PP_ACT_BYTES * 8 / per_rank_rate(rows[(2, "none", "iperf3")] * 1e6, 2, machine_bps) + PP_HANDOFF_S
    low, high = 0.0, PP_BATCH / pp2  # the work per micro-batch whose predicted step is the measured one
    for _ in range(60):
        w = (low + high) / 2
        low, high = (w, high) if pipeline_step(2, PP_MICRO, w, CORES, hop2) < PP_BATCH / pp2 else (low, w)
    # The time of one ring step on this machine, per host count, from the
    # unshaped run's 64 KiB allreduce (its bandwidth term taken off): with
    # more ranks than cores a step waits for its rank to be scheduled.
    alpha = {}
    for n in sorted({k[0] for k in rows}):
        t = rows.get((n, "none", "allreduce_65536B_time"))
        if t:
            bw = 2 * (n - 1) / n * 65536 * 8 / per_rank_rate(1e12, n, machine_bps)
            alpha[n] = max(ALPHA_FLOOR_S, (t * 1e-6 - bw) / (2 * (n - 1)))
    print(f"# calibrated (hosts=2, rate=none; the machine's rate also from rate=25gbit): machine {machine_bps / 1e9:.2f} Gbit/s, "
          f"data-parallel forward+backward {t_fb * 1e3:.1f} ms/rank, pipeline work {w * 1e3:.1f} ms/micro-batch; "
          f"ring step (rate=none, 64 KiB) " + ", ".join(f"{n} hosts {a * 1e3:.2f} ms" for n, a in alpha.items()))
    print(f"{'hosts':>5} {'rate':>7} {'what':<30} {'measured':>10} {'predicted':>10} {'error':>7} {'spread':>7}  bound")
    errors = []
    for (n, rate, what), value in sorted(rows.items()):
        link = rows.get((n, rate, "iperf3"), rows.get((2, rate, "iperf3"), 0)) * 1e6
        if what == "iperf3" or what.endswith("_time") or not link:
            continue
        r = per_rank_rate(link, n, machine_bps)
        a = alpha.get(n, ALPHA_S)
        bound = "link" if r == link else "cores"
        if what in ("stream_4MiB", "ping_pong_4MiB"):  # measured against iperf3, not the model
            note = "target 0.9" if what == "stream_4MiB" else "round trips"
            ratios = pass_ratios(passes[(n, rate, what)], passes.get((n, rate, "iperf3"), []))
            if len(ratios) > 1:
                note += f"; passes {min(ratios):.3f}-{max(ratios):.3f}"
            print(f"{n:>5} {rate:>7} {what:<30} {value:>10.1f} {'':>10} {'':>7} {spread(passes[(n, rate, what)]):>7.0%}  "
                  f"{value / (link / 1e6):.2f}x of iperf3 ({note})")
            continue
        if what.startswith("allreduce_"):
            size = int(what.split("_")[-2][:-1])
            time = automatic_time if what.startswith("allreduce_auto_") else ring_time
            pred = 2 * (n - 1) / n * size * 8 / time(size, n, r, a) / 1e6
            if size < 1 << 20:
                bound = "latency"
        elif what == "data_parallel_samples":
            pred = dp_samples(n, r, t_fb, a)
            bound = "cores" if n > CORES else "compute"
        elif what == "pipeline_samples":
            pred = pp_samples(n, r, w)
            bound = "cores" if n > CORES else "bubble"
        else:
            continue
        err = (value - pred) / pred
        fit = (n == 2 and rate in CORES_BOUND_LINKS and what == "allreduce_16777216B_busbw") or \
              ((n, rate) == (2, "none") and what in ("data_parallel_samples", "pipeline_samples")) or \
              (rate == "none" and what == "allreduce_65536B_busbw")
        if not fit:
            errors.append((abs(err), spread(passes[(n, rate, what)])))
        print(f"{n:>5} {rate:>7} {what:<30} {value:>10.1f} {pred:>10.1f} {err:>+7.0%} "
              f"{spread(passes[(n, rate, what)]):>7.0%}  {bound}{' (fit)' if fit else ''}")
    within = sum(1 for e in errors if e[0] <= 0.2)
    print(f"# {within} of {len(errors)} predictions within 20%; median |error| "
          f"{sorted(e[0] for e in errors)[len(errors) // 2]:.0%}")
    if max(len(v) for v in passes.values()) > 1:
        # A row whose own passes lie more than 20% apart cannot be held
        # to 20% by any model: the spread is the run's, not the model's.
        spreads = sorted(e[1] for e in errors)
        missed = [e for e in errors if e[0] > 0.2]
        print(f"# the passes' spread: median {spreads[len(spreads) // 2]:.0%}, over 20% in "
              f"{sum(1 for x in spreads if x > 0.2)} of {len(spreads)} rows and in "
              f"{sum(1 for e in missed if e[1] > 0.2)} of the {len(missed)} rows outside 20%")


def extrapolate():
    """Step time and scaling efficiency at 64 and 256 hosts (docs/scaling.md,
    "Beyond this machine"): one rank per host, a GPU's compute per step, the
    ring over each host's link."""
    print(f"{'model':<26} {'link':>7} {'hosts':>5} {'allreduce ms':>12} {'step ms':>8} {'efficiency':>10}")
    models = [("ResNet-50 (25.6M, 64/GPU)", 25.6e6 * 4, 0.110, 0.7), ("BERT-large (340M)", 340e6 * 4, 0.450, 0.7)]
    for name, grad_bytes, compute_s, hidden in models:
        for link_gbit in (10, 25, 100):
            rate = link_gbit * 1e9 * 0.94  # TCP's goodput at MTU 1500, as iperf3 measured here
            for n in (8, 64, 256):
                t_ar = ring_time(grad_bytes, n, rate, alpha=25e-6)
                exposed = max(0.0, t_ar - hidden * compute_s)
                step = compute_s + exposed
                print(f"{name:<26} {link_gbit:>5}G {n:>5} {t_ar * 1e3:>12.1f} {step * 1e3:>8.1f} {compute_s / step:>10.0%}")


def self_test():
    """The played pipeline schedule against what is known in closed form."""
    def near(a, b):
        return abs(a - b) <= 1e-9 * max(1.0, abs(b))
    failures = []
    for p in (1, 2, 3, 4, 6):
        for m in (1, 4, 8):
            textbook = (m + p - 1) / p  # enough cores, no link time
            got = pipeline_step(p, m, 1.0, cores=p)
            if not near(got, textbook):
                failures.append(f"p={p} m={m} on {p} cores: {got}, the textbook says {textbook}")
            shared = pipeline_step(p, m, 1.0, cores=2)
            low, high = max(textbook, m / min(p, 2)), (m + p - 1) / min(p, 2)
            if not low - 1e-9 <= shared <= high + 1e-9:
                failures.append(f"p={p} m={m} on 2 cores: {shared}, outside [{low}, {high}]")
            one_core = pipeline_step(p, m, 1.0, cores=1)
            if not near(one_core, m):  # one core: all the work, one operation after another
                failures.append(f"p={p} m={m} on 1 core: {one_core}, want {m}")
    # A link time per hop on 2 stages, m = 1: forward, hop, forward, backward, hop, backward.
    if not near(pipeline_step(2, 1, 1.0, cores=2, hop=0.5), 1.0 + 2 * 0.5):
        failures.append(f"2 stages, 1 micro-batch, hop 0.5: {pipeline_step(2, 1, 1.0, cores=2, hop=0.5)}, want 2.0")
    # Halving-doubling: 2 log2 n steps where the ring takes 2 (n - 1), the same bytes; a fold adds two whole vectors.
    if not near(halving_doubling_time(0, 8, 1e9, alpha=1.0), 6.0) or not near(ring_time(0, 8, 1e9, alpha=1.0), 14.0):
        failures.append("8 ranks: halving-doubling must take 6 steps, the ring 14")
    if not near(halving_doubling_time(1e9 / 8, 6, 1e9, alpha=0.0), 2 * 3 / 4 + 2):
        failures.append(f"6 ranks fold into 4: {halving_doubling_time(1e9 / 8, 6, 1e9, alpha=0.0)}, want 3.5")
    if automatic_time(1 << 20, 8, 1e9) != ring_time(1 << 20, 8, 1e9) or \
            automatic_time(256 << 10, 8, 1e9) != halving_doubling_time(256 << 10, 8, 1e9) or \
            automatic_time(128 << 10, 6, 1e9) != ring_time(128 << 10, 6, 1e9):
        failures.append("automatic's bounds: halving-doubling to 256 KiB on 8 ranks, the ring above and at 128 KiB on 6")
    # K: the median of both cores-bound links' passes, not of one row.
    ring16 = "allreduce_16777216B_busbw"
    k = cores_rate({(2, "none", ring16): [7000.0, 7600.0, 6800.0], (2, "25gbit", ring16): [8100.0, 7050.0, 8900.0],
                    (2, "10gbit", ring16): [1.0, 1.0, 1.0]})
    if not near(k, 2 * 7325.0 * 1e6):
        failures.append(f"the cores' rate from both links' six passes: {k}, want {2 * 7325.0 * 1e6}")
    if not near(spread([800.0, 1000.0, 900.0]), 0.25):
        failures.append(f"spread of 800, 1000, 900: {spread([800.0, 1000.0, 900.0])}, want 0.25")
    if pass_ratios([900.0, 950.0], [1000.0, 950.0]) != [0.9, 1.0] or pass_ratios([900.0, 950.0], [1000.0]):
        failures.append("each pass's stream over the same pass's iperf3, and none when a pass lacks it")
    for f in failures:
        print("FAIL", f)
    print("scaling_model self-test:", "FAILED" if failures else "OK")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    if len(sys.argv) == 2 and sys.argv[1] == "--extrapolate":
        extrapolate()
    elif len(sys.argv) == 2:
        check(sys.argv[1])
    else:
        print(__doc__)
        sys.exit(2)
