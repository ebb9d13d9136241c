"""Hooks on SGLang's scheduler that tie JETSPEC's per-request state to the request's life.

- Admission (BEFORE `GrammarManager.process_req_with_grammar`, the last call every new request passes
  before it is queued): a request JETSPEC cannot decode losslessly (constrained decoding, watermark,
  custom logit processor, ...), or one that would crash SGLang's own scheduler (an empty prompt,
  out-of-vocabulary token ids, an impossible top_k or top_logprobs_num), is refused there, the way
  SGLang refuses bad input: `set_finish_with_abort` with a message naming the field, so the client
  gets a 400 and the server keeps serving. Refusing it
  inside the forward instead (after the batch's grammar flags were computed) crashed the scheduler.
- Prefill results (AFTER `SchedulerBatchResultProcessor.process_batch_result_prefill`): requests that
  finished at prefill release their state as soon as their finish reason is set.
- Abort of a waiting request (AFTER `Scheduler._release_aborted_request`: client aborts, queue-limit
  evictions, waiting timeouts): such a request is popped from the waiting queue without a finish reason
  the worker's sweep could see; a retracted request there still has draft state, which goes now.
- Any request the scheduler ends outside the output stream (AFTER `Scheduler.send_abort_output`): among
  them the decode batch's last request when even it no longer fits the KV pool (`retract_decode` aborts
  it with a `to_finish` that never becomes a finish reason, and takes it out of the batch), so the
  sweep never sees it finish; its draft state goes now.
- Idle (AFTER `Scheduler.on_idle`, which the loop calls whenever no batch runs): finished requests
  leave, an expired push reverts, and the gauges (live draft states, the table in force) say so
  while no step runs to refresh them.
All run in the scheduler process only; registering them (every process) imports nothing heavy.
"""

from __future__ import annotations

SCHEDULER = "sglang.srt.managers.scheduler.Scheduler"
ADMISSION_TARGET = "sglang.srt.constrained.grammar_manager.GrammarManager.process_req_with_grammar"
ABORT_RELEASE_TARGET = f"{SCHEDULER}._release_aborted_request"
ABORT_OUTPUT_TARGET = f"{SCHEDULER}.send_abort_output"
IDLE_TARGET = f"{SCHEDULER}.on_idle"
PREFILL_RESULT_TARGET = (
    "sglang.srt.managers.scheduler_components.batch_result_processor."
    "SchedulerBatchResultProcessor.process_batch_result_prefill"
)


def jetspec_worker(owner):
    """The JETSPEC worker of a scheduler (or of its result processor), or None when it runs something else."""
    from sglang_jetspec.adapter.worker import JetSpecWorker

    worker = getattr(owner, "draft_worker", None)
    return worker if isinstance(worker, JetSpecWorker) else None


def before_process_req_with_grammar(manager, req, *args, **kwargs):
    from sglang_jetspec.adapter.request_sampling import GRAMMAR_FIELDS, crashing_input, unsupported_feature

    if req.to_finish is not None or jetspec_worker(manager.scheduler) is None:
        return None
    # the abort also replaces the prompt by one safe token, so nothing of it reaches a forward
    reason = crashing_input(req, manager.scheduler.model_config.vocab_size) or unsupported_feature(req)
    if reason is not None:
        for name in GRAMMAR_FIELDS:  # queued as an ordinary (aborted) request, not compiled as a grammar
            setattr(req.sampling_params, name, None)
        req.set_finish_with_abort(reason)
        # The aborted request still passes through one prefill batch (its prompt now one safe token):
        # nothing of what was refused may reach that batch's sampling tensors, nor a batch-mate's
        # logprobs (which read every request's top count).
        req.sampling_params.top_k, req.sampling_params.min_new_tokens = 1, 0
        req.logprob.top_logprobs_num = 0
    return None


def after_process_batch_result_prefill(result, processor, *args, **kwargs):
    """Requests that finished at prefill (one-token answers, refusals) have their finish reason now:
    their state goes at once instead of at the next forward, which an idle server may never run."""
    worker = jetspec_worker(processor)
    if worker is not None:
        worker.retire_finished()  # and tees the sampled natural finishes to the shadow
    return result


def after_release_aborted_request(result, scheduler, req, *args, **kwargs):
    _release(scheduler, req)
    return result


def after_send_abort_output(result, scheduler, abort_req, req, *args, **kwargs):
    _release(scheduler, req)
    return result


def _release(scheduler, req) -> None:
    worker = jetspec_worker(scheduler)
    if worker is not None:
        worker.release_request(req.rid)


def after_on_idle(result, scheduler, *args, **kwargs):
    worker = jetspec_worker(scheduler)
    if worker is not None:
        worker.refresh_idle()
    return result
