"""The test-only sgl-kernel stand-in (tests/sglang_cpu/stub): each op against an independent dense
reference, and each op's argument order against the call site in the installed SGLang.

The stand-in is imported under its module name `sgl_kernel` only inside the `sk` fixture, which puts
the stub directory first on sys.path and afterwards removes the stand-in from sys.modules (restoring
whatever was there), unregisters its torch.ops, and takes the path off again. The installed CUDA
sgl-kernel cannot load here; it is only ever read as source.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

sglang = pytest.importorskip("sglang")

STUB = Path(__file__).resolve().parent / "stub"
SGLANG_DIR = Path(sglang.__file__).resolve().parent


# ---------------------------------------------------------------------------------------------- fixtures


def _standin_modules() -> list[str]:
    return [name for name in sys.modules if name == "sgl_kernel" or name.startswith("sgl_kernel.")]


@pytest.fixture(scope="module")
def sk():
    saved = {name: sys.modules.pop(name) for name in _standin_modules()}
    sys.path.insert(0, str(STUB))
    module = None
    try:
        module = importlib.import_module("sgl_kernel")
        assert Path(module.__file__).resolve().parent.parent == STUB, module.__file__
        yield module
    finally:
        sys.path.remove(str(STUB))
        if module is not None:
            module._unregister()
        for name in _standin_modules():
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------- attention: setup


def _paged_batch(gen, seq_lens, ext_lens, *, heads=4, kv_heads=2, dim=32, pool=256, rows=8, context=64):
    """A ragged batch laid out as SGLang does: each request's tokens at random KV slots of its
    `req_to_token` row (requests in scrambled pool rows); the new tokens' K/V in `k_ext`/`v_ext`
    (the slots of the new tokens hold different values, so reading them from the cache shows)."""
    bs = len(seq_lens)
    slots = torch.randperm(pool, generator=gen)[: sum(seq_lens)]
    req_to_token = torch.full((rows, context), -1, dtype=torch.int32)
    req_pool_indices = torch.randperm(rows, generator=gen)[:bs]
    at = 0
    for b, n in enumerate(seq_lens):
        req_to_token[req_pool_indices[b], :n] = slots[at : at + n].int()
        at += n
    total_ext = sum(ext_lens)
    t = lambda *shape: torch.randn(*shape, generator=gen)  # noqa: E731
    return dict(
        q=t(total_ext, heads, dim),
        k_ext=t(total_ext, kv_heads, dim),
        v_ext=t(total_ext, kv_heads, dim),
        k_buf=t(pool, kv_heads, dim),
        v_buf=t(pool, kv_heads, dim),
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices.long(),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
        ext_lens=torch.tensor(ext_lens, dtype=torch.int32),
        starts=torch.tensor([sum(ext_lens[:b]) for b in range(bs)], dtype=torch.int32),
    )


def _reference_extend(d, scale, *, tree=None, causal=True, window=0, sinks=None):
    """Per request and query: gather the visible keys into a list, softmax in float64."""
    heads, kv_heads = d["q"].shape[1], d["k_ext"].shape[1]
    group = heads // kv_heads
    out = torch.zeros(d["q"].shape, dtype=torch.float64)
    for b in range(len(d["seq_lens"])):
        ext, seq, start = int(d["ext_lens"][b]), int(d["seq_lens"][b]), int(d["starts"][b])
        pre = seq - ext
        row = d["req_to_token"][d["req_pool_indices"][b]]
        keys = [d["k_buf"][int(row[j])] for j in range(pre)] + [d["k_ext"][start + j] for j in range(ext)]
        values = [d["v_buf"][int(row[j])] for j in range(pre)] + [d["v_ext"][start + j] for j in range(ext)]
        for i in range(ext):
            visible = []
            for j in range(pre + ext):
                if j < pre:
                    ok = True
                elif tree is not None:
                    ok = bool(tree[b][i][j - pre])
                else:
                    ok = (j - pre <= i) if causal else True
                if window > 0 and (pre + i) - j >= window:
                    ok = False
                if ok:
                    visible.append(j)
            k = torch.stack([keys[j] for j in visible]).double()  # [n, kv_heads, dim]
            v = torch.stack([values[j] for j in visible]).double()
            for h in range(heads):
                logits = (k[:, h // group] @ d["q"][start + i, h].double()) * scale
                if sinks is not None:
                    logits = torch.cat([logits, sinks[h].double().view(1)])
                p = torch.softmax(logits, 0)[: len(visible)]
                out[start + i, h] = p @ v[:, h // group]
    return out


def _run_extend(d, scale, *, tree_mask=None, max_len=None, causal=True, window=0, sinks=None, logit_cap=0.0):
    """One extend call over the batch's own KV buffers (a layer's), which it must leave as they were."""
    o = torch.full((d["q"].shape[0], d["q"].shape[1], d["v_ext"].shape[2]), float("nan"))
    k_before, v_before = d["k_buf"].clone(), d["v_buf"].clone()
    torch.ops.sgl_kernel.extend_attention_cpu(
        d["q"],
        d["k_ext"],
        d["v_ext"],
        o,
        d["k_buf"],
        d["v_buf"],
        1.0,
        1.0,
        d["req_to_token"],
        d["req_pool_indices"],
        d["seq_lens"],
        d["ext_lens"],
        d["starts"],
        int(max_len or d["ext_lens"].max()),
        scale,
        logit_cap,
        False,
        window,
        None,
        sinks,
        tree_mask,
        causal,
    )
    assert torch.equal(k_before, d["k_buf"]) and torch.equal(v_before, d["v_buf"])  # extend does not write the cache
    return o


def _random_trees(gen, bs, n):
    """Per request: parents[i] < i for i >= 1 (node 0 the root); mask[i][j] = j is i or an ancestor."""
    trees = []
    for _ in range(bs):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]
        mask = [[False] * n for _ in range(n)]
        for i in range(n):
            j = i
            while j >= 0:
                mask[i][j] = True
                j = parents[j]
        trees.append((parents, mask))
    return trees


# ----------------------------------------------------------------------------------- attention: tests


def test_extend_ragged_prefix_and_extend_matches_reference(sk):
    gen = torch.Generator().manual_seed(0)
    # prefix + extend, no prefix, a single new token, a long prefix (GQA: 4 query heads on 2 KV heads)
    d = _paged_batch(gen, seq_lens=[9, 5, 20, 33], ext_lens=[4, 5, 1, 7])
    got = _run_extend(d, 0.17)
    assert torch.allclose(got.double(), _reference_extend(d, 0.17), atol=1e-5)


def test_extend_tree_mask_matches_reference_and_ignoring_it_is_causal(sk, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    bs, n = 3, 6
    d = _paged_batch(gen, seq_lens=[n + 3, n + 11, n], ext_lens=[n] * bs)
    trees = [mask for _, mask in _random_trees(gen, bs, n)]
    flat = torch.tensor(trees, dtype=torch.bool).flatten()  # QLEN_ONLY: [bs * n * n]
    got = _run_extend(d, 0.2, tree_mask=flat, max_len=n)
    want = _reference_extend(d, 0.2, tree=trees)
    assert torch.allclose(got.double(), want, atol=1e-5)
    causal = _reference_extend(d, 0.2)
    assert not torch.allclose(want, causal, atol=1e-3)  # the trees are not chains: the mask matters
    monkeypatch.setenv("JETSPEC_TEST_IGNORE_TREE_MASK", "1")
    ignored = _run_extend(d, 0.2, tree_mask=flat, max_len=n)
    assert torch.allclose(ignored.double(), causal, atol=1e-5)


def test_extend_chain_tree_mask_equals_causal(sk):
    gen = torch.Generator().manual_seed(2)
    n = 5
    d = _paged_batch(gen, seq_lens=[n + 4, n + 1], ext_lens=[n, n])
    chain = torch.tril(torch.ones(n, n, dtype=torch.bool)).repeat(2, 1, 1).flatten()
    assert torch.allclose(_run_extend(d, 0.3, tree_mask=chain, max_len=n), _run_extend(d, 0.3), atol=1e-6)


def test_extend_sliding_window_sinks_and_non_causal_match_reference(sk):
    gen = torch.Generator().manual_seed(3)
    d = _paged_batch(gen, seq_lens=[12, 6, 17], ext_lens=[5, 6, 2])
    sinks = torch.randn(4, generator=gen)
    got = _run_extend(d, 0.25, window=4, sinks=sinks)
    assert torch.allclose(got.double(), _reference_extend(d, 0.25, window=4, sinks=sinks), atol=1e-5)
    got = _run_extend(d, 0.25, causal=False)
    assert torch.allclose(got.double(), _reference_extend(d, 0.25, causal=False), atol=1e-5)


def test_extend_layers_of_one_forward_share_its_layout_and_the_next_forward_rebuilds_it(sk):
    """Layers of a forward pass the same metadata objects with their own KV buffers: the layout built by
    the first layer serves the others. The next forward may mutate those objects in place; it starts at
    a buffer already seen (layer 0), so it rebuilds and matches the reference for its own metadata."""
    gen = torch.Generator().manual_seed(6)
    d = _paged_batch(gen, seq_lens=[9, 5, 20], ext_lens=[4, 5, 1])
    layers = [(d["k_buf"].clone(), d["v_buf"].clone()) for _ in range(3)]
    layers[1][0].mul_(2.0)  # a different layer's cache: the same layout, other values

    def forward():  # each layer's call on its own cache, the metadata objects shared
        return [_run_extend({**d, "k_buf": k_buf, "v_buf": v_buf}, 0.2) for k_buf, v_buf in layers]

    def want(layer):
        return _reference_extend({**d, "k_buf": layers[layer][0], "v_buf": layers[layer][1]}, 0.2)

    first = forward()
    for layer in range(3):
        assert torch.allclose(first[layer].double(), want(layer), atol=1e-5)
    assert not torch.allclose(first[0], first[1], atol=1e-3)  # each layer read its own cache
    # the next forward: one more prefix token for request 0, the metadata tensors changed in place
    row = d["req_to_token"][d["req_pool_indices"][0]]
    row[9] = 250
    d["seq_lens"][0] += 1
    second = forward()
    for layer in range(3):
        assert torch.allclose(second[layer].double(), want(layer), atol=1e-5)
    assert not torch.allclose(second[0][:4], first[0][:4], atol=1e-4)


def test_extend_refuses_what_it_does_not_implement(sk):
    gen = torch.Generator().manual_seed(4)
    d = _paged_batch(gen, seq_lens=[6, 7], ext_lens=[3, 4])
    with pytest.raises(NotImplementedError, match="logit_cap"):
        _run_extend(d, 0.2, logit_cap=30.0)
    ragged_tree = torch.ones(2 * 4 * 4, dtype=torch.bool)
    with pytest.raises(RuntimeError, match="uniform"):
        _run_extend(d, 0.2, tree_mask=ragged_tree, max_len=4)


def test_decode_writes_kv_and_matches_reference(sk):
    gen = torch.Generator().manual_seed(5)
    seq_lens = [7, 1, 19, 12]
    d = _paged_batch(gen, seq_lens=seq_lens, ext_lens=[1] * 4)
    bs, heads, dim = 4, 4, 32
    loc = torch.stack([d["req_to_token"][d["req_pool_indices"][b], seq_lens[b] - 1] for b in range(bs)]).long()
    key, value = d["k_ext"], d["v_ext"]  # this step's K/V, which decode writes at `loc`
    sinks = torch.randn(heads, generator=gen)
    for window, sink in ((0, None), (5, sinks)):
        k_buf, v_buf = d["k_buf"].clone(), d["v_buf"].clone()
        out = torch.full((bs, heads, dim), float("nan"))
        attn_logits = torch.zeros(bs, heads, 8, dim + 1)
        torch.ops.sgl_kernel.decode_attention_cpu(
            d["q"],
            k_buf,
            v_buf,
            1.0,
            1.0,
            out,
            key,
            value,
            loc,
            attn_logits,
            d["req_to_token"],
            d["req_pool_indices"],
            d["seq_lens"],
            0.2,
            0.0,
            False,
            window,
            None,
            sink,
        )
        assert torch.equal(k_buf[loc], key) and torch.equal(v_buf[loc], value)
        # the same attention as an extend of one token whose K/V are already in the cache
        want = _reference_extend({**d, "k_buf": k_buf, "v_buf": v_buf}, 0.2, window=window, sinks=sink)
        assert torch.allclose(out.double(), want, atol=1e-5)


# ------------------------------------------------------------------------------------ cache-loc ops


def _rows_and_windows(gen, bs=4, rows=6, width=24):
    req_to_token = torch.randint(0, 1000, (rows, width), generator=gen, dtype=torch.int32)
    req_pool_indices = torch.randperm(rows, generator=gen)[:bs]
    start = torch.randint(0, 10, (bs,), generator=gen)
    lens = torch.tensor([3, 0, 7, 1])[:bs]
    return req_to_token, req_pool_indices, start, start + lens


def test_assign_req_to_token_pool_matches_loop(sk):
    gen = torch.Generator().manual_seed(6)
    req_to_token, rpi, start, end = _rows_and_windows(gen)
    locs = torch.randint(0, 1000, (int((end - start).sum()),), generator=gen)
    want, at = req_to_token.clone(), 0
    for b in range(len(rpi)):
        n = int(end[b] - start[b])
        want[rpi[b], int(start[b]) : int(end[b])] = locs[at : at + n].int()
        at += n
    sk.assign_req_to_token_pool_cpu(rpi, req_to_token, start, end, locs, req_to_token.shape[1])
    assert torch.equal(req_to_token, want)


def test_assign_extend_cache_locs_matches_loop(sk):
    gen = torch.Generator().manual_seed(7)
    req_to_token, rpi, start, end = _rows_and_windows(gen)
    want = torch.cat([req_to_token[rpi[b], int(start[b]) : int(end[b])] for b in range(len(rpi))]).long()
    out = torch.full((len(want) + 3,), -7, dtype=torch.int64)
    sk.assign_extend_cache_locs_cpu(rpi, req_to_token, start, end, out, req_to_token.shape[1])
    assert torch.equal(out[: len(want)], want) and bool((out[len(want) :] == -7).all())


def test_assign_draft_cache_locs_contiguous_matches_loop(sk):
    gen = torch.Generator().manual_seed(8)
    req_to_token, rpi, seq_lens, _ = _rows_and_windows(gen)
    topk, steps = 2, 3
    out = torch.empty(len(rpi) * topk * steps, dtype=torch.int64)
    sk.assign_draft_cache_locs_contiguous_cpu(rpi, req_to_token, seq_lens, out, req_to_token.shape[1], topk, steps)
    for b in range(len(rpi)):
        for k in range(topk * steps):
            assert int(out[b * topk * steps + k]) == int(req_to_token[rpi[b], int(seq_lens[b]) + k])


def test_fill_accept_out_cache_loc_and_bonus_tokens_match_loops(sk):
    accept_index = torch.tensor([[0, 2, -1, -1], [4, -1, -1, -1], [8, 9, 11, -1]], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 112)
    got = torch.zeros(8, dtype=torch.int64)
    sk.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, got)
    want = [int(out_cache_loc[i]) for i in accept_index.flatten().tolist() if i != -1]
    assert got[: len(want)].tolist() == want and got[len(want) :].tolist() == [0] * (8 - len(want))

    accept_tokens = torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0], [1, 2, 3, 4]])
    accept_lens = torch.tensor([3, 1, 4], dtype=torch.int32)
    bonus = torch.zeros(3, dtype=torch.int32)
    sk.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus, accept_tokens.shape[1])
    assert bonus.tolist() == [accept_tokens[b, int(accept_lens[b]) - 1] for b in range(3)]


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer(sk):
    gen = torch.Generator().manual_seed(9)
    buffers = [torch.randn(32, 2, 8, generator=gen) for _ in range(3)] + [torch.randn(32, 2, 4, generator=gen)]
    before = [b.clone() for b in buffers]
    data_ptrs = torch.tensor([b.data_ptr() for b in buffers], dtype=torch.uint64)  # as MHATokenToKVPool builds them
    strides = torch.tensor([b.stride(0) * b.dtype.itemsize for b in buffers])
    src = torch.tensor([3, 4, 5, 20], dtype=torch.int64)
    tgt = torch.tensor([4, 5, 6, 2], dtype=torch.int64)  # overlapping: reads must happen before writes
    sk.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for buf, old in zip(buffers, before):
        want = old.clone()
        for s, t in zip(src.tolist(), tgt.tolist()):
            want[t] = old[s]
        assert torch.equal(buf, want)

    # a second move through the kept views reaches rows past the first call's (the view grows), and
    # rows already in place are left as they are
    before = [b.clone() for b in buffers]
    src = torch.tensor([7, 30, 12], dtype=torch.int64)
    tgt = torch.tensor([7, 31, 1], dtype=torch.int64)
    sk.copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt, src)
    for buf, old in zip(buffers, before):
        want = old.clone()
        want[31], want[1] = old[30], old[12]
        assert torch.equal(buf, want)
    before = [b.clone() for b in buffers]
    sk.copy_all_layer_kv_cache_cpu(data_ptrs, strides, torch.tensor([3]), torch.tensor([3]))  # nothing to move
    assert all(torch.equal(buf, old) for buf, old in zip(buffers, before))


# ---------------------------------------------------------------------------------------- tree ops


def _links_from_parents(parents):
    n = len(parents)
    children = [[k for k in range(n) if parents[k] == i] for i in range(n)]
    first_child = [c[0] if c else -1 for c in children]
    sibling = [-1] * n
    for c in children:
        for a, b in zip(c, c[1:]):
            sibling[a] = b
    return first_child, sibling


def test_verify_tree_greedy_matches_walk_over_children(sk):
    gen = torch.Generator().manual_seed(10)
    bs, n, num_spec = 4, 7, 5
    trees = _random_trees(gen, bs, n)
    candidates = torch.randint(0, 3, (bs, n), generator=gen)  # a small vocabulary, so matches happen
    target = torch.randint(0, 3, (bs, n), generator=gen)
    index = torch.arange(bs * n).view(bs, n)
    links = [_links_from_parents(p) for p, _ in trees]
    next_token = torch.tensor([first for first, _ in links])
    next_sibling = torch.tensor([sib for _, sib in links])

    predicts = torch.full((bs * n,), -5, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec), -1, dtype=torch.int32)
    accept_num = torch.empty(bs, dtype=torch.int32)
    sk.verify_tree_greedy_cpu(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_num,
        candidates=candidates,
        retrive_index=index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        target_predict=target,
    )

    want_predicts = torch.full((bs * n,), -5, dtype=torch.int32)
    for b, (parents, _) in enumerate(trees):
        path, node = [0], 0
        while len(path) < num_spec:
            nxt = [k for k in range(n) if parents[k] == node and candidates[b, k] == target[b, node]]
            if not nxt:
                break
            node = nxt[0]
            path.append(node)
        assert accept_index[b].tolist() == [b * n + p for p in path] + [-1] * (num_spec - len(path))
        assert int(accept_num[b]) == len(path) - 1
        for p in path:
            want_predicts[b * n + p] = target[b, p]
    assert torch.equal(predicts, want_predicts)
    assert int(accept_num.sum()) > 0  # the case exercised acceptance


def _sglang_source(module: str) -> tuple[Path, ast.Module]:
    """The installed SGLang module's file (next to the imported `sglang` package) and its AST; the
    module itself is not imported."""
    path = SGLANG_DIR.joinpath(*module.split(".")[1:]).with_suffix(".py")
    return path, ast.parse(path.read_text(), filename=str(path))


def _sglang_function(module: str, qualname: str):
    """(ast node, source file, module AST) of a function (`Class.method` allowed) in the installed SGLang."""
    path, tree = _sglang_source(module)
    node = tree
    for part in qualname.split("."):
        node = next(
            n for n in ast.iter_child_nodes(node) if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part
        )
    return node, path, tree


def test_reconstruct_indices_matches_sglang_host_reference(sk):
    """Against NGRAMWorker's own host-side `_derive_tree_links` (executed from its source) and the
    positions = prefix length + depth rule."""
    import numpy as np

    node, _, _ = _sglang_function("sglang.srt.speculative.ngram_worker", "_derive_tree_links")
    namespace = {"np": np, "torch": torch}
    exec(compile(ast.Module(body=[node], type_ignores=[]), "<_derive_tree_links>", "exec"), namespace)

    gen = torch.Generator().manual_seed(11)
    bs, n = 3, 8
    trees = _random_trees(gen, bs, n)
    mask = np.array([m for _, m in trees], dtype=bool).reshape(-1)
    seq_lens = torch.tensor([5, 17, 9])
    positions = torch.empty(bs * n, dtype=torch.int64)
    index, next_token, next_sibling = (torch.empty(bs, n, dtype=torch.int64) for _ in range(3))
    sk.speculative.reconstruct_indices_from_tree_mask(
        torch.from_numpy(mask), seq_lens, positions, index, next_token, next_sibling, bs, n
    )
    want_next, want_sibling = namespace["_derive_tree_links"](mask, bs, n)
    assert torch.equal(next_token, want_next) and torch.equal(next_sibling, want_sibling)
    assert torch.equal(index, torch.arange(bs * n).view(bs, n))
    depth = torch.tensor([[sum(m[i]) - 1 for i in range(n)] for _, m in trees])
    assert torch.equal(positions.view(bs, n), seq_lens[:, None] + depth)
    for b, (parents, _) in enumerate(trees):  # and against the parents themselves
        assert (next_token[b].tolist(), next_sibling[b].tolist()) == _links_from_parents(parents)


# ------------------------------------------------------------------------------ what is (not) defined


def test_undefined_names_raise_so_sglang_fallbacks_apply(sk):
    assert not hasattr(sk, "convert_weight_packed")
    assert not hasattr(torch.ops.sgl_kernel, "convert_weight_packed")  # -> cpu_has_amx_support() False
    assert not hasattr(torch.ops.sgl_kernel, "rmsnorm_cpu")
    with pytest.raises(ImportError):
        exec("from sgl_kernel import silu_and_mul", {})
    with pytest.raises(ImportError):
        importlib.import_module("sgl_kernel.mamba")
    for name in ("build_tree_kernel_efficient_cpu", "build_draft_decode_metadata_cpu", "rotate_input_ids_cpu"):
        fn = getattr(sk, name)
        with pytest.raises(NotImplementedError, match="EAGLE"):
            fn(*[None] * len(inspect.signature(fn).parameters))


CPU_PATH_MODULES = [
    "sglang.srt.mem_cache.allocation",
    "sglang.kernels.ops.kvcache.cache_move",
    "sglang.kernels.ops.speculative.cache_locs",
    "sglang.kernels.ops.speculative.eagle",
    "sglang.kernels.ops.speculative.spec_tree",
    "sglang.kernels.ops.speculative.multi_layer_eagle",
    "sglang.kernels.ops.speculative.reconstruct_tree",
    "sglang.srt.layers.attention.intel_amx_backend",
]


def _sgl_kernel_imports(tree: ast.AST, cpu_only: bool) -> list[tuple[str, str, str]]:
    """(module, name, local name) of `from sgl_kernel[.x] import ...` statements; with cpu_only,
    just those in the body of an `if _is_cpu:` / `elif _is_cpu:` branch."""
    found = []
    nodes = [tree]
    if cpu_only:
        nodes = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == "_is_cpu"
        ]
    for top in nodes:
        for stmt in top.body if cpu_only else [top]:
            for n in ast.walk(stmt):
                if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "sgl_kernel":
                    found += [(n.module, a.name, a.asname or a.name) for a in n.names]
    return found


def test_every_name_the_cpu_path_imports_is_defined(sk):
    seen = set()
    for module in CPU_PATH_MODULES:
        _, tree = _sglang_source(module)
        for source_module, name, _ in _sgl_kernel_imports(tree, cpu_only=True):
            assert hasattr(importlib.import_module(source_module), name), f"{module}: {source_module}.{name}"
            seen.add(name)
    # the unguarded / in-function imports of the CPU path
    assert hasattr(sk.speculative, "reconstruct_indices_from_tree_mask")
    assert hasattr(sk, "build_draft_decode_metadata_cpu")
    assert {
        "assign_req_to_token_pool_cpu",
        "copy_all_layer_kv_cache_cpu",
        "assign_extend_cache_locs_cpu",
        "assign_draft_cache_locs_contiguous_cpu",
        "fill_accept_out_cache_loc_cpu",
        "fill_bonus_tokens_cpu",
        "verify_tree_greedy_cpu",
        "build_tree_kernel_efficient_cpu",
        "rotate_input_ids_cpu",
    } <= seen


# ---------------------------------------------------------------- argument order at SGLang's call sites

# op -> (module, function, how the callee is named there, {stand-in parameter: the argument expression
# SGLang passes}). The expressions are those of SGLang 0.5.23; a call whose arguments shift, or a
# renamed keyword, fails here instead of computing garbage.
CACHE_LOC_ARGS_AS_NAMED = {  # two call sites pass the stand-in's own parameter names
    "req_pool_indices": "req_pool_indices",
    "req_to_token": "req_to_token",
    "start_offset": "start_offset",
    "end_offset": "end_offset",
    "out_cache_loc": "out_cache_loc",
    "pool_len": "req_to_token.shape[1]",
}
ATTENTION_LAYER_ARGS = {  # what both attention call sites pass of the layer and the batch
    "sm_scale": "layer.scaling",
    "logit_cap": "layer.logit_cap",
    "is_cross_attn": "layer.is_cross_attention",
    "sliding_window_size": "layer.sliding_window_size + 1",
    "encoder_lens": "forward_batch.encoder_lens",
    "sinks": "sinks",
}
CALL_SITES = [
    (
        "assign_req_to_token_pool_cpu",
        "sglang.srt.mem_cache.allocation",
        "assign_req_to_token_pool_func",
        "assign_req_to_token_pool_cpu",
        CACHE_LOC_ARGS_AS_NAMED,
    ),
    (
        "assign_extend_cache_locs_cpu",
        "sglang.kernels.ops.speculative.cache_locs",
        "assign_extend_cache_locs_func",
        "assign_extend_cache_locs_cpu",
        CACHE_LOC_ARGS_AS_NAMED,
    ),
    (
        "assign_extend_cache_locs_cpu",
        "sglang.kernels.ops.speculative.cache_locs",
        "fill_front_out_cache_loc_func",
        "assign_extend_cache_locs_cpu",
        {
            "req_pool_indices": "rows",
            "req_to_token": "window.int()",
            "start_offset": "starts",
            "end_offset": "num_front",
            "out_cache_loc": "front_out_cache_loc",
            "pool_len": "window.shape[1]",
        },
    ),
    (
        "assign_draft_cache_locs_contiguous_cpu",
        "sglang.kernels.ops.speculative.cache_locs",
        "assign_draft_cache_locs_contiguous_func",
        "assign_draft_cache_locs_contiguous_cpu",
        {
            "req_pool_indices": "req_pool_indices",
            "req_to_token": "req_to_token",
            "seq_lens": "seq_lens",
            "out_cache_loc": "out_cache_loc",
            "pool_len": "req_to_token.shape[1]",
            "topk": "topk",
            "num_steps": "num_cols",
        },
    ),
    (
        "copy_all_layer_kv_cache_cpu",
        "sglang.kernels.ops.kvcache.cache_move",
        "copy_all_layer_kv_cache_func",
        "copy_all_layer_kv_cache_cpu",
        {
            "data_ptrs": "data_ptrs",
            "strides": "strides",
            "tgt_loc": "tgt_loc[:num_locs]",
            "src_loc": "src_loc[:num_locs]",
        },
    ),
    (
        "fill_accept_out_cache_loc_cpu",
        "sglang.kernels.ops.speculative.eagle",
        "fill_accept_out_cache_loc_func",
        "fill_accept_out_cache_loc_cpu",
        {
            "accept_index": "accept_index",
            "out_cache_loc": "out_cache_loc",
            "accept_out_cache_loc": "accept_out_cache_loc",
        },
    ),
    (
        "fill_bonus_tokens_cpu",
        "sglang.kernels.ops.speculative.eagle",
        "fill_bonus_tokens_func",
        "fill_bonus_tokens_cpu",
        {
            "accept_tokens": "accept_tokens",
            "accept_lens": "accept_lens",
            "bonus_tokens": "bonus_tokens",
            "accept_stride": "accept_stride",
        },
    ),
    (
        "verify_tree_greedy_cpu",
        "sglang.kernels.ops.speculative.spec_tree",
        "verify_tree_greedy_func",
        "sgl_verify_tree_greedy_cpu",
        {
            "predicts": "predicts",
            "accept_index": "accept_index",
            "accept_token_num": "accept_token_num",
            "candidates": "candidates",
            "retrive_index": "retrieve_index",
            "retrive_next_token": "retrieve_next_token",
            "retrive_next_sibling": "retrieve_next_sibling",
            "target_predict": "target_predict",
        },
    ),
    (
        "reconstruct_indices_from_tree_mask",
        "sglang.kernels.ops.speculative.reconstruct_tree",
        "reconstruct_indices_from_tree_mask_func",
        "reconstruct_indices_from_tree_mask",
        {
            "tree_mask": "tree_mask",
            "verified_seq_len": "verified_seq_len",
            "positions": "positions",
            "retrive_index": "retrieve_index",
            "retrive_next_token": "retrieve_next_token",
            "retrive_next_sibling": "retrieve_next_sibling",
            "batch_size": "batch_size",
            "draft_token_num": "draft_token_num",
        },
    ),
    (
        "extend_attention_cpu",
        "sglang.srt.layers.attention.intel_amx_backend",
        "IntelAMXAttnBackend.forward_extend",
        "self.extend_attention_fwd",
        {
            "q_extend": "q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)",
            "k_extend": "k",
            "v_extend": "v",
            "o_extend": "o.view(-1, layer.tp_q_head_num, layer.v_head_dim)",
            "k_buffer": "key_buffer",
            "v_buffer": "value_buffer",
            "k_buf_scale": "key_scale",
            "v_buf_scale": "value_scale",
            "req_to_token": "req_to_token",
            "req_pool_indices": "req_pool_indices",
            "seq_lens": "seq_lens",
            "extend_seq_lens": "extend_seq_lens",
            "extend_start_loc": "extend_start_loc",
            "max_len_extend": "max_extend_len",
            **ATTENTION_LAYER_ARGS,
            "tree_mask": "tree_mask",
            "is_causal": "is_causal",
        },
    ),
    (
        "decode_attention_cpu",
        "sglang.srt.layers.attention.intel_amx_backend",
        "IntelAMXAttnBackend.forward_decode",
        "self.decode_attention_fwd",
        {
            "query": "q.view(-1, layer.tp_q_head_num, layer.qk_head_dim)",
            "k_buffer": "key_buffer",
            "v_buffer": "value_buffer",
            "k_buf_scale": "key_scale",
            "v_buf_scale": "value_scale",
            "output": "o.view(-1, layer.tp_q_head_num, layer.v_head_dim)",
            "key": "k",
            "value": "v",
            "loc": "cache_loc",
            "attn_logits": "attn_logits",
            "req_to_token": "req_to_token",
            "req_pool_indices": "req_pool_indices",
            "seq_lens": "seq_lens",
            **ATTENTION_LAYER_ARGS,
        },
    ),
]

ATTENTION_OPS = {"extend_attention_cpu", "decode_attention_cpu"}


def _standin_parameters(sk, op: str) -> list[tuple[str, bool]]:
    """(name, has a default) of the stand-in's parameters: the registered schema for torch ops."""
    if op in ATTENTION_OPS:
        schema = getattr(torch.ops.sgl_kernel, op).default._schema
        return [(a.name, False) for a in schema.arguments]
    fn = getattr(sk.speculative, op, None) or getattr(sk, op)
    return [(p.name, p.default is not inspect.Parameter.empty) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize(
    "op,module,function,callee,expected", CALL_SITES, ids=[f"{c[0]}@{c[2].split('.')[-1]}" for c in CALL_SITES]
)
def test_sglang_call_site_passes_arguments_in_standin_order(sk, op, module, function, callee, expected):
    node, path, tree = _sglang_function(module, function)
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and ast.unparse(n.func) == callee]
    assert len(calls) == 1, f"{path}::{function}: expected one call of {callee}, found {len(calls)}"
    call = calls[0]
    params = _standin_parameters(sk, op)
    names = [name for name, _ in params]
    assert len(call.args) <= len(names), f"{callee} passes {len(call.args)} positional arguments, {op} takes {names}"
    bound = {name: ast.unparse(arg) for name, arg in zip(names, call.args)}
    for kw in call.keywords:
        assert kw.arg in names and kw.arg not in bound, f"{callee}: keyword {kw.arg!r} does not fit {op}{names}"
        bound[kw.arg] = ast.unparse(kw.value)
    missing = [name for name, has_default in params if name not in bound and not has_default]
    assert not missing, f"{callee} leaves {missing} of {op} unset"
    assert bound == {k: ast.unparse(ast.parse(v, mode="eval").body) for k, v in expected.items()}

    # the callee really is the stand-in's op
    if op in ATTENTION_OPS:
        init, _, _ = _sglang_function(module, "IntelAMXAttnBackend.__init__")
        attr = callee.split(".", 1)[1]
        assigned = {
            ast.unparse(n.value)
            for n in ast.walk(init)
            if isinstance(n, ast.Assign) and any(ast.unparse(t) == f"self.{attr}" for t in n.targets)
        }
        assert assigned == {f"torch.ops.sgl_kernel.{op}"}
    else:
        imports = {local: (mod, name) for mod, name, local in _sgl_kernel_imports(tree, cpu_only=False)}
        assert callee in imports and imports[callee][1] == op, f"{path}: {callee} is not sgl_kernel's {op}"


