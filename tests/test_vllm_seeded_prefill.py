"""The CPU backend's rule for seeded prefills, on the retaining scheduler built without an
engine: a seeded request's prefill is scheduled whole or waits (vLLM's CPU generator
cannot rewind a discarded token, see ``_seeded_prefill``), later arrivals do not pass it,
a re-prefill after a preemption is whole too, and one that can never fit a step ends with
an error instead of killing the engine. A platform whose generators rewind keeps vLLM's
chunking."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _scheduler import build_scheduler
from microagent.engine_bridge import VLLMBridge
from microagent.engine_bridge.vllm._retention import CONFIG_KEY
from microagent.engine_bridge.vllm._seeded_prefill import SETTING

BUDGET = 256  # tokens a step schedules
BLOCK = 128  # the CPU backend's block size
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "max_position_embeddings": 512,
    "torch_dtype": "bfloat16",
}


class Stepper:
    """The retaining scheduler of a tiny model, stepped by hand (no worker: the test plays
    the model, sampling token 7 for every request whose prefill is done)."""

    def __init__(self, scheduler: Any) -> None:
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        self.scheduler = scheduler
        self._params = SamplingParams
        self._hasher = get_request_block_hasher(BLOCK, sha256)
        self._serial = 0

    def add(self, tokens: int, *, seed: int | None = None, max_tokens: int = 64) -> Any:
        """Queue a request of ``tokens`` prompt tokens (sampled at temperature 0.8)."""
        from vllm.v1.request import Request

        self._serial += 1
        name = f"{'s' if seed is not None else 'u'}{self._serial}"
        prompt = [(self._serial * 31 + i) % 500 + 1 for i in range(tokens)]
        params = self._params(max_tokens=max_tokens, temperature=0.8, seed=seed)
        request = Request(name, prompt, params, None, block_hasher=self._hasher)
        self.scheduler.add_request(request)
        return request

    def step(self) -> tuple[dict[str, int], dict[str, Any]]:
        """One scheduled step and its output: tokens scheduled per request, finished ones."""
        from vllm.v1.outputs import ModelRunnerOutput

        out = self.scheduler.schedule()
        ids = list(out.num_scheduled_tokens)
        requests = self.scheduler.requests
        sampled = [
            [7]
            if requests[i].num_computed_tokens + out.num_scheduled_tokens[i]
            >= requests[i].num_tokens
            else []
            for i in ids
        ]
        result = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={r: n for n, r in enumerate(ids)},
            sampled_token_ids=sampled,
        )
        ended = {
            o.request_id: str(o.finish_reason)
            for outputs in self.scheduler.update_from_output(out, result).values()
            for o in outputs.outputs
            if o.finish_reason is not None
        }
        return dict(out.num_scheduled_tokens), ended


def scheduler(tmp_path: Path, *, whole: bool | None = None, fcfs: bool = False) -> Any:
    """The scheduler the bridge's engine arguments load (``whole`` overrides the setting,
    as on a GPU, where the bridge leaves it off)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    (tmp_path / "config.json").write_text(json.dumps(TINY_LLAMA))
    bridge = VLLMBridge(
        str(tmp_path),
        max_model_len=512,
        max_num_batched_tokens=BUDGET,
        scheduling_policy="fcfs" if fcfs else "priority",
        engine_args={"skip_tokenizer_init": True},
        progress=False,
    )
    bridge.model_path = tmp_path
    args = bridge._engine_arguments()
    if whole is not None:
        args["additional_config"][CONFIG_KEY][SETTING] = whole
    config = AsyncEngineArgs(**args).create_engine_config()
    return build_scheduler(config, blocks=32, block=BLOCK)


@pytest.fixture
def cpu(tmp_path: Path) -> Iterator[Stepper]:
    yield Stepper(scheduler(tmp_path))


def test_the_bridge_turns_the_rule_on_for_the_cpu_backend(cpu: Stepper) -> None:
    assert cpu.scheduler.whole_seeded is not None  # this machine is the CPU backend
    assert cpu.scheduler.whole_seeded.step_tokens == BUDGET


def test_a_seeded_prefill_waits_for_room_and_later_arrivals_wait_behind_it(
    cpu: Stepper,
) -> None:
    first = cpu.add(200)
    seeded = cpu.add(200, seed=1)
    later = cpu.add(40)  # would fit the step's remaining 56 tokens
    scheduled, _ = cpu.step()
    # vLLM would give the seeded request the 56 tokens left (and kill the CPU engine)
    assert scheduled == {first.request_id: 200}
    scheduled, _ = cpu.step()  # whole, in one step, then the later arrival
    assert scheduled == {first.request_id: 1, seeded.request_id: 200, later.request_id: 40}


def test_unseeded_and_greedy_requests_keep_vllms_chunking(cpu: Stepper) -> None:
    first = cpu.add(200)
    second = cpu.add(200)  # unseeded: chunked as vLLM does
    scheduled, _ = cpu.step()
    assert scheduled == {first.request_id: 200, second.request_id: 56}


def test_where_generators_rewind_a_seeded_prefill_is_chunked(tmp_path: Path) -> None:
    gpu = Stepper(scheduler(tmp_path, whole=False))
    assert gpu.scheduler.whole_seeded is None
    first = gpu.add(200)
    seeded = gpu.add(200, seed=1)
    scheduled, _ = gpu.step()
    assert scheduled == {first.request_id: 200, seeded.request_id: 56}


def test_a_seeded_prefill_longer_than_a_step_ends_with_an_error(cpu: Stepper) -> None:
    """The bridge refuses such a prompt; one that reaches the scheduler anyway ends."""
    other = cpu.add(100)
    seeded = cpu.add(BUDGET + 1, seed=3)
    scheduled, ended = cpu.step()
    assert scheduled == {other.request_id: 100}
    assert ended == {seeded.request_id: "error"}
    assert seeded.request_id not in cpu.scheduler.requests
    scheduled, ended = cpu.step()
    assert scheduled == {other.request_id: 1} and ended == {}


def test_a_re_prefill_after_a_preemption_is_whole_or_ends(cpu: Stepper) -> None:
    from vllm.v1.request import RequestStatus

    busy = cpu.add(230)
    seeded = cpu.add(20, seed=5, max_tokens=400)
    scheduled, _ = cpu.step()
    assert scheduled == {busy.request_id: 230, seeded.request_id: 20}  # 20 fit the 26 left
    for _ in range(99):
        cpu.step()
    assert seeded.num_output_tokens == 100
    sched = cpu.scheduler

    def preempt(request: Any) -> None:
        sched.running.remove(request)
        sched._preempt_request(request, time.monotonic())
        assert request.status == RequestStatus.PREEMPTED and request.num_computed_tokens == 0

    # resumed after a later arrival came: the re-prefill (prompt and output, 120 tokens,
    # less than a block: nothing cached) in one step, the newcomer chunked behind it
    preempt(seeded)
    fresh = cpu.add(200)
    scheduled, _ = cpu.step()
    assert scheduled == {seeded.request_id: 120, fresh.request_id: BUDGET - 120}
    assert seeded.num_computed_tokens == seeded.num_tokens - 1  # only the new sample left
    for _ in range(140):
        cpu.step()
    assert busy.is_finished() and fresh.is_finished() and seeded.num_tokens > BUDGET
    # resumed with nothing cached: more than a step holds, so it ends (and the engine lives)
    preempt(seeded)
    assert sched.reset_prefix_cache()
    scheduled, ended = cpu.step()
    assert scheduled == {} and ended == {seeded.request_id: "error"}
    assert not sched.has_requests() or seeded.request_id not in sched.requests
