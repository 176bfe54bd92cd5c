"""Issue 53's attention families against transformers on tiny random checkpoints:
Qwen3-MoE (a dense first layer, renormalized top-k), Qwen2-MoE (q/k/v biases, a gated
shared expert), GLM-4 MoE (DeepSeek-V3's grouped sigmoid router, a shared expert, q/k
norms, half of each head rotated), SmolLM3 (a layer without rotary positions) and Phi-3
(fused q/k/v and gate/up, partial rotary, LongRoPE switching past its original context)
and gpt-oss (a sink logit per head in attention, sliding and full layers alternating,
YaRN, a biased router, interleaved gate/up with biases through a clamped SwiGLU).
Greedy tokens identical and logits within 1e-4 in float32, two prompts batched, one of
them growing past Phi-3's switch while it generates; Phi-3's long and short caches never
stand in for each other through the server's prefix reuse."""

from __future__ import annotations

import httpx
import pytest
import torch
from checkpoints import (
    GLM4_MOE_TINY,
    GPT_OSS_TINY,
    PHI3_TINY,
    QWEN2_MOE_TINY,
    QWEN3_MOE_TINY,
    SMOLLM3_TINY,
    greedy_reference,
    load_reference,
    make_checkpoint,
)

from engine import Engine, SamplingParams

N_NEW = 12
FAMILIES = {
    "qwen3_moe": QWEN3_MOE_TINY,
    "qwen2_moe": QWEN2_MOE_TINY,
    "glm4_moe": GLM4_MOE_TINY,
    "smollm3": SMOLLM3_TINY,
    "phi3": PHI3_TINY,
    "gpt_oss": GPT_OSS_TINY,
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(tmp_path_factory, request):
    folder = make_checkpoint(tmp_path_factory.mktemp("f") / request.param, request.param, **FAMILIES[request.param])
    return request.param, folder, load_reference(folder)


def prompts() -> list[list[int]]:
    """10 tokens (Phi-3's switch, 16, passed while generating) and 30 (past it from the start)."""
    gen = torch.Generator().manual_seed(3)
    return [torch.randint(1, 300, (n,), generator=gen).tolist() for n in (10, 30)]


def test_batched_greedy_matches_transformers(family):
    arch, folder, ref = family
    engine = Engine.from_pretrained(str(folder), n_ctx=256, n_seq_max=2, max_batch_tokens=16)
    assert engine.model_config.architecture == type(ref).__name__
    params = SamplingParams(temperature=0.0, max_tokens=N_NEW, ignore_eos=True)
    seqs = [engine.add_sequence(p, params, seq_id=i) for i, p in enumerate(prompts())]
    logits = {s.seq_id: [] for s in seqs}
    while engine.has_work:
        for ev in engine.step(keep_logits=True):
            if ev.logits is not None:
                logits[ev.seq.seq_id].append(ev.logits)
    for seq, prompt in zip(seqs, prompts()):
        tokens, ref_logits = greedy_reference(ref, prompt, N_NEW)
        assert seq.output_ids == tokens
        torch.testing.assert_close(torch.stack(logits[seq.seq_id]), ref_logits.float(), atol=1e-4, rtol=0)


def test_gpt_oss_sinks_take_weight_in_prefill_and_decode(tmp_path):
    """Without its sinks (the memory's ``sinks=`` ignored) the model answers otherwise:
    they are in both the prompt's attention and the compiled decode kernel's."""
    from engine.models import gpt_oss

    folder = make_checkpoint(tmp_path / "o", "gpt_oss", **GPT_OSS_TINY)
    engine = Engine.from_pretrained(str(folder), n_ctx=64, n_seq_max=1)
    layer = engine.model.model.layers[0].self_attn
    assert isinstance(layer, gpt_oss.SinkAttention) and layer.sinks.abs().sum() > 0
    with_sinks = logits_of(engine, prompts()[0])
    for layer in engine.model.model.layers:
        layer.self_attn.sinks.data.fill_(-1e4)  # e^-10000: as if there were none
    without = logits_of(engine, prompts()[0])
    assert (with_sinks[0] - without[0]).abs().max() > 1e-2  # the prompt's last row
    assert (with_sinks[1:] - without[1:]).abs().max() > 1e-2  # decode steps (the compiled kernel)


def logits_of(engine: Engine, prompt: list[int], n: int = 3) -> torch.Tensor:
    """The logits of ``n`` greedy steps after ``prompt`` [n, V], from an empty slot 0."""
    engine.memory.seq_rm(0)
    engine.add_sequence(prompt, SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True), seq_id=0)
    logits = []
    while engine.has_work:
        logits += [ev.logits for ev in engine.step(keep_logits=True) if ev.logits is not None]
    return torch.stack(logits)