def _real_sgl_kernel_wrappers() -> dict[str, list[str]]:
    """Parameter names of the installed (CUDA) sgl-kernel's Python wrappers, read as source."""
    paths = [p for p in sys.path if Path(p or ".").resolve() != STUB]
    spec = importlib.machinery.PathFinder.find_spec("sgl_kernel", paths)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the sgl-kernel package is not installed")
    wrappers = {}
    for name in ("speculative.py", "kvcacheio.py"):
        path = Path(list(spec.submodule_search_locations)[0]) / name
        if path.exists():
            for n in ast.parse(path.read_text()).body:
                if isinstance(n, ast.FunctionDef):
                    wrappers[n.name] = [a.arg for a in n.args.args]
    return wrappers


def test_standin_signatures_match_the_real_sgl_kernel_wrappers(sk):
    real = _real_sgl_kernel_wrappers()
    ops = {c[0] for c in CALL_SITES} - ATTENTION_OPS | {
        "build_tree_kernel_efficient_cpu",
        "build_draft_decode_metadata_cpu",
        "rotate_input_ids_cpu",
    }
    for op in sorted(ops):
        assert op in real, f"sgl-kernel has no {op} wrapper"
        assert [name for name, _ in _standin_parameters(sk, op)] == real[op], op


# ----------------------------------------------------------------------------------- sitecustomize


