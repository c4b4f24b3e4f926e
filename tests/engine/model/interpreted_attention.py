"""The Triton decode attention run by Triton's interpreter on CPU tensors, against SDPA in float32
(``test_decode_attention.py`` runs this module in a subprocess with ``TRITON_INTERPRET=1``; it needs Triton).

Hypothesis draws the shapes (batch, KV heads, group, query rows, head dim, cache slots: never a multiple of
the block on purpose), the plan (block of slots, splits) and the mask: a prefix mask (a decode or a chain
verify at a random used length) or a tree mask (each node sees the committed prefix, its ancestors and
itself), with the rows' used lengths drawn apart so many blocks are all False. K and V of the all-False
blocks are filled with NaN: the kernel skipping them is what keeps the output finite. The cases run twice: the
splits merged by the second kernel, then by the last split in the same launch (at every row count:
``decode_attention_kernels.ONE_LAUNCH_ROWS``).
"""

from __future__ import annotations

import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eaglelab.engine.model import decode_attention as A
from eaglelab.engine.model import decode_attention_kernels as AK  # Triton: run under its interpreter
from eaglelab.engine.model.tickets import made

DTYPE = torch.float16  # the interpreter's tl.dot misreads bfloat16
EVERY_ROW = 1 << 20  # ONE_LAUNCH_ROWS at which every split cut merges in its own launch


@st.composite
def cases(draw):
    B = draw(st.integers(1, 3))
    KVH = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 3, 4]))
    T = draw(st.sampled_from([1, 2, 3, 4, 5, 16, 24, 40]))  # group 4 x 40 = 160 rows: two blocks of rows
    D = draw(st.sampled_from([16, 32, 64]))
    block_s = draw(st.sampled_from([16, 32, 64, 128]))  # 64 and 128: the 8B verify's cuts
    S = draw(st.integers(T + 1, 150))
    splits = draw(st.integers(1, 5))
    tree = T > 1 and draw(st.booleans())
    used = [draw(st.integers(0, S - T)) for _ in range(B)]  # committed slots before the new rows, per row
    parents = [draw(st.integers(-1, i - 1)) for i in range(T)] if tree else None
    seed = draw(st.integers(0, 2**16))
    return B, KVH, group, T, D, block_s, S, splits, used, parents, seed


def make_mask(B: int, T: int, S: int, used: list[int], parents: list[int] | None) -> torch.Tensor:
    """[B, T, S]: the committed prefix of each row, then (prefix mask) every new slot up to the row's own, or
    (tree mask) the row's ancestors and itself. Example: used [2], T 3, parents [-1, 0, 0] -> row 2 sees
    slots 0, 1 (prefix), 2 (node 0) and 4 (itself), not 3 (its sibling)."""
    mask = torch.zeros(B, T, S, dtype=torch.bool)
    for b, n in enumerate(used):
        mask[b, :, :n] = True
        for t in range(T):
            if parents is None:
                mask[b, t, n:n + t + 1] = True
            else:
                node = t
                while node >= 0:
                    mask[b, t, n + node] = True
                    node = parents[node]
    return mask


def poison_skipped_blocks(k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, block_s: int) -> int:
    """NaN into K and V of every (row, block) the mask leaves all False for every query. -> blocks poisoned."""
    S, poisoned = k.shape[2], 0
    for b in range(k.shape[0]):
        for start in range(0, S, block_s):
            if not mask[b, :, start:start + block_s].any():
                k[b, :, start:start + block_s] = float("nan")
                v[b, :, start:start + block_s] = float("nan")
                poisoned += 1
    return poisoned


CHECKED = {"cases": 0, "poisoned": 0, "split": 0, "tree": 0, "wide": 0, "row_blocks": 0}


@settings(max_examples=int(sys.argv[1]) if len(sys.argv) > 1 else 60, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
@given(cases())
def test_kernel_matches_sdpa(case):
    B, KVH, group, T, D, block_s, S, splits, used, parents, seed = case
    g = torch.Generator().manual_seed(seed)
    NH = KVH * group
    q = torch.randn(B, T, NH, D, generator=g).to(DTYPE).transpose(1, 2)  # [B, NH, T, D] strided as the model's
    cache = torch.randn(2, B, KVH, S + 3, D, generator=g).to(DTYPE)  # a layer view of a bigger buffer
    k, v = cache[0, :, :, :S], cache[1, :, :, :S]
    mask = make_mask(B, T, S, used, parents)
    ref = A.sdpa(q.float(), k.float(), v.float(), mask)  # before the poison
    poisoned = poison_skipped_blocks(k, v, mask, block_s)
    out = torch.ops.eaglelab.decode_attention(q, k, v, mask, block_s, splits, 4)
    assert out.shape == (B, NH, T, D) and out.dtype == DTYPE
    assert out.transpose(1, 2).is_contiguous(), "stored [B, T, NH, D]: the o projection reads a view"
    err = (out.float() - ref).abs().max().item()
    assert err <= 4e-3, (case, err)
    CHECKED["cases"] += 1
    CHECKED["poisoned"] += poisoned > 0
    CHECKED["split"] += splits > 1 and S > block_s
    CHECKED["tree"] += parents is not None
    CHECKED["wide"] += block_s >= 64 and S > block_s  # the 8B verify's 64- and 128-slot blocks, over several blocks
    CHECKED["row_blocks"] += group * T > 64  # the rows in several programs


def check_fully_masked_row_gives_zeros() -> None:
    """A row that may attend to nothing: zeros (SDPA: NaN), in one split and in several."""
    q = torch.randn(1, 2, 2, 16).to(DTYPE)
    k, v = torch.randn(2, 1, 1, 40, 16).to(DTYPE)
    mask = torch.zeros(1, 2, 40, dtype=torch.bool)
    mask[0, 0, :5] = True  # row 0 sees 5 slots, row 1 none
    for splits, one_launch in ((1, False), (3, False), (3, True)):
        AK.ONE_LAUNCH_ROWS = EVERY_ROW if one_launch else 0
        try:
            out = torch.ops.eaglelab.decode_attention(q, k, v, mask, 16, splits, 4)
        finally:
            AK.ONE_LAUNCH_ROWS = 0
        assert torch.equal(out[:, :, 1], torch.zeros_like(out[:, :, 1])), splits
        ref = A.sdpa(q[:, :, :1].float(), k.float(), v.float(), mask[:, :1])
        assert (out[:, :, :1].float() - ref).abs().max().item() <= 4e-3


if __name__ == "__main__":
    A.load_op()
    AK.ONE_LAUNCH_ROWS = 0  # every split cut merged by the second kernel
    test_kernel_matches_sdpa()
    first = dict(CHECKED)
    AK.ONE_LAUNCH_ROWS = EVERY_ROW  # the same cases again, each split cut merged by its last split in the same launch
    test_kernel_matches_sdpa()
    left = made("attention", torch.device("cpu"))
    assert left is not None and not left.any(), "the merge took no ticket, or left a counter above 0"
    AK.ONE_LAUNCH_ROWS = 0
    merged = CHECKED["split"] - first["split"]
    CHECKED.update(first)
    check_fully_masked_row_gives_zeros()
    print(" ".join(f"{name} {n}" for name, n in (CHECKED | {"merged": merged}).items()))
