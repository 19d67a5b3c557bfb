"""Token-level chat composition: templates from sentinel rendering, handles spliced unchanged."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import jinja2
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from microagent.engine_bridge import ChatComposer, ChatTemplate, KVHandle, Message
from microagent.testing import ScriptedEngine, ToyTokenizer
from strategies import chat_texts

SMOLLM2 = (  # SmolLM2-Instruct's template: ChatML that injects a default system prompt
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"  # noqa: E501 (a template, verbatim)
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"  # noqa: E501 (a template, verbatim)
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
LLAMA3 = (  # Llama-3-like: a BOS prefix, header markers, trimmed contents, no newline after eot
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"  # noqa: E501 (a template, verbatim)
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"  # noqa: E501 (a template, verbatim)
)
ZEPHYR = (  # Zephyr-like: <|role|> markers, the EOS as end of turn, a newline after it
    "{% for message in messages %}{{ '<|' + message['role'] + '|>\n' + message['content'] + eos_token + '\n' }}"  # noqa: E501 (a template, verbatim)
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)

Render = Callable[[list[dict[str, str]], bool], str]


def jinja_renderer(source: str, **specials: str) -> Render:
    template = jinja2.Environment().from_string(source)

    def render(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return template.render(
            messages=messages, add_generation_prompt=add_generation_prompt, **specials
        )

    return render


# (name, template source, specials for the renderer, the tokenizer's special tokens, eot text)
SHAPES = [
    ("smollm2", SMOLLM2, {}, ("<|endoftext|>", "<|im_start|>", "<|im_end|>"), "<|im_end|>"),
    (
        "llama3",
        LLAMA3,
        {"bos_token": "<|begin_of_text|>"},
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
        "<|eot_id|>",
    ),
    ("zephyr", ZEPHYR, {"eos_token": "</s>"}, ("</s>",), "</s>"),
]


class Shape:
    def __init__(
        self, source: str, specials: dict[str, str], tokens: tuple[str, ...], eot_text: str
    ) -> None:
        self.tok = ToyTokenizer(specials=tokens)
        self.render = jinja_renderer(source, **specials)
        self.eot = self.tok.token_id(eot_text)
        self.template = ChatTemplate.from_renderer(self.render, self.tok.encode, self.eot, eot_text)


SHAPE_PARAMS = [pytest.param(Shape(*args[1:]), id=args[0]) for args in SHAPES]
with_shapes = pytest.mark.parametrize("shape", SHAPE_PARAMS)


class _Engine(ScriptedEngine):
    """A ScriptedEngine speaking another template's tokenizer (composition needs only tokens)."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.tokenizer = shape.tok
        self.eot_token_id = shape.eot
        self.chat = ChatComposer(shape.template, self)


roles = st.sampled_from(["user", "assistant"])
conversations = st.tuples(
    st.none() | chat_texts(),  # an optional system message first
    st.lists(st.tuples(roles, chat_texts()), min_size=1, max_size=5),
)


def _messages(conv: tuple[str | None, list[tuple[str, str]]]) -> list[dict[str, str]]:
    system, turns = conv
    head = [] if system is None else [{"role": "system", "content": system}]
    return head + [{"role": r, "content": c} for r, c in turns]


# --- deriving templates ----------------------------------------------------------------


def test_chatml_from_renderer_equals_builtin() -> None:
    tok = ToyTokenizer()
    eot = tok.token_id("<|im_end|>")
    derived = ChatTemplate.from_renderer(jinja_renderer(SMOLLM2), tok.encode, eot, "<|im_end|>")
    builtin = ChatTemplate.chatml(tok.encode, eot)
    # SmolLM2's template inserts a default system turn when none is given
    assert tok.decode(derived.default_system).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant"
    )
    assert tok.decode(derived.default_system).endswith("<|im_end|>\n")
    assert attrs.evolve(derived, default_system=()) == builtin
    assert dict(derived.opens) == dict(builtin.opens)
    assert dict(derived.closes) == dict(builtin.closes)
    assert tok.decode(derived.open("user")) == "<|im_start|>user\n"
    assert tok.decode(derived.close("assistant")) == "<|im_end|>\n"