def test_smollm3s_position_free_layer_is_not_rotated_nor_shifted(tmp_path):
    """The 4th layer takes no rotary positions (transformers' ``no_rope_layers``): its
    stored keys stay as they are when a context shift moves them."""
    folder = make_checkpoint(tmp_path / "s", "smollm3", **SMOLLM3_TINY)
    model = Engine.from_pretrained(str(folder), n_ctx=64, n_seq_max=1).model
    assert model.turns == [True, True, True, False]
    k = torch.randn(5, 2, 16)
    delta = torch.full((5,), -3)
    assert torch.equal(model.rope_shift(3, k, delta), k)
    assert not torch.allclose(model.rope_shift(0, k, delta), k)


@pytest.fixture(scope="module")
def phi3_server(tmp_path_factory):
    from server_proc import ServerProcess

    folder = make_checkpoint(tmp_path_factory.mktemp("phi") / "phi3", "phi3", **PHI3_TINY)
    slots = str(tmp_path_factory.mktemp("slots"))
    with ServerProcess("-m", str(folder), "-np", "1", "-c", "256", "--slot-save-path", slots) as srv:
        srv.wait_ready()
        yield srv, load_reference(folder)


def test_a_long_prompt_does_not_reuse_a_short_cache_and_answers_as_transformers(phi3_server):
    """A 10-token prompt runs short (its slot keeps those rows); the same 10 tokens then
    20 more (30: past the switch) must not reuse them: transformers turns all 30 by the
    long factors. It computes all 30 and answers as transformers does; asked again, it
    reuses its own long cache, also after the slot is saved, erased and restored."""
    import httpx

    srv, ref = phi3_server
    short, long = prompts()[0], prompts()[0] + prompts()[1][:20]

    def complete(prompt: list[int]) -> dict:
        body = {"prompt": prompt, "n_predict": 4, "temperature": 0, "cache_prompt": True, "id_slot": 0,
                "return_tokens": True}  # fmt: skip
        return httpx.post(srv.url + "/completion", json=body, timeout=60).json()

    assert complete(short)["tokens"] == greedy_reference(ref, short, 4)[0]
    answer = complete(long)
    assert answer["timings"]["prompt_n"] == len(long)  # nothing of the short cache reused
    assert answer["tokens"] == greedy_reference(ref, long, 4)[0]
    again = complete(long)
    assert again["timings"]["prompt_n"] == 1 and again["tokens"] == answer["tokens"]
    slot = lambda action, **body: httpx.post(f"{srv.url}/slots/0", params={"action": action}, json=body)  # noqa: E731
    assert slot("save", filename="long.slot").status_code == 200
    assert slot("erase").status_code == 200
    assert slot("restore", filename="long.slot").status_code == 200  # plain token ids in the file
    restored = complete(long)
    assert restored["timings"]["prompt_n"] == 1 and restored["tokens"] == answer["tokens"]


HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"]


@pytest.fixture(scope="module")
def gpt_oss_server(tmp_path_factory):
    """A gpt-oss checkpoint with gpt-oss's own chat template (llama.cpp's copy of the
    release's) and a byte tokenizer that knows the harmony tokens; its server."""
    from gguf_tools import converter_tree
    from server_proc import ServerProcess
    from tokenizers import Tokenizer

    fields = {**GPT_OSS_TINY, "max_position_embeddings": 2048}  # the harmony system header, tools: ~700 bytes
    folder = make_checkpoint(tmp_path_factory.mktemp("oss") / "gpt_oss", "gpt_oss", **fields)
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.add_special_tokens(HARMONY)
    tok.save(str(folder / "tokenizer.json"))
    template = (converter_tree() / "models" / "templates" / "openai-gpt-oss-120b.jinja").read_text()
    (folder / "chat_template.jinja").write_text(template)
    with ServerProcess("-m", str(folder), "-np", "1", "-c", "2048") as srv:
        srv.wait_ready()
        yield srv, folder, template, load_reference(folder), tok


