"""Jupiter's parallelism planning (core/planning/partition.py): Eq. 1 and Eq. 2-4 against brute force,
the checks' messages, and the planning times the issue asks for."""

import time
from itertools import combinations

import numpy as np
import pytest

from edge_llm_ros.core.planning.partition import (
    ModelCost,
    PartitionError,
    StageDevice,
    check_memory,
    check_ranges,
    interpolated_cost,
    plan_layers,
    plan_sequence,
    sequence_plans,
)


def prefix_cost(alpha, beta, gamma):
    """q(x, p) = α + β x + γ x (p + x/2): fixed overhead, per-row work, and attention to the p
    cached rows plus (on average) half the chunk's own rows, so later chunks are heavier."""
    return lambda x, p: alpha + beta * x + gamma * x * (p + x / 2)


# -- Eq. 1 --------------------------------------------------------------------------------------


def random_pipeline(rng):
    """Heterogeneous devices (speeds differ up to 6x, links, embedding/head times) and budgets
    drawn around an even share of the model, so some splits (or all) do not fit."""
    num_stages = int(rng.integers(1, 5))
    num_layers = int(rng.integers(num_stages, 10))
    layer_bytes = rng.integers(50, 150, num_layers).tolist()
    model = ModelCost(layer_bytes, embed_bytes=int(rng.integers(0, 100)), head_bytes=int(rng.integers(0, 100)))
    share = (sum(layer_bytes) + model.embed_bytes + model.head_bytes) / num_stages
    devices = [
        StageDevice(
            name=f"jetson-{n}",
            layer_s=(rng.uniform(0.5, 3.0) * rng.uniform(0.5, 1.5, num_layers)).tolist(),
            memory_bytes=int(rng.uniform(0.7, 2.5) * share),
            link_s=float(rng.uniform(0.0, 0.5)),
            embed_s=float(rng.uniform(0.0, 1.0)),
            head_s=float(rng.uniform(0.0, 1.0)),
        )
        for n in range(num_stages)
    ]
    return devices, model


def brute_force_layers(devices, model):
    """Every split of the layers into len(devices) contiguous non-empty stages, costed from the
    paper's definitions: (bottleneck ignoring memory, least bottleneck that fits or inf)."""
    num_layers, last = len(model.layer_bytes), len(devices) - 1
    unconstrained, fitting = np.inf, np.inf
    for cuts in combinations(range(1, num_layers), last):
        bounds = (0, *cuts, num_layers)
        seconds, fits = [], True
        for n, device in enumerate(devices):
            a, b = bounds[n], bounds[n + 1]
            t = sum(device.layer_s[a:b]) + (device.embed_s if n == 0 else 0.0)
            t += device.head_s if n == last else device.link_s
            held = sum(model.layer_bytes[a:b]) + (model.embed_bytes if n == 0 else 0)
            held += model.head_bytes if n == last else 0
            seconds.append(t)
            fits = fits and held <= device.memory_bytes
        unconstrained = min(unconstrained, max(seconds))
        if fits:
            fitting = min(fitting, max(seconds))
    return unconstrained, fitting


def test_layer_partition_matches_brute_force():
    rng = np.random.default_rng(0)
    outcomes = {"fits as if unbounded": 0, "memory moved the optimum": 0, "nothing fits": 0}
    for _ in range(300):
        devices, model = random_pipeline(rng)
        unconstrained, best = brute_force_layers(devices, model)
        if best == np.inf:
            outcomes["nothing fits"] += 1
            with pytest.raises(PartitionError, match="no partition of"):
                plan_layers(devices, model)
            continue
        outcomes["memory moved the optimum" if best > unconstrained else "fits as if unbounded"] += 1
        plan = plan_layers(devices, model)
        assert plan.bottleneck_s == pytest.approx(best, rel=1e-12)
        check_ranges(plan.ranges, len(model.layer_bytes))  # the ranges tile the layers
        check_memory(plan.ranges, devices, model)  # and fit, with the bottleneck their own
        assert plan.devices == tuple(d.name for d in devices)
    assert all(count >= 10 for count in outcomes.values()), outcomes