def test_llama3_prefix_and_fragments() -> None:
    s = Shape(LLAMA3, {"bos_token": "<|begin_of_text|>"}, SHAPES[1][3], "<|eot_id|>")
    t, dec = s.template, s.tok.decode
    assert dec(t.prefix) == "<|begin_of_text|>"
    assert dec(t.open("system")) == "<|start_header_id|>system<|end_header_id|>\n\n"
    assert dec(t.close("user")) == "<|eot_id|>"
    assert dec(t.generation) == "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_extra_roles_and_unknown_roles() -> None:
    tok = ToyTokenizer()
    eot = tok.token_id("<|im_end|>")
    t = ChatTemplate.from_renderer(
        jinja_renderer(SMOLLM2),
        tok.encode,
        eot,
        "<|im_end|>",
        roles=("system", "user", "assistant", "tool"),
    )
    assert tok.decode(t.open("tool")) == "<|im_start|>tool\n"
    assert t.roles == ("system", "user", "assistant", "tool")
    with pytest.raises(ValueError, match="not in the chat template"):
        ChatTemplate.chatml(tok.encode, eot).open("tool")


def test_a_template_that_drops_contents_is_refused() -> None:
    tok = ToyTokenizer()
    render = jinja_renderer(
        "{% for m in messages %}<|im_start|>{{ m['role'] }}<|im_end|>{% endfor %}"
    )
    with pytest.raises(ValueError, match="dropped"):
        ChatTemplate.from_renderer(render, tok.encode, tok.token_id("<|im_end|>"), "<|im_end|>")


# --- composition matches the template ------------------------------------------------------


@with_shapes
@given(conv=conversations, gen=st.booleans())
@settings(max_examples=80, deadline=None)
def test_composition_equals_tokenized_rendering(
    shape: Shape, conv: tuple[str | None, list[tuple[str, str]]], gen: bool
) -> None:
    messages = _messages(conv)
    engine = _Engine(shape)
    handle = engine.chat.prompt(messages) if gen else engine.chat.context(messages)
    assert handle.token_ids == tuple(shape.tok.encode(shape.render(messages, gen)))


