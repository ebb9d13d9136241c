"""The TARGET_VERIFY inputs the JETSPEC worker builds (adapter/verify_inputs.py), read by SGLang 0.5.23's
own Triton attention kernels, run on this CPU through Triton's interpreter.

The worker hands SGLang a FULL custom mask (per request N rows of width seq_len + N: prefix columns, then
the tree's ancestor-or-self columns), positions seq_len + depth, and draft_token_num = N. SGLang's Triton
backend turns that into qo_indptr / kv_indptr / kv_indices / mask_indptr / max_extend_len
(layers/attention/triton_backend.py, init_forward_metadata's is_target_verify() branch, lines 1007-1058)
and calls kernels/ops/attention/extend_attention.py:

- extend_attention_fwd (the default path, triton_backend.py:1888 via _forward_extend_kernel), with
  causal=True (triton_backend.py:1747: a decoder layer stays causal in TARGET_VERIFY) and the default
  skip_prefix_custom_mask=True: it reads only the tree columns of each mask row, at
  mask_indptr[b] + row * (seq_len_b + N) + seq_len_b + col;
- extend_attention_fwd_unified (--enable-deterministic-inference, triton_backend.py:2260): it reads the
  whole row, prefix columns included, at mask_indptr[b] + row * (seq_len_b + N) + col.

Each kernel's output is compared with dense attention under the tree mask and, independently of our
mask builder, with each node's root-to-node chain attended causally at positions seq_len, seq_len+1, ...
(rotary embeddings make that chain equality depend on the positions). Wrong layouts must not match.

Triton picks interpreter or compiler at its first import, so the kernel checks run in a child pytest
with TRITON_INTERPRET=1 set from the start (as in tests/test_triton_attention.py); in the parent run they
are skipped and test_kernel_checks_pass_under_the_interpreter reports them. No monkeypatch is needed:
on a machine without CUDA, extend_attention.py never queries the device (its CUDA_CAPABILITY lookup is
behind is_cuda()), and _get_block_sizes_for_extend_attention falls to its generic branch,
BLOCK_M = BLOCK_N = 64 for head_dim <= 128.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from sglang_jetspec.adapter.verify_inputs import VerifyTensors, build_verify_tensors
from sglang_jetspec.core.tree import DraftTree, TreeSpec, build_tree, top_k_per_depth
from tests.triton_interpreter import assert_interpreted_child_passes, interpreted_only

HEADS, KV_HEADS, DIM = 4, 2, 16  # grouped-query: two query heads per KV head
ATOL = 1e-4
# _fwd_kernel_unified divides by a zero denominator in the rows of its last BLOCK_M tile that lie past
# the request's N rows; the store masks those rows out (a NaN in a real row would fail max_diff < ATOL).
benign_tail_rows = pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")


def test_kernel_checks_pass_under_the_interpreter():
    pytest.importorskip("sglang")
    assert_interpreted_child_passes(__file__)


@pytest.fixture(scope="module")
def ea():
    pytest.importorskip("sglang")
    from sglang.kernels.ops.attention import extend_attention

    assert type(extend_attention._fwd_kernel).__name__ == "InterpretedFunction"
    assert type(extend_attention._fwd_kernel_unified).__name__ == "InterpretedFunction"
    return extend_attention


def random_tree(seed: int, budget: int, depth: int, width: int) -> DraftTree:
    gen = torch.Generator().manual_seed(seed)
    tokens, logprobs = top_k_per_depth(torch.randn(depth, 50, generator=gen) * 3, width)
    return build_tree(int(torch.randint(50, (1,), generator=gen)), tokens, logprobs, TreeSpec(budget, depth, width))


def rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding of x [T, H, D] at integer positions [T]."""
    half = x.shape[-1] // 2
    freqs = 10000.0 ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = positions.double()[:, None] * freqs[None, :]
    cos, sin = angles.cos().float()[:, None, :], angles.sin().float()[:, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@dataclass
class Batch:
    trees: list[DraftTree]
    seq_lens: list[int]
    n: int
    tensors: VerifyTensors
    q_raw: torch.Tensor  # [bs*N, H, D] before rotary
    k_raw: torch.Tensor  # [bs*N, H_kv, D] before rotary
    q: torch.Tensor  # [bs*N, H, D] at the verify positions
    k_extend: torch.Tensor  # [bs*N, H_kv, D] at the verify positions
    v_extend: torch.Tensor
    k_buffer: torch.Tensor  # [slots, H_kv, D] the token pool: prefixes, the tree rows, and junk
    v_buffer: torch.Tensor
    prefix_slots: list[torch.Tensor]  # request b's prefix slots, in position order (req_to_token row)
    out_cache_loc: torch.Tensor  # [bs*N] where the tree rows' K/V were written

    def prefix_kv(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[self.prefix_slots[b]], self.v_buffer[self.prefix_slots[b]]

    def rows(self, b: int) -> slice:
        return slice(b * self.n, (b + 1) * self.n)


def make_batch(
    seq_lens: list[int],
    budgets: list[int],
    n: int,
    depth: int,
    width: int,
    seed: int,
    positions: torch.Tensor | None = None,
) -> Batch:
    trees = [random_tree(seed + b, budget, depth, width) for b, budget in enumerate(budgets)]
    assert [t.size for t in trees] == budgets
    tensors = build_verify_tensors(trees, seq_lens, num_nodes=n)
    rows = len(seq_lens) * n
    gen = torch.Generator().manual_seed(seed)
    q_raw = torch.randn(rows, HEADS, DIM, generator=gen)
    k_raw = torch.randn(rows, KV_HEADS, DIM, generator=gen)
    v_extend = torch.randn(rows, KV_HEADS, DIM, generator=gen)
    pos = tensors.positions if positions is None else positions
    # Token pool: every prefix token and every tree row at a shuffled slot, plus junk slots nobody may
    # read (large values, so reading one shows up).
    total = sum(seq_lens) + rows
    slots = torch.randperm(total + 9, generator=gen)
    k_buffer = torch.randn(total + 9, KV_HEADS, DIM, generator=gen) * 30
    v_buffer = torch.randn(total + 9, KV_HEADS, DIM, generator=gen) * 30
    prefix_slots, start = [], 0
    for length in seq_lens:
        own = slots[start : start + length]
        start += length
        k_buffer[own] = rope(torch.randn(length, KV_HEADS, DIM, generator=gen), torch.arange(length))
        v_buffer[own] = torch.randn(length, KV_HEADS, DIM, generator=gen)
        prefix_slots.append(own)
    out_cache_loc = slots[start : start + rows]
    k_extend = rope(k_raw, pos)
    # save_kv_cache: forward_extend writes the tree rows' K/V at out_cache_loc before the kernel runs
    k_buffer[out_cache_loc], v_buffer[out_cache_loc] = k_extend, v_extend
    return Batch(
        trees,
        seq_lens,
        n,
        tensors,
        q_raw,
        k_raw,
        rope(q_raw, pos),
        k_extend,
        v_extend,
        k_buffer,
        v_buffer,
        prefix_slots,
        out_cache_loc,
    )


@dataclass
class Metadata:
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    mask_indptr: torch.Tensor
    max_extend_len: int


def target_verify_metadata(batch: Batch) -> Metadata:
    """init_forward_metadata's is_target_verify() branch (sglang 0.5.23 layers/attention/triton_backend.py
    lines 1007-1058), with num_tokens_per_req = spec_info.num_tokens_per_req = draft_token_num = N
    (ngram_info.py:35, triton_backend.py:586-590)."""
    bs, n = len(batch.seq_lens), batch.n
    seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64)
    # triton_backend.py:1010: qo_indptr = arange(0, (1 + bs) * N, step=N), int32
    qo_indptr = torch.arange(0, (1 + bs) * n, step=n, dtype=torch.int32)
    # _fill_kv_indptr_and_indices (triton_backend.py:515-534): kv_indptr (int32 buffer) = [0, cumsum(seq_lens)],
    # kv_indices (int64) = each request's req_to_token row, seq_len slots of its prefix
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
    kv_indices = torch.cat(batch.prefix_slots).to(torch.int64)
    # triton_backend.py:1052-1056: seq_mask_len = N * (seq_lens + N); mask_indptr (int64) = [0, cumsum]
    mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(n * (seq_lens + n), dim=0)
    # triton_backend.py:1058
    return Metadata(qo_indptr, kv_indptr, kv_indices, mask_indptr, max_extend_len=n)


def run_extend(ea, batch: Batch, meta: Metadata, custom_mask: torch.Tensor, causal: bool = True) -> torch.Tensor:
    """extend_attention_fwd with the arguments triton_backend.py:1888-1914 passes (no soft cap, no
    sliding window, no sinks, bf16/fp32 KV so k/v descale 1.0, sm_scale = layer.scaling)."""
    o = torch.empty_like(batch.q)
    ea.extend_attention_fwd(
        batch.q,
        batch.k_extend.contiguous(),
        batch.v_extend.contiguous(),
        o,
        batch.k_buffer,
        batch.v_buffer,
        meta.qo_indptr,
        meta.kv_indptr,
        meta.kv_indices,
        custom_mask,
        causal,
        meta.mask_indptr,
        meta.max_extend_len,
        1.0,
        1.0,
        DIM**-0.5,
        logit_cap=0.0,
        sliding_window_size=-1,
        sinks=None,
        window_kv_offsets=None,
        xai_temperature_len=-1,
        page_size=1,
        score_mod=None,
        aux_tensors=None,
        extend_seq_lens_cpu=None,
    )
    return o


def run_unified(ea, batch: Batch, meta: Metadata, custom_mask: torch.Tensor) -> torch.Tensor:
    """The deterministic-inference path, _forward_extend_unified (triton_backend.py:2141-2284) in
    TARGET_VERIFY: extend_seq_lens is None there, so every request extends by max_extend_len rows starting
    at b*N; the tree K/V are read back from the pool at out_cache_loc."""
    bs = len(batch.seq_lens)
    extend_seq_lens = torch.full((bs,), meta.max_extend_len, dtype=torch.int32)
    extend_start_loc = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(extend_seq_lens[:-1], dim=0)])
    kv_indptr, kv_indices, prefix_lens = ea.build_unified_kv_indices(
        meta.kv_indptr, meta.kv_indices, extend_start_loc, extend_seq_lens, batch.out_cache_loc, bs
    )
    o = torch.empty_like(batch.q)
    ea.extend_attention_fwd_unified(
        batch.q,
        o,
        batch.k_buffer,
        batch.v_buffer,
        1.0,
        1.0,
        meta.qo_indptr,
        kv_indptr,
        kv_indices,
        prefix_lens.to(torch.int32),
        meta.max_extend_len,
        custom_mask=custom_mask,
        mask_indptr=meta.mask_indptr,
        sm_scale=DIM**-0.5,
        logit_cap=0.0,
        is_causal=True,
        sliding_window_size=-1,
        sinks=None,
        window_start_pos=None,
        xai_temperature_len=-1,
        page_size=1,
        score_mod=None,
        aux_tensors=None,
    )
    return o


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Dense attention in float64: q [R, H, D], k/v [S, H_kv, D], allowed [R, S] -> [R, H, D]."""
    group = q.shape[1] // k.shape[1]
    k, v = k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    scores = torch.einsum("rhd,shd->hrs", q.double(), k) * DIM**-0.5
    weights = scores.masked_fill(~allowed[None], float("-inf")).softmax(-1)
    return torch.einsum("hrs,shd->rhd", weights, v).float()


def dense_reference(batch: Batch) -> torch.Tensor:
    """Every row attends to its request's whole prefix and to the tree columns qlen_mask allows."""
    out = []
    for b, length in enumerate(batch.seq_lens):
        pk, pv = batch.prefix_kv(b)
        rows = batch.rows(b)
        k = torch.cat([pk, batch.k_extend[rows]])
        v = torch.cat([pv, batch.v_extend[rows]])
        allowed = torch.cat([torch.ones(batch.n, length, dtype=torch.bool), batch.tensors.qlen_mask[b]], dim=1)
        out.append(attend(batch.q[rows], k, v, allowed))
    return torch.cat(out)


