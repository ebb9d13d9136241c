"""The GPU bundle's test-only stand-in for sgl-kernel, and the carry list, checked on CPU.

The device run (bench/gpu/run.sh) has no sgl-kernel, FlashInfer or CUTLASS. It relies on three facts
that these tests keep true for the installed SGLang:
1. with the stand-in, every server module imports on a CUDA machine without what does not travel
   (tests/sglang_gpu/cuda_import_probe.py, torch.cuda pretending), and bench/gpu/requirements.txt
   is exactly what that import needs beyond the device image;
2. under SGLANG_FORCE_FUSED_OP_BACKEND=torch SGLang's fused ops run their forward_native code on CUDA,
   so no stand-in op is reached (and without the switch they would be: the negative control);
3. every stand-in name is one SGLang imports, each unimplemented one raises naming itself, and the
   dual-GEMM module's stand-in answers as the real one does on SM90.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
STUB = HERE / "stub"

pytest.importorskip("sglang")


@pytest.fixture(scope="module")
def missing_packages():
    spec = importlib.util.spec_from_file_location("missing_packages", ROOT / "bench" / "gpu" / "missing_packages.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cuda_imports(missing_packages):
    """The probe's report with everything bench/gpu/missing_packages.py does not carry made absent."""
    return missing_packages.probe()


def test_every_server_module_imports_on_cuda_with_the_standin_alone(cuda_imports):
    assert cuda_imports["failed"] == {}
    assert cuda_imports["sgl_kernel"] == str(STUB / "sgl_kernel" / "__init__.py")
    assert "sglang_jetspec.adapter.worker" in cuda_imports["imported"]
    blocked = {"flashinfer-python", "sglang-kernel", "nvidia-cutlass-dsl", "flash-attn-4"}
    assert not blocked & {d.lower() for d in cuda_imports["distributions"]}