def test_stage_times_pay_the_link_except_on_the_last_stage():
    fast = StageDevice("fast", [1.0] * 6, memory_bytes=100, link_s=1.0, embed_s=0.0)
    slow = StageDevice("slow", [2.0] * 6, memory_bytes=100, link_s=10.0, head_s=0.5)
    plan = plan_layers([fast, slow], ModelCost([10] * 6, embed_bytes=5, head_bytes=7))
    # fast: 4 layers + its hop = 5 s; slow: 2 layers + head = 4.5 s (its own link is never sent)
    assert plan.ranges == (range(0, 4), range(4, 6))
    assert plan.stage_s == (5.0, 4.5) and plan.bottleneck_s == 5.0
    assert plan.stage_bytes == (45, 27)


def test_a_device_too_small_for_its_fewest_layers_is_named():
    devices = [
        StageDevice("jetson-1", [1.0] * 30, memory_bytes=4 * 10**9),
        StageDevice("jetson-2", [1.0] * 30, memory_bytes=256 * 10**6),
        StageDevice("jetson-3", [1.0] * 30, memory_bytes=300 * 10**6),
    ]
    model = ModelCost([100 * 10**6] * 30, embed_bytes=50 * 10**6, head_bytes=312 * 10**6)
    # jetson-2 (a middle stage) can hold one layer; jetson-3 as the last stage needs a layer + head.
    with pytest.raises(PartitionError) as err:
        plan_layers(devices, model)
    assert str(err.value) == (
        "no partition of 30 layers fits: jetson-3 needs at least 412 MB for its fewest layers "
        "(layer 29 + head), budget 300 MB"
    )


def test_too_little_memory_in_all_is_reported_as_such():
    devices = [StageDevice(f"jetson-{n}", [1.0] * 8, memory_bytes=300) for n in range(2)]
    with pytest.raises(PartitionError, match=r"the model needs 820 B with embedding and head, the 2 "
                                             r"devices' budgets total 600 B"):
        plan_layers(devices, ModelCost([100] * 8, embed_bytes=10, head_bytes=10))
    # Enough bytes in all, but whole layers do not pack: 150 B holds one 100 B layer, not two.
    devices = [StageDevice(f"jetson-{n}", [1.0] * 3, memory_bytes=150) for n in range(2)]
    with pytest.raises(PartitionError, match="no split at whole layers"):
        plan_layers(devices, ModelCost([100] * 3))


def test_bad_device_lists_are_refused():
    model = ModelCost([1] * 4)
    with pytest.raises(PartitionError, match="4 layers cannot fill 5 stages"):
        plan_layers([StageDevice(f"d{n}", [1.0] * 4, 10) for n in range(5)], model)
    with pytest.raises(PartitionError, match="d1 has 3 layer times for a 4-layer model"):
        plan_layers([StageDevice("d0", [1.0] * 4, 10), StageDevice("d1", [1.0] * 3, 10)], model)


@pytest.mark.slow  # bounds a duration: the serial pass, with a margin for a loaded 2-core machine
@pytest.mark.serial
def test_thirty_two_layers_over_eight_devices_plan_in_well_under_a_second():
    rng = np.random.default_rng(1)
    devices = [
        StageDevice(f"jetson-{n}", rng.uniform(0.01, 0.05, 32).tolist(), memory_bytes=2 * 10**9, link_s=0.003)
        for n in range(8)
    ]
    model = ModelCost([200 * 10**6] * 32, embed_bytes=100 * 10**6, head_bytes=150 * 10**6)
    start = time.perf_counter()
    plan = plan_layers(devices, model)
    elapsed = time.perf_counter() - start
    print(f"plan_layers 32 layers x 8 devices: {elapsed * 1e3:.2f} ms")
    assert elapsed < 1.0
    assert len(plan.ranges) == 8 and plan.ranges[-1].stop == 32


# -- the checks ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "ranges, message",
    [
        ((range(0, 13), range(10, 20), range(20, 32)), "layers 10-12 are in stage 0 and stage 1"),
        ((range(0, 7), range(8, 32)), "layer 7 is in no stage"),
        ((range(2, 32),), "layers 0-1 are in no stage"),
        ((range(0, 30),), "layers 30-31 are in no stage"),
        ((range(0, 16), range(16, 33)), r"stage 1 holds layers 16-32 but the model has 32 layers \(0-31\)"),
        ((range(-1, 16), range(16, 32)), "stage 0 holds layers -1-15 but the model has 32 layers"),
        ((range(0, 16), range(16, 16), range(16, 32)), r"stage 1 \(range\(16, 16\)\) holds no layers"),
        ((range(16, 32), range(0, 16)), "not in ascending order: stage 1 starts at layer 0, before stage 0"),
        ((range(0, 32, 2),), "stage 0 .* skips layers"),
        ((), "no stages given"),
    ],
)
def test_check_ranges_names_stages_and_layers(ranges, message):
    with pytest.raises(PartitionError, match=message):
        check_ranges(ranges, 32)