def test_default_system_prompt_is_inserted_like_the_template_does() -> None:
    shape = Shape(*SHAPES[0][1:])  # SmolLM2: a default system turn when none is given
    engine = _Engine(shape)
    handle = engine.chat.prompt([{"role": "user", "content": "hi"}])
    assert shape.tok.decode(handle.token_ids).startswith(
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM"
    )
    own = engine.chat.prompt(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    )
    assert "SmolLM" not in shape.tok.decode(own.token_ids)  # a given system message replaces it
    plain = ScriptedEngine()  # the built-in ChatML template has no default system turn
    assert (
        plain.chat.prompt([{"role": "user", "content": "hi"}]).text
        == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


# --- handles are spliced, never re-tokenized ----------------------------------------------


@st.composite
def content_handles(draw: st.DrawFn, eot: int) -> tuple[int, ...]:
    ids = draw(st.lists(st.integers(100, 10_000), max_size=12))
    if draw(st.booleans()):
        ids.append(eot)  # a generation that stopped on the end-of-turn token
    return tuple(ids)


@with_shapes
@given(data=st.data(), conv=conversations, role=roles)
@settings(max_examples=80, deadline=None)
def test_handle_tokens_appear_unchanged_and_eot_is_never_doubled(
    shape: Shape, data: st.DataObject, conv: tuple[str | None, list[tuple[str, str]]], role: str
) -> None:
    engine = _Engine(shape)
    eot = shape.eot
    ids = data.draw(content_handles(eot))
    content = engine.handle(ids)
    ctx = engine.chat.context(_messages(conv))
    composed = engine.chat.append(ctx, role, content)
    tail = composed.since(ctx)
    open_ = shape.template.open(role)
    assert tail[: len(open_)] == open_
    assert tail[len(open_) : len(open_) + len(ids)] == ids  # contiguous, unchanged
    assert composed.parent is ctx
    assert tail.count(eot) == 1  # exactly one end-of-turn token closes the turn
    pairs = list(zip(composed.token_ids, composed.token_ids[1:], strict=False))
    assert (eot, eot) not in pairs
    # the next turn opens right after the close
    nxt = engine.chat.append(composed, "user", "next")
    assert nxt.token_ids[len(composed) :][
        : len(shape.template.open("user"))
    ] == shape.template.open("user")


@given(conv=conversations, extra=st.lists(st.tuples(roles, chat_texts()), min_size=1, max_size=3))
@settings(max_examples=60, deadline=None)
def test_incremental_composition_equals_whole(
    conv: tuple[str | None, list[tuple[str, str]]], extra: list[tuple[str, str]]
) -> None:
    engine = ScriptedEngine()
    messages = _messages(conv)
    handle = engine.chat.context(messages)
    for role, text in extra:
        handle = engine.chat.append(handle, role, text)
    whole = engine.chat.context(messages + [{"role": r, "content": c} for r, c in extra])
    assert handle == whole
    assert handle.token_ids == whole.token_ids


def test_messages_may_be_attrs_or_mappings_and_handles() -> None:
    engine = ScriptedEngine()
    reply = engine.handle([*engine.tokenize("yes, it works"), engine.eot_token_id])
    a = engine.chat.context([Message("user", "does it work?"), Message("assistant", reply)])
    b = engine.chat.context(
        [{"role": "user", "content": "does it work?"}, {"role": "assistant", "content": reply}]
    )
    assert a == b
    assert a.text.endswith("<|im_start|>assistant\nyes, it works<|im_end|>\n")
    assert a.text.count("<|im_end|>") == 2


def test_close_turn_and_continue_with() -> None:
    engine = ScriptedEngine()
    prompt = engine.chat.prompt([{"role": "user", "content": "q"}])
    stopped = prompt.extend([*engine.tokenize("an answer"), engine.eot_token_id])
    cut = prompt.extend(engine.tokenize("an unfinished"))
    assert engine.chat.close_turn(stopped).since(stopped) == tuple(engine.tokenize("\n"))
    assert engine.chat.close_turn(cut).since(cut) == (engine.eot_token_id, *engine.tokenize("\n"))
    closed = engine.chat.close_turn(stopped)
    assert engine.chat.close_turn(closed).since(closed) == ()
    cue = engine.chat.continue_with(cut, "\nFinal answer:")
    assert cue.parent is cut
    assert cue.text.endswith("an unfinished\nFinal answer:")
    assert engine.chat.continue_with(cut, "") == cut


def test_cross_model_handles_are_refused() -> None:
    engine = ScriptedEngine()
    alien = KVHandle((1, 2, 3), model="another-model")
    with pytest.raises(ValueError, match="re-tokenize"):
        engine.chat.append(engine.chat.context([]), "user", alien)


def test_adapter_is_carried_by_the_context() -> None:
    engine = ScriptedEngine()
    engine.register_adapter("lora", "/lora")
    ctx = engine.chat.context([{"role": "user", "content": "hi"}], adapter="lora")
    assert ctx.adapter is not None and ctx.adapter.name == "lora"
    assert engine.chat.generation_prompt(ctx).adapter == ctx.adapter


# --- splice: a separator after every spliced segment --------------------------------------


def test_text_after_a_spliced_handle_starts_on_a_new_line() -> None:
    engine = ScriptedEngine()
    chat = engine.chat
    peer = engine.handle([*engine.tokenize("so the answer is 12"), engine.eot_token_id])
    other = engine.handle(engine.tokenize("it is 13"))  # cut by length: no end-of-turn
    ids = chat.splice(["\nAgent b: ", peer, "\nAgent c: ", other, "These are the answers"])
    text = engine.detokenize(ids)
    # the instruction is never glued to the last answer ("...is 13These are")
    assert text == "\nAgent b: so the answer is 12\nAgent c: it is 13\n\nThese are the answers"
    assert engine.eot_token_id not in ids
    # the handles' ids appear unchanged, each followed by a line break
    newline = tuple(engine.tokenize("\n"))
    for handle in (peer, other):
        body = handle.token_ids[:-1] if handle.token_ids[-1] == engine.eot_token_id else None
        body = body or handle.token_ids
        at = next(i for i in range(len(ids)) if ids[i : i + len(body)] == body)
        assert ids[at + len(body) : at + len(body) + len(newline)] == newline
    # two handles in a row are separated too; nothing is added after the last piece
    both = engine.detokenize(chat.splice([peer, other]))
    assert both == "so the answer is 12\n\nit is 13"


@given(
    pieces=st.lists(
        st.tuples(st.booleans(), chat_texts(), st.sampled_from(["", "\n", " "])),
        min_size=1,
        max_size=6,
    )
)
@settings(max_examples=80, deadline=None)
def test_every_spliced_segment_is_separated_from_what_follows(
    pieces: list[tuple[bool, str, str]],
) -> None:
    engine = ScriptedEngine()
    parts: list[str | KVHandle] = []
    for is_handle, text, lead in pieces:
        parts.append(engine.handle(engine.tokenize(text)) if is_handle else lead + text)
    decoded = engine.detokenize(engine.chat.splice(parts))
    expected = ""
    for previous, piece in zip([None, *parts], parts, strict=False):
        piece_text = piece.text if isinstance(piece, KVHandle) else piece
        if isinstance(previous, KVHandle) and not piece_text.startswith("\n"):
            expected += "\n\n"
        expected += piece_text
    assert decoded == expected