def test_the_committed_carry_list_is_what_the_probe_finds(missing_packages, cuda_imports):
    lines = missing_packages.carry_list(
        cuda_imports["distributions"], missing_packages.image_packages(), missing_packages.sglang_pins()
    )
    committed = [
        line
        for line in (ROOT / "bench" / "gpu" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    regenerate = "regenerate: python -m bench.gpu.missing_packages --write bench/gpu/requirements.txt"
    # the same distributions; versions must agree where SGLang pins one. An unpinned one (msgspec, say) keeps
    # the version the device staging last ran with: a newer release in this venv is not a defect of the list
    found, listed = (dict(line.split("==") for line in entries) for entries in (lines, committed))
    assert list(listed) == list(found), regenerate
    pinned = {missing_packages.norm(name) for name in missing_packages.sglang_pins()} & found.keys()
    assert {name: listed[name] for name in pinned} == {name: found[name] for name in pinned}, regenerate
    carried = set(found)
    assert {"sglang", "transformers", "xgrammar", "fastapi"} <= carried  # SGLang itself, a pinned override, two imports
    assert not {"torch", "triton", "numpy", "sglang-kernel", "flashinfer-python"} & carried  # image's, or stood in for


def test_carry_list_rules(missing_packages):
    image = {"numpy": None, "transformers": "5.17.0", "tokenizers": "0.23.2"}
    pins = {"transformers": "5.19.0", "tokenizers": "0.23.2", "torch": "2.14.1"}
    got = missing_packages.carry_list(
        ["numpy", "transformers", "tokenizers", "orjson", "sglang_kernel", "torch"], image, pins
    )
    installed = {d: importlib.metadata.version(d) for d in ("transformers", "orjson")}
    assert got == [f"orjson=={installed['orjson']}", f"transformers=={installed['transformers']}"]


@pytest.mark.parametrize("switch", ["torch", None], ids=["forced-native", "negative-control-cuda-path"])
def test_fused_ops_run_forward_native_on_cuda_only_under_the_switch(switch):
    env = {"SGLANG_FORCE_FUSED_OP_BACKEND": switch} if switch else {}
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    if not switch:
        full_env.pop("SGLANG_FORCE_FUSED_OP_BACKEND", None)
    done = subprocess.run(
        [sys.executable, str(HERE / "fused_dispatch_probe.py")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    expected = True if switch else "forward_cuda reached"
    assert result == {"RMSNorm": expected, "SiluAndMul": expected, "RotaryEmbedding": expected}


def _sglang_sgl_kernel_imports() -> dict[str, set[str]]:
    """{module: names} of every `from sgl_kernel[.x] import ...` in the installed SGLang."""
    root = Path(importlib.util.find_spec("sglang").origin).parent
    found: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        text = path.read_text(errors="replace")
        if "sgl_kernel" not in text:
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "sgl_kernel":
                found.setdefault(node.module, set()).update(a.name for a in node.names)
    return found


@pytest.fixture(scope="module")
def standin_facts():
    done = subprocess.run(
        [sys.executable, str(HERE / "standin_facts.py")], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_every_standin_name_is_one_sglang_imports(standin_facts):
    imported = _sglang_sgl_kernel_imports()
    for module, names in standin_facts["names"].items():
        stale = set(names) - imported.get(module, set())
        assert not stale, f"{module}: the installed SGLang imports none of {sorted(stale)}"


def test_standin_ops_refuse_loudly_and_the_two_that_run_answer_safely(standin_facts):
    assert "sgl_kernel.rmsnorm is not provided by the test-only GPU stand-in" in standin_facts["rmsnorm_error"]
    assert "SGLANG_FORCE_FUSED_OP_BACKEND=torch" in standin_facts["rmsnorm_error"]
    assert "sgl_kernel.kvcacheio.transfer_kv_per_layer" in standin_facts["transfer_error"]
    assert standin_facts["weak_ref_is_identity"] is True and standin_facts["pdl"] is False
    assert standin_facts["same_tag"] is True and standin_facts["distinct_tags"] is True
    assert standin_facts["standin_file"].startswith(str(STUB))


def _real_dual_gemm_source() -> ast.Module:
    spec = importlib.util.find_spec("sglang.kernels.ops.gemm")
    return ast.parse((Path(spec.origin).parent / "cutedsl_dual_gemm.py").read_text())


def test_dual_gemm_standin_matches_the_real_module_on_sm90():
    sys.path.insert(0, str(STUB))
    try:
        import jetspec_gpu_standin_dual_gemm as standin
    finally:
        sys.path.remove(str(STUB))
    real = _real_dual_gemm_source()
    constants = {
        t.id: node.value.value
        for node in real.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name) and isinstance(node.value, ast.Constant)
    }
    assert constants["MAX_DUAL_GEMM_DECODE_TOKENS"] == standin.MAX_DUAL_GEMM_DECODE_TOKENS
    members = next(
        {t.id: s.value.value for s in node.body if isinstance(s, ast.Assign) for t in s.targets}
        for node in real.body
        if isinstance(node, ast.ClassDef) and node.name == "DualGemmQuantMode"
    )
    assert members == {m.name: m.value for m in standin.DualGemmQuantMode}
    # the real predicate answers False off SM100, which is what the stand-in answers on the device's SM90
    predicate = next(
        node for node in real.body if isinstance(node, ast.FunctionDef) and node.name == "can_use_dual_gemm"
    )
    assert "is_sm100_supported()" in ast.unparse(predicate)
    assert standin.can_use_dual_gemm(1, 576, 1536, standin.DualGemmQuantMode.UNQUANT) is False
    # and the names sglang/srt/layers/dual_gemm.py imports from it exist
    layer = ast.parse((Path(importlib.util.find_spec("sglang.srt.layers.dual_gemm").origin)).read_text())
    wanted = {
        a.name
        for node in ast.walk(layer)
        if isinstance(node, ast.ImportFrom) and node.module == "sglang.kernels.ops.gemm.cutedsl_dual_gemm"
        for a in node.names
    }
    assert wanted and all(hasattr(standin, name) for name in wanted)


@pytest.mark.parametrize("enabled", [True, False], ids=["switched-on", "off-by-default"])
def test_sitecustomize_registers_the_dual_gemm_standin_only_when_switched_on(enabled):
    env = {**os.environ, "PYTHONPATH": str(STUB)}
    env.pop("JETSPEC_SGLANG_GPU_STANDIN", None)
    if enabled:
        env["JETSPEC_SGLANG_GPU_STANDIN"] = "1"
    code = (
        "import sys; m = sys.modules.get('sglang.kernels.ops.gemm.cutedsl_dual_gemm'); "
        "print(getattr(m, '__file__', None))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.strip()
    assert (printed == str(STUB / "jetspec_gpu_standin_dual_gemm.py")) if enabled else printed == "None"