def chain_reference(batch: Batch) -> torch.Tensor:
    """Row i = the last token of an ordinary causal sequence [prefix, root, ..., node i] (its path in the
    tree, from the tree's own parents), at positions seq_len, seq_len + 1, ...: what a correct tree verify
    must compute. A padding row is the chain [prefix, root, itself], as verify_inputs.py documents."""
    out = torch.empty_like(batch.q)
    for b, (tree, length) in enumerate(zip(batch.trees, batch.seq_lens)):
        pk, pv = batch.prefix_kv(b)
        parents = tree.parents.tolist()
        for i in range(batch.n):
            if i < tree.size:
                path, p = [i], parents[i]
                while p >= 0:
                    path.insert(0, p)
                    p = parents[p]
            else:
                path = [0, i]
            idx = torch.tensor(path) + b * batch.n
            pos = length + torch.arange(len(path))
            k = torch.cat([pk, rope(batch.k_raw[idx], pos)])
            v = torch.cat([pv, batch.v_extend[idx]])
            q = rope(batch.q_raw[idx[-1:]], pos[-1:])
            out[b * batch.n + i] = attend(q, k, v, torch.ones(1, length + len(path), dtype=torch.bool))[0]
    return out


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


CASES = {
    # three requests, ragged prefixes, trees of 6/4/5 nodes padded to N=6 (two requests carry padding)
    "small": dict(seq_lens=[5, 9, 3], budgets=[6, 4, 5], n=6, depth=3, width=2, seed=11),
    # more rows than one BLOCK_M (64) and more tree columns than one BLOCK_N: the causal=True tile cut,
    # a prefix over two key tiles, a one-token prefix, 2 + 39 padding rows
    "wide": dict(seq_lens=[70, 1], budgets=[70, 33], n=72, depth=8, width=3, seed=3),
}


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    batch = make_batch(**CASES[request.param])
    # the trees must branch and go deeper than one level, or a chain mask would pass for a tree one
    assert any(len(kids) > 1 for t in batch.trees for kids in t.children())
    assert batch.tensors.max_depth >= 2
    return batch