def test_check_memory_names_each_device_over_budget():
    devices = [
        StageDevice("jetson-1", [1.0] * 5, memory_bytes=250),
        StageDevice("jetson-2", [1.0] * 5, memory_bytes=1000),
        StageDevice("jetson-3", [1.0] * 5, memory_bytes=190),
    ]
    model = ModelCost([100] * 5, embed_bytes=60, head_bytes=80)
    check_memory((range(0, 1), range(1, 4), range(4, 5)), devices, model)  # 160, 300, 180 B: fits
    with pytest.raises(PartitionError) as err:
        check_memory((range(0, 2), range(2, 3), range(3, 5)), devices, model)
    assert str(err.value) == (
        "over memory budget: jetson-1 (stage 0, layers 0-1 + embedding) needs 260 B, budget 250 B; "
        "jetson-3 (stage 2, layers 3-4 + head) needs 280 B, budget 190 B"
    )
    with pytest.raises(PartitionError, match="2 stages for 3 devices"):
        check_memory((range(0, 2), range(2, 5)), devices, model)


# -- Eq. 2-4 ------------------------------------------------------------------------------------


def compositions(total, parts, smallest):
    """[n, parts]: every ordered way to write total as parts integers, each >= smallest."""
    rows = [np.diff((0, *cuts, total)) for cuts in combinations(range(1, total), parts - 1)]
    return np.array([row for row in rows if row.min() >= smallest]).reshape(-1, parts)


