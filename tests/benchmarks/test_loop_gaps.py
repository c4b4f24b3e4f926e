"""benchmarks/loop_gaps.py's reading of a profiler trace: busy time, idle stretches and their causes."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from benchmarks.loop_gaps import (dependent_kernels, gap_causes, gaps_us, outside_chain, request_figures, request_spans,
                                  top_kernels, union_us)

intervals = st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 200)).map(lambda t: (t[0], t[0] + t[1])),
                     max_size=30)


@given(intervals)
def test_busy_and_idle_add_up_to_the_span(spans):
    """Inside [0, 1200]: the union of the intervals and the stretches none covers add up to the whole."""
    assert union_us(spans) + sum(gaps_us(spans, 0, 1200)) == 1200
    assert union_us(spans + spans) == union_us(spans)  # an overlap counts once


def _trace():
    """One request on the host (drawn again on the device's timeline, as the profiler does): a graph launched
    early (kernel 1), a blocking wait, then a graph launched late (kernel 2), inside a Python frame."""
    return [
        {"name": "request", "cat": "user_annotation", "ts": 0, "dur": 1000},
        {"name": "request", "cat": "gpu_user_annotation", "ts": 0, "dur": 1000},
        {"name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 5, "dur": 3, "args": {"correlation": 1}},
        {"name": "k1", "cat": "kernel", "ts": 10, "dur": 100, "args": {"correlation": 1}},
        {"name": "cudaEventSynchronize", "cat": "cuda_runtime", "ts": 50, "dur": 70, "args": {"correlation": 7}},
        {"name": "engine/runtime/generate.py(250): _loop", "cat": "python_function", "ts": 0, "dur": 900},
        {"name": "engine/runtime/cuda_graphs.py(150): run", "cat": "python_function", "ts": 125, "dur": 160},
        {"name": "cudaGraphLaunch", "cat": "cuda_runtime", "ts": 280, "dur": 3, "args": {"correlation": 2}},
        {"name": "k2", "cat": "kernel", "ts": 300, "dur": 100, "args": {"correlation": 2}},
    ]


def test_a_request_is_read_once_from_the_hosts_range():
    assert request_spans(_trace()) == [(0, 1000)]
    (fig,) = request_figures(_trace(), 3.0)
    assert fig["busy_us"] == 200 and fig["graph_launches"] == 2 and fig["blocking_calls"] == 1
    assert fig["largest_gaps_us"][:2] == [600, 190]


def test_a_late_launch_is_named_with_the_wait_before_it_and_where_the_host_was():
    (cause,) = gap_causes(_trace(), 3.0)
    assert cause == {"launched": "late", "by": "cudaGraphLaunch", "after_blocking": "cudaEventSynchronize",
                     "host_in": "_loop < run", "count": 1, "total_us": 190, "median_us": 190}


def test_kernels_are_summed_per_step():
    rows = top_kernels(_trace(), steps=2)
    assert [(r["name"], r["us_per_step"], r["calls_per_step"]) for r in rows] == [("k1", 50.0, 0.5), ("k2", 50.0, 0.5)]


def test_work_outside_a_dependent_chain_is_every_kernel_but_inductors_and_ours():
    """cuBLAS and copies inside the request are listed (most launches first); inductor's ``triton_*`` kernels, ours
    and anything outside the request are not."""
    trace = _trace() + [
        {"name": "triton_poi_fused_add_0", "cat": "kernel", "ts": 420, "dur": 5},
        {"name": "gemv_kernel", "cat": "kernel", "ts": 430, "dur": 5},
        {"name": "nvjet_sm90_tst_64x40", "cat": "kernel", "ts": 440, "dur": 4},
        {"name": "nvjet_sm90_tst_64x40", "cat": "kernel", "ts": 450, "dur": 4},
        {"name": "Memcpy DtoD", "cat": "gpu_memcpy", "ts": 460, "dur": 2},
        {"name": "nvjet_sm90_tst_64x40", "cat": "kernel", "ts": 1500, "dur": 4},  # after the request
    ]
    rows = outside_chain(trace, steps=2, ours=frozenset({"gemv_kernel", "k1", "k2"}))
    assert [(r["name"], r["us_per_step"], r["calls_per_step"]) for r in rows] == [
        ("nvjet_sm90_tst_64x40", 4.0, 1.0), ("Memcpy DtoD", 1.0, 0.5)]


def test_our_dependent_kernels_are_read_off_the_kernel_modules():
    """Every kernel of ours that takes the PDL constexpr (the GEMV, both attention kernels, the cycle's), or none
    without Triton."""
    from tests.conftest import has_triton

    names = dependent_kernels()
    expected = {"gemv_kernel", "attention_kernel", "attention_combine_kernel", "expand_select_kernel",
                "expand_blocks_kernel", "emit_advance_kernel", "greedy_commit_kernel"}
    assert expected <= names if has_triton() else names == frozenset()
