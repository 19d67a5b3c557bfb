"""Seeded prefills in one piece: what lets vLLM's CPU engine serve per-request seeds.

vLLM samples a token for every request scheduled in a step, also for one whose
prefill the step only partly computes, and throws that token away. For a seeded
request it then rewinds the request's generator
(``GPUModelRunner._bookkeeping_sync``: ``gen.set_offset(gen.get_offset() - 4)``).
A CUDA (Philox) generator has an offset; a CPU one does not: ``RuntimeError: CPU
Generator does not use offset`` kills the worker, the engine and every request in
flight. A seeded request's prefill is split whenever it does not fit the step's
remaining token budget, whether the prompt is long or the budget is shared, and
the re-prefill after a preemption (prompt and output so far) is one too.

So on the CPU backend the retaining scheduler never schedules a seeded request's
prefill in part (``WholeSeededPrefills``): vLLM admits every waiting request,
new, resumed after a preemption or back from a KV load, through
``allocate_slots``, and there the rule answers "no room" for a seeded one whose
scheduled tokens would leave its prefill unfinished. vLLM then stops admitting
for the step (as when blocks run out), so the seeded request keeps its place at
the head of the queue and later arrivals do not pass it: the running prefills
finish, the budget frees up and it gets a step where it fits whole, alone if need
be. Only the part the prefix cache (or the KV tier) does not hold counts.

A seeded prefill longer than a whole step's budget can never fit: the bridge
refuses such a prompt (``RequestRefused("seed")``); a re-prefill that grew past
the budget (prompt and output, after a preemption) ends with finish reason
``"error"`` instead of killing the engine. The generator is then never advanced
by a discarded token, so the same seed gives the same tokens however the steps
were shared. GPU generators support the rewind: the bridge turns the rule on only
on the CPU backend.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from vllm.sampling_params import SamplingType
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs
from vllm.v1.request import Request, RequestStatus

#: the retention settings' key (``additional_config``) that turns the rule on
SETTING = "whole_seeded_prefills"


def is_seeded(request: Request) -> bool:
    """Whether vLLM gives ``request`` a generator of its own (a seed, and sampling)."""
    params = request.sampling_params
    return params is not None and params.sampling_type == SamplingType.RANDOM_SEED


@attrs.define
class WholeSeededPrefills:
    """The rule in one scheduler: a seeded prefill is scheduled whole or not at all.

    Attributes:
        step_tokens: the most tokens one step schedules (vLLM's
            ``max_num_scheduled_tokens``): a prefill longer than this never fits.
        unfit: ids of seeded requests whose prefill can never fit a step; they end
            with finish reason ``"error"`` at the step's output (``fail_unfit``).
    """

    step_tokens: int
    unfit: dict[str, None] = attrs.field(factory=dict)

    def holds_back(
        self, request: Request, num_new_tokens: int, allocation: Mapping[str, Any]
    ) -> bool:
        """Whether ``allocate_slots(request, num_new_tokens, **allocation)`` must answer
        "no room": a waiting seeded request that this allocation would leave with its
        prefill unfinished. A running request is never held (its prefill was whole); nor
        is an asynchronous KV load (no forward pass: it computes after the load)."""
        if request.status == RequestStatus.RUNNING or not is_seeded(request):
            return False
        if allocation.get("delay_cache_blocks", False):
            return False
        start = (
            request.num_computed_tokens
            + int(allocation.get("num_new_computed_tokens", 0))
            + int(allocation.get("num_external_computed_tokens", 0))
        )
        if start + num_new_tokens >= request.num_tokens:
            return False
        if request.num_tokens - start > self.step_tokens:
            self.unfit[request.request_id] = None
        return True

    def fail_unfit(self, scheduler: Scheduler, outputs: dict[int, EngineCoreOutputs]) -> None:
        """End the seeded requests that can never fit a step (finish reason ``"error"``),
        and add their last output to this step's ``outputs`` (as vLLM ends its own)."""
        if not self.unfit:
            return
        ids, self.unfit = list(self.unfit), {}
        for request in scheduler.finish_requests(ids, RequestStatus.FINISHED_ERROR):
            ended = EngineCoreOutput(
                request_id=request.request_id,
                new_token_ids=[],
                finish_reason=request.get_finished_reason(),
                events=request.take_events(),
                trace_headers=request.trace_headers,
            )
            outputs.setdefault(request.client_index, EngineCoreOutputs()).outputs.append(ended)