@interpreted_only
def test_default_extend_kernel_reads_the_worker_tree_mask(ea, case):
    meta = target_verify_metadata(case)
    custom_mask = case.tensors.full_mask(case.seq_lens)
    assert custom_mask.numel() == int(meta.mask_indptr[-1])
    out = run_extend(ea, case, meta, custom_mask, causal=True)
    # every row, padding rows included (they see the prefix, the root and themselves)
    assert max_diff(out, dense_reference(case)) < ATOL
    assert max_diff(out, chain_reference(case)) < ATOL
    # the mask alone carries the tree: causal=False (full extend sweep) gives the same rows
    assert max_diff(run_extend(ea, case, meta, custom_mask, causal=False), out) < 1e-5


@interpreted_only
@benign_tail_rows
def test_deterministic_unified_kernel_reads_the_worker_tree_mask(ea, case):
    meta = target_verify_metadata(case)
    out = run_unified(ea, case, meta, case.tensors.full_mask(case.seq_lens))
    assert max_diff(out, dense_reference(case)) < ATOL
    assert max_diff(out, chain_reference(case)) < ATOL


@interpreted_only
@benign_tail_rows
def test_wrong_layouts_do_not_match(ea):
    """The comparison is sensitive to the layout: each deliberate mistake moves the outputs far."""
    batch = make_batch(**CASES["small"])
    meta = target_verify_metadata(batch)
    expected = dense_reference(batch)
    good = batch.tensors.full_mask(batch.seq_lens)
    assert max_diff(run_extend(ea, batch, meta, good), expected) < ATOL

    # the tree part transposed (descendants instead of ancestors)
    transposed = VerifyTensors(**{**batch.tensors.__dict__, "qlen_mask": batch.tensors.qlen_mask.transpose(1, 2)})
    assert max_diff(run_extend(ea, batch, meta, transposed.full_mask(batch.seq_lens)), expected) > 0.1
    assert max_diff(run_unified(ea, batch, meta, transposed.full_mask(batch.seq_lens)), expected) > 0.1

    # mask_indptr without the prefix columns (N*N per request): requests after the first read garbage rows
    short = Metadata(**{**meta.__dict__})
    short.mask_indptr = torch.arange(len(batch.seq_lens) + 1, dtype=torch.int64) * batch.n * batch.n
    assert max_diff(run_extend(ea, batch, short, good), expected) > 0.1

    # only the tree part, no prefix columns (a qlen-layout mask, N*N per request, where FULL is expected)
    assert max_diff(run_extend(ea, batch, short, batch.tensors.qlen_mask.flatten()), expected) > 0.1

    # prefix columns all False: the default kernel skips them (skip_prefix_custom_mask=True), the
    # deterministic one reads them, so it must change
    blind = good.clone()
    for b, length in enumerate(batch.seq_lens):
        start = int(meta.mask_indptr[b])
        rows = blind[start : int(meta.mask_indptr[b + 1])].view(batch.n, length + batch.n)
        rows[:, :length] = False
    assert max_diff(run_extend(ea, batch, meta, blind), expected) < ATOL
    assert max_diff(run_unified(ea, batch, meta, blind), expected) > 0.1

    # positions seq_len + node index instead of seq_len + depth: the kernel still matches the dense
    # reference of those inputs but no longer computes the chains
    index_pos = torch.tensor([length + i for length in batch.seq_lens for i in range(batch.n)])
    shifted = make_batch(**CASES["small"], positions=index_pos)
    out = run_extend(ea, shifted, meta, good)
    assert max_diff(out, dense_reference(shifted)) < ATOL
    assert max_diff(out, chain_reference(shifted)) > 1e-2
