"""Policy push and readback through SGLang's /set_internal_state and /server_info.

Two hooks on `SchedulerInternalStateController` (the scheduler-side handler of both endpoints):
- AROUND `set_internal_state`: the `jetspec_policy.*` keys of one request form one table, which is
  validated as a whole and applied only if every other key of the request was accepted too. The
  per-key `_update_handlers` cannot do that: each handler sees one key, so a table split over
  several keys could be applied half-way.
- AFTER `get_internal_state`: adds the state in force under `jetspec_policy`, the number of
  requests holding draft state under `jetspec_live_draft_states` and the head's context pool
  (slots, bytes, valid slots) under `jetspec_context_pool`, the verify widths and the steps run at each
  under `jetspec_verify_widths`, each cohort's same-allocation decision (speculative or native, its
  measured gain) under `jetspec_same_allocation`, the last refused push's time and problems under
  `jetspec_last_refused_push` (SGLang answers a refused push 200 [false]), and under `jetspec_ranks` each
  tensor-parallel rank's live draft states, policy table and valid context slots (one entry with
  --tp-size 1); SGLang serves them on GET /server_info as `internal_states[i].jetspec_policy` (it has
  no /get_internal_state route).
The scheduler runs these requests between forward steps, so a table never changes inside a step.
"""

from __future__ import annotations

import logging
import time

from policies.control_api import LAST_REFUSAL_KEY, POLICY_KEY, SAME_ALLOCATION_KEY
from sglang_jetspec.adapter.policy import is_policy_key

log = logging.getLogger(__name__)

CONTROLLER = "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController"
SET_TARGET = f"{CONTROLLER}.set_internal_state"
GET_TARGET = f"{CONTROLLER}.get_internal_state"


def _policy_control(controller):
    """The JETSPEC worker's PolicyControl, or None when this scheduler runs something else."""
    return getattr(controller.scheduler.draft_worker, "policy_control", None)


LIVE_STATES_KEY = "jetspec_live_draft_states"
CONTEXT_POOL_KEY = "jetspec_context_pool"
RANKS_KEY = "jetspec_ranks"
VERIFY_WIDTHS_KEY = "jetspec_verify_widths"


def around_set_internal_state(original, controller, recv_req):
    from sglang.srt.managers.io_struct import SetInternalStateReq, SetInternalStateReqOutput

    ours = {k: v for k, v in recv_req.server_args.items() if is_policy_key(k)}
    control = _policy_control(controller)
    if not ours or control is None:
        return original(controller, recv_req)
    # Validate before anything changes, so a rejected request leaves the previous table in force.
    _, problems = control.check(ours)
    if not problems:
        rest = {k: v for k, v in recv_req.server_args.items() if not is_policy_key(k)}
        if rest and not original(controller, SetInternalStateReq(server_args=rest)).updated:
            return SetInternalStateReqOutput(updated=False)
        problems = control.push(ours, time.time())
    if problems:  # one line per refused push, whatever it held; the caller reads why on /server_info
        control.last_refusal = {"at": time.time(), "problems": list(problems)}
        log.warning(
            "rejected %s push, nothing changed (%d problems): %s", POLICY_KEY, len(problems), "; ".join(problems)
        )
        return SetInternalStateReqOutput(updated=False)
    log.info("applied pushed %s table: %s", POLICY_KEY, control.readback(time.time())["table"])
    return SetInternalStateReqOutput(updated=True)


def after_get_internal_state(result, controller, recv_req):
    control = _policy_control(controller)
    if control is not None:
        result.internal_state[POLICY_KEY] = control.readback(time.time())
        # SGLang answers a refused push 200 [false]: why, for the caller (None until a push is refused)
        result.internal_state[LAST_REFUSAL_KEY] = control.last_refusal
        # requests holding draft state; 0 whenever nothing runs (else a leak)
        worker = controller.scheduler.draft_worker
        result.internal_state[LIVE_STATES_KEY] = worker.live_draft_states()
        # valid slots: the context of running and cached tokens only (0 after a flush, else a leak)
        result.internal_state[CONTEXT_POOL_KEY] = worker.context_pool_state()
        # the verify widths steps are padded to (JETSPEC_VERIFY_WIDTHS) and the steps run at each
        result.internal_state[VERIFY_WIDTHS_KEY] = worker.verify_widths_state()
        # per cohort: speculative or native, measured on this server's steps (None: the control is off)
        result.internal_state[SAME_ALLOCATION_KEY] = control.same_allocation_state()
        # every tensor-parallel rank's own view (SGLang hands this request to every rank's scheduler)
        result.internal_state[RANKS_KEY] = worker.ranks.gather(
            {
                "live_draft_states": worker.live_draft_states(),
                "policy_table": control.readback(time.time())["table"],
                "context_valid_slots": worker.context_pool_state()["valid_slots"],  # 0 on ranks that do not draft
            }
        )
    return result