def test_sitecustomize_reports_amx_only_when_switched_on(tmp_path):
    code = textwrap.dedent("""
        import sys
        from sglang.srt.runtime_context import get_platform
        from sglang.srt.utils.common import cpu_has_amx_support
        import sgl_kernel
        print(get_platform().has_amx, cpu_has_amx_support(), sgl_kernel.STANDIN, sys.modules["sitecustomize"].__file__)
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(STUB), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "JETSPEC_SGLANG_CPU_STANDIN": "1",
        "OMP_NUM_THREADS": "1",
    }
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    has_amx, amx_kernels, standin, origin = run.stdout.split()
    # intel_amx is kept; the layers still take their PyTorch paths (no convert_weight_packed)
    assert (has_amx, amx_kernels, standin) == ("True", "False", "True")
    assert Path(origin).resolve() == STUB / "sitecustomize.py"


def test_sitecustomize_is_a_no_op_when_not_switched_on(tmp_path):
    code = (
        "from sglang.srt.runtime_context import get_platform; import sys; "
        "print(get_platform().has_amx, sys.modules['sitecustomize'].__file__)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(STUB), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": "1",
    }
    env.pop("JETSPEC_SGLANG_CPU_STANDIN", None)
    env.pop("SGLANG_USE_CPU_ENGINE", None)
    run = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr[-2000:]
    has_amx, origin = run.stdout.split()
    assert Path(origin).resolve() == STUB / "sitecustomize.py"  # it ran, and changed nothing
    assert has_amx == str(_host_has_amx())


def _host_has_amx() -> bool:
    from sglang.srt.runtime_context import get_platform

    return get_platform().has_amx