def test_gpt_oss_chats_in_harmony_as_transformers_does(gpt_oss_server):
    """Through the openai client: the prompt is gpt-oss's template as transformers renders
    it (system header, date, reasoning effort, the harmony turns), the answer's tokens are
    transformers' greedy ones; the next turn reuses the first's cache across the
    alternating sliding and full layers and answers as transformers does on it."""
    from openai import OpenAI
    from transformers import PreTrainedTokenizerFast

    srv, folder, template, ref, tok = gpt_oss_server
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    client = OpenAI(base_url=srv.url + "/v1", api_key="none")

    def ids_of(messages: list[dict]) -> list[int]:
        text = hf.apply_chat_template(messages, chat_template=template, add_generation_prompt=True, tokenize=False)
        return tok.encode(text).ids

    first = [{"role": "user", "content": "Name a prime number."}]
    answer = client.chat.completions.create(model="m", messages=first, max_tokens=N_NEW, temperature=0, logprobs=True)
    ids = ids_of(first)
    assert answer.usage.prompt_tokens == len(ids)
    expect, expect_logits = greedy_reference(ref, ids, N_NEW)
    got = [t.logprob for t in answer.choices[0].logprobs.content]
    want = expect_logits.log_softmax(-1).gather(1, torch.tensor(expect)[:, None])[:, 0].tolist()
    assert got == pytest.approx(want[: len(got)], abs=1e-4)
    second = first + [{"role": "assistant", "content": "7"}, {"role": "user", "content": "And another?"}]
    again = client.chat.completions.create(model="m", messages=second, max_tokens=4, temperature=0, logprobs=True)
    ids2 = ids_of(second)
    assert again.usage.prompt_tokens == len(ids2)
    assert again.usage.prompt_tokens_details.cached_tokens > len(ids) // 2  # the first turn's, behind the window too
    expect2, logits2 = greedy_reference(ref, ids2, 4)
    want2 = logits2.log_softmax(-1).gather(1, torch.tensor(expect2)[:, None])[:, 0].tolist()
    assert [t.logprob for t in again.choices[0].logprobs.content] == pytest.approx(want2, abs=1e-4)


WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


def test_gpt_oss_renders_tools_reasoning_and_calls_as_transformers_on_every_route(gpt_oss_server):
    """gpt-oss's template through the chat route with tools, an earlier turn's reasoning
    and a tool call with its result: the prompt is transformers' render of the same
    conversation (reasoning as ``thinking``, the call's arguments an object). The
    Anthropic Messages and Responses routes render the same conversation (system,
    tools) to the same prompt and answer what the chat route answers."""
    from openai import OpenAI
    from transformers import PreTrainedTokenizerFast

    srv, folder, template, ref, tok = gpt_oss_server
    hf = PreTrainedTokenizerFast(tokenizer_file=str(folder / "tokenizer.json"))
    client = OpenAI(base_url=srv.url + "/v1", api_key="none")
    tools = [{"type": "function", "function": WEATHER}]

    def n_ids(messages: list[dict], **kw) -> int:
        text = hf.apply_chat_template(
            messages, chat_template=template, add_generation_prompt=True, tokenize=False, **kw
        )
        return len(tok.encode(text).ids)

    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    sent = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call], "reasoning_content": "I should call the tool."},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    rendered = [dict(m) for m in sent]
    as_object = {**call, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    rendered[2] = {"role": "assistant", "content": "", "thinking": "I should call the tool.", "tool_calls": [as_object]}
    answer = client.chat.completions.create(model="m", messages=sent, tools=tools, max_tokens=4, temperature=0)
    assert answer.usage.prompt_tokens == n_ids(rendered, tools=tools)
    assert n_ids(rendered, tools=tools) > n_ids(rendered[:2], tools=tools) + 20  # the call and its result are in it

    first = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"}]
    chat = client.chat.completions.create(model="m", messages=first, tools=tools, max_tokens=6, temperature=0)
    assert chat.usage.prompt_tokens == n_ids(first, tools=tools)
    anthropic = httpx.post(srv.url + "/v1/messages", json={
        "model": "m", "max_tokens": 6, "temperature": 0, "system": "Be brief.", "messages": first[1:],
        "tools": [{"name": WEATHER["name"], "description": WEATHER["description"],
                   "input_schema": WEATHER["parameters"]}]}, timeout=60).json()  # fmt: skip
    assert anthropic["usage"]["input_tokens"] == chat.usage.prompt_tokens
    said = chat.choices[0].message.content or "", getattr(chat.choices[0].message, "reasoning_content", None) or ""
    assert any(said)  # something to compare: the answer's text, its reasoning, or both
    anthropic_said = tuple(
        "".join(b[kind] for b in anthropic["content"] if b["type"] == kind) for kind in ("text", "thinking")
    )
    assert anthropic_said == said
    responses = httpx.post(srv.url + "/v1/responses", json={
        "model": "m", "max_output_tokens": 6, "temperature": 0, "instructions": "Be brief.",
        "input": "Weather in Paris?", "tools": [{"type": "function", **WEATHER}]}, timeout=60).json()  # fmt: skip
    assert responses["usage"]["input_tokens"] == chat.usage.prompt_tokens
    responses_said = tuple(
        "".join(c["text"] for o in responses["output"] if o["type"] == kind for c in o["content"])
        for kind in ("message", "reasoning")
    )
    assert responses_said == said