def brute_force_chunks(prompt_len, q, num_stages, min_chunk):
    """Per k: W (the least slowest chunk over every split) and the range of Eq. 4 latencies
    over the splits that reach it (ties in W leave the sum of the h_i open)."""
    out = {}
    for k in range(1, min(4 * num_stages, prompt_len // min_chunk) + 1):
        rows = compositions(prompt_len, k, min_chunk)  # [n, k]
        h = q(rows, np.cumsum(rows, axis=1) - rows)
        slowest = h.max(axis=1)
        best = slowest.min()
        tied = slowest <= best * (1 + 1e-12)
        latency = h[tied].sum(axis=1) + (num_stages - 1) * best
        out[k] = best, latency.min(), latency.max()
    return out


def test_compositions_are_all_the_splits():
    assert sorted(map(tuple, compositions(5, 2, 2))) == [(2, 3), (3, 2)]
    assert len(compositions(10, 3, 1)) == 36  # C(9, 2)
    assert (compositions(10, 3, 2).sum(axis=1) == 10).all() and compositions(10, 3, 2).min() == 2


def test_sequence_partition_matches_brute_force():
    rng = np.random.default_rng(2)
    exact = 0  # cases where W's optimum is unique enough to pin Eq. 4 exactly
    for _ in range(150):
        prompt_len, min_chunk, num_stages = int(rng.integers(1, 15)), int(rng.integers(1, 4)), int(rng.integers(1, 5))
        q = prefix_cost(*rng.uniform([0.0, 0.1, 0.0], [2.0, 1.0, 0.3]))
        plans = sequence_plans(prompt_len, q, num_stages, min_chunk)
        if prompt_len < min_chunk:
            assert [p.chunks for p in plans] == [(prompt_len,)]
            continue
        brute = brute_force_chunks(prompt_len, q, num_stages, min_chunk)
        assert [p.k for p in plans] == list(brute)
        for plan in plans:
            best, low, high = brute[plan.k]
            assert sum(plan.chunks) == prompt_len and min(plan.chunks) >= min_chunk
            assert plan.slowest_s == pytest.approx(best, rel=1e-12)  # Eq. 2-3: W
            assert low * (1 - 1e-12) <= plan.latency_s <= high * (1 + 1e-12)  # Eq. 4 for this k
            exact += low == pytest.approx(high, rel=1e-12)
        chosen = plan_sequence(prompt_len, q, num_stages, min_chunk)
        assert chosen.latency_s == min(p.latency_s for p in plans)
        assert min(low for _, low, _ in brute.values()) <= chosen.latency_s * (1 + 1e-12)
        assert chosen.latency_s <= min(high for _, _, high in brute.values()) * (1 + 1e-12)
    assert exact >= 100


def test_balanced_chunks_shrink_as_the_prefix_grows():
    """Jupiter Fig. 7: later chunks attend to more cached rows, so balancing makes them shorter."""
    q = prefix_cost(1e-3, 2e-5, 1e-7)
    plan = sequence_plans(1024, q, num_stages=4, min_chunk=16)[7]  # k = 8
    assert plan.k == 8 and sum(plan.chunks) == 1024
    assert all(a >= b for a, b in zip(plan.chunks, plan.chunks[1:])) and plan.chunks[0] > plan.chunks[-1]
    equal = np.full(8, 128)
    assert plan.slowest_s < q(equal, np.cumsum(equal) - equal).max()
    assert max(plan.chunk_s) - min(plan.chunk_s) < 0.05 * plan.slowest_s


def test_more_stages_favour_more_chunks():
    q = prefix_cost(1e-3, 2e-5, 1e-8)
    alone = plan_sequence(512, q, num_stages=1, min_chunk=16)
    piped = plan_sequence(512, q, num_stages=8, min_chunk=16)
    assert alone.k == 1  # one stage: chunking only adds per-chunk overhead
    assert piped.k > 1 and piped.latency_s < 8 * alone.latency_s
    assert piped.latency_s == pytest.approx(sum(piped.chunk_s) + 7 * piped.slowest_s)


def test_a_prompt_shorter_than_min_chunk_is_one_chunk():
    q = prefix_cost(1.0, 0.5, 0.0)
    plan = plan_sequence(5, q, num_stages=3, min_chunk=16)
    assert plan.chunks == (5,) and plan.k == 1
    assert plan.chunk_s == (3.5,) and plan.latency_s == 3 * 3.5
    with pytest.raises(PartitionError, match="the prompt is empty"):
        plan_sequence(0, q, num_stages=3)


def test_chunk_count_is_capped_by_stages_and_min_chunk():
    q = prefix_cost(0.0, 1.0, 0.0)  # chunking is free here, so the search would use every k
    assert [p.k for p in sequence_plans(100, q, num_stages=2, min_chunk=1)] == list(range(1, 9))  # 4|D|
    assert [p.k for p in sequence_plans(100, q, num_stages=8, min_chunk=30)] == [1, 2, 3]  # y // b


def test_interpolated_cost_is_exact_for_a_bilinear_profile():
    def f(x, p):
        return 1.0 + 2.0 * x + 3.0 * p + 0.5 * x * p

    rows, prefix = [1, 8, 64], [0, 128, 512, 1024]
    q = interpolated_cost(rows, prefix, [[f(x, p) for p in prefix] for x in rows])
    x, p = np.array([1, 5, 40, 64, 200]), np.array([0, 77, 600, 1024, 3000])  # on, between, beyond
    assert np.allclose(q(x, p), f(x, p))
    assert float(q(8, 128)) == f(8, 128)
    with pytest.raises(ValueError, match="strictly ascending"):
        interpolated_cost([1, 1], [0, 1], [[1, 2], [3, 4]])
    with pytest.raises(ValueError, match="shape"):
        interpolated_cost([1, 2], [0, 1], [[1, 2]])


def test_interpolated_cost_never_goes_negative():
    q = interpolated_cost([16, 32], [0, 512], [[0.010, 0.020], [0.030, 0.040]])
    assert float(q(1, 0)) == 0.0  # the line through 16 and 32 rows crosses zero above one row


@pytest.mark.slow  # bounds a duration: the serial pass, with a margin for a loaded 2-core machine
@pytest.mark.serial
def test_a_2048_token_prompt_over_eight_stages_plans_within_seconds():
    rows, prefix = np.array([1, 16, 64, 256, 1024, 2048]), np.array([0, 256, 1024, 2048])
    polynomial = prefix_cost(2e-3, 3e-5, 2e-8)
    profiled = interpolated_cost(rows, prefix, polynomial(rows[:, None], prefix[None, :]))  # as measured on a grid
    for name, q in (("polynomial", polynomial), ("interpolated", profiled)):
        start = time.perf_counter()
        plan = plan_sequence(2048, q, num_stages=8, min_chunk=32)
        elapsed = time.perf_counter() - start
        print(f"plan_sequence y=2048, 8 stages, k <= 32, {name} q: {elapsed * 1e3:.0f} ms, k = {plan.k}")
        assert elapsed < 5.0  # 0.5 s and 1.3 s on the loaded 2-core machine
        assert sum(plan.chunks) == 2048 and 1 < plan.k <= 32
