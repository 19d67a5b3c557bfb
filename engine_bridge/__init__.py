"""The engine bridge: KV handles, chat composition, and the engines actors generate on.

``VLLMBridge`` runs one in-process vLLM ``AsyncLLM`` per served model (``vllm/``);
``RemoteBridge`` runs a role on any OpenAI-compatible endpoint (``remote/``: text
crosses, no KV). The deterministic test double, ``ScriptedEngine``, has its own room
(``scripted/``) and is exported from ``microagent.testing``.
"""

from .._public import publish as _publish
from ._bridge import EngineBridge as EngineBridge
from ._bridge import EngineRequest as EngineRequest
from ._bridge import EngineStep as EngineStep
from ._bridge import Generation as Generation
from ._bridge import SchedulerSnapshot as SchedulerSnapshot
from ._chat import ChatComposer as ChatComposer
from ._chat import ChatTemplate as ChatTemplate
from ._chat import Message as Message
from ._chat_template import check_chat_template as check_chat_template
from ._chat_template import jinja_renderer as jinja_renderer
from ._chat_template import load_chat_template as load_chat_template
from ._errors import EngineBridgeError as EngineBridgeError
from ._errors import EngineDied as EngineDied
from ._errors import EngineUnavailable as EngineUnavailable
from ._errors import HandleMismatch as HandleMismatch
from ._errors import ModelPreparationError as ModelPreparationError
from ._errors import RemoteError as RemoteError
from ._errors import RequestRefused as RequestRefused
from ._errors import UnknownAdapter as UnknownAdapter
from ._errors import find_cause as find_cause
from ._group import open_bridges as open_bridges
from ._handle import AdapterRef as AdapterRef
from ._handle import KVHandle as KVHandle
from ._resume import ResumeJournal as ResumeJournal
from ._resume import resume_journal as resume_journal
from ._retention import RELEASE_CAUSES as RELEASE_CAUSES
from ._retention import ReleaseCause as ReleaseCause
from ._retention import Retain as Retain
from ._retention import RetentionStats as RetentionStats
from ._salt import cache_salt as cache_salt
from ._salt import current_cache_salt as current_cache_salt
from ._salt import salt_for as salt_for
from ._salt import set_cache_salt as set_cache_salt
from ._tier_stats import TierStats as TierStats
from ._tool_calls import TOOL_NAME as TOOL_NAME
from ._tool_calls import TOOL_NAME_PATTERN as TOOL_NAME_PATTERN
from ._tool_calls import FunctionTool as FunctionTool
from ._tool_calls import ToolCallStream as ToolCallStream
from ._tool_calls import ToolChoice as ToolChoice
from ._tool_calls import ToolPlan as ToolPlan
from ._tool_calls import render_tool_calls as render_tool_calls
from ._tool_calls import render_tool_result as render_tool_result
from ._tool_calls import with_tool_instructions as with_tool_instructions
from ._tool_formats import CALL_PARSERS as CALL_PARSERS
from ._tool_formats import ToolFormat as ToolFormat
from ._tool_template import ChatRenderer as ChatRenderer
from ._tool_template import JinjaRenderer as JinjaRenderer
from ._types import MAX_TOP_LOGPROBS as MAX_TOP_LOGPROBS
from ._types import EngineStats as EngineStats
from ._types import FinishReason as FinishReason
from ._types import GenerationResult as GenerationResult
from ._types import Sampling as Sampling
from ._types import TaggedJson as TaggedJson
from ._types import Timings as Timings
from ._types import TokenDelta as TokenDelta
from ._types import TokenLogprob as TokenLogprob
from .remote import RemoteBridge as RemoteBridge
from .vllm import VLLMBridge as VLLMBridge
from .vllm import prepare_model as prepare_model
from .vllm import resolve_model as resolve_model
from .vllm import vllm_tool_parsers as vllm_tool_parsers

__all__ = [
    "CALL_PARSERS",
    "MAX_TOP_LOGPROBS",
    "RELEASE_CAUSES",
    "TOOL_NAME",
    "TOOL_NAME_PATTERN",
    "AdapterRef",
    "ChatComposer",
    "ChatRenderer",
    "ChatTemplate",
    "EngineBridge",
    "EngineBridgeError",
    "EngineDied",
    "EngineRequest",
    "EngineStats",
    "EngineStep",
    "EngineUnavailable",
    "FinishReason",
    "FunctionTool",
    "Generation",
    "GenerationResult",
    "HandleMismatch",
    "JinjaRenderer",
    "KVHandle",
    "Message",
    "ModelPreparationError",
    "ReleaseCause",
    "RemoteBridge",
    "RemoteError",
    "RequestRefused",
    "ResumeJournal",
    "Retain",
    "RetentionStats",
    "Sampling",
    "SchedulerSnapshot",
    "TaggedJson",
    "TierStats",
    "Timings",
    "TokenDelta",
    "TokenLogprob",
    "ToolCallStream",
    "ToolChoice",
    "ToolFormat",
    "ToolPlan",
    "UnknownAdapter",
    "VLLMBridge",
    "cache_salt",
    "check_chat_template",
    "current_cache_salt",
    "find_cause",
    "jinja_renderer",
    "load_chat_template",
    "open_bridges",
    "prepare_model",
    "render_tool_calls",
    "render_tool_result",
    "resolve_model",
    "resume_journal",
    "salt_for",
    "set_cache_salt",
    "vllm_tool_parsers",
    "with_tool_instructions",
]

_publish(globals(), __name__)
