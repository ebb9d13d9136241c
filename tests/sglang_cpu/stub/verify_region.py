"""Host syncs inside the region a verify graph captures, counted in the scheduler process (test-only).

With ``JETSPEC_TEST_VERIFY_REGION=<file>`` set (and the stand-in switched on), ``sitecustomize`` calls
``install`` once SGLang's scheduler module is imported. The first ``PROBED`` TARGET_VERIFY forwards of
the eager runner then run their ``model.forward`` (the call SGLang's decode graph runner captures: the
target's layers with the tap-layer capture, and the logits processor returning every verify row's
hidden state) under ``harness.step_probe.StepProbe``; each appends one JSON line to ``<file>`` with
its device ops and host syncs and the sites of the syncs. The attention backend's planning
(``init_forward_metadata``) runs before that call, outside the region, as it does around a replay; its
``forward`` counts as one device op, as the captured attention kernel it stands for on a GPU.
Counting rather than raising keeps the server answering when a sync is found: the test reads the file.
Nothing here runs in a normal install.
"""

from __future__ import annotations

import json
import os

REGION_ENV = "JETSPEC_TEST_VERIFY_REGION"
PROBED = 12


def install(scheduler_module) -> None:  # noqa: ARG001 (every probe installs on the scheduler's import)
    path = os.environ.get(REGION_ENV, "").strip()
    if not path:
        return
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    from harness.step_probe import StepProbe

    execute_extend = EagerRunner._execute_extend
    probed = [0]

    def probed_execute_extend(self, forward_batch, *args, **kwargs):
        if not forward_batch.forward_mode.is_target_verify() or probed[0] >= PROBED:
            return execute_extend(self, forward_batch, *args, **kwargs)
        probed[0] += 1
        model = self.model_runner.model
        backend_cls = type(self.model_runner.attn_backend)
        attention = backend_cls.forward
        probe = StepProbe(op_sites=False)
        probe.mark_host([value for name, value in vars(forward_batch).items() if name.endswith("_cpu")])

        def captured_forward(*a, **k):
            with probe:
                return type(model).forward(model, *a, **k)

        def one_kernel(backend, *a, **k):
            with probe.kernel("attention"):
                return attention(backend, *a, **k)

        model.forward, backend_cls.forward = captured_forward, one_kernel
        try:
            return execute_extend(self, forward_batch, *args, **kwargs)
        finally:
            del model.forward
            backend_cls.forward = attention
            counts = probe.take()
            record = {
                "num_tokens": int(forward_batch.input_ids.shape[0]),
                "device_ops": counts.device_ops,
                "host_syncs": counts.host_syncs,
                "sync_sites": dict(counts.sync_sites),
            }
            with open(path, "a") as f:
                f.write(json.dumps(record) + "\n")

    EagerRunner._execute_extend = probed_execute_extend
