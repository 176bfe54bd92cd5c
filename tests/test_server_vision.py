"""Images through the OpenAI chat route (issue 38, first step): a real server on a tiny
Gemma 3 vision-language checkpoint, asked with the ``openai`` client and a data: URL;
transformers is the oracle on the prompt its Gemma 3 processor would build (the template's
text with the begin-of-image marker replaced by blank line, begin, image tokens, end,
blank line; the image through its PIL image processor). A follow-up about the same
image reuses its cache; another image does not."""

from __future__ import annotations

import base64
import io

import numpy as np
import pytest
import torch
from checkpoints import VISION_TEMPLATE as TEMPLATE
from checkpoints import make_gemma3_vision, write_vision_tokenizer
from server_proc import ServerProcess, metric

PER_IMAGE = 4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from tokenizers import Tokenizer

    folder = tmp_path_factory.mktemp("gemma3") / "m"
    image, boi, eoi, vocab = write_vision_tokenizer(folder)
    model = make_gemma3_vision(
        folder, image, boi, eoi, PER_IMAGE, vocab_size=vocab, sliding_window=16, eos_token_id=None,
        bos_token_id=None, pad_token_id=0,
    )  # fmt: skip
    return folder, model, Tokenizer.from_file(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def server(checkpoint, tmp_path_factory):
    slots = tmp_path_factory.mktemp("slots")
    flags = ("-np", "2", "-c", "1024", "--slot-save-path", str(slots), "--metrics", "--embeddings")
    with ServerProcess("-m", str(checkpoint[0]), *flags) as srv:
        srv.wait_ready()
        yield srv


def png(seed: int):
    from PIL import Image

    image = Image.fromarray(np.random.default_rng(seed).integers(0, 256, (33, 41, 3), dtype=np.uint8))
    out = io.BytesIO()
    image.save(out, format="PNG")
    return image, "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def expected(checkpoint, question: str, image, n: int) -> tuple[str, list[float]]:
    """transformers' greedy answer for a user turn of ``question`` then the image: its
    text and each chosen token's log probability."""
    import jinja2
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    _, model, tok = checkpoint
    text = jinja2.Template(TEMPLATE).render(messages=[{"role": "user", "content": question + "<start_of_image>"}])
    full = "\n\n<start_of_image>" + "<image_soft_token>" * PER_IMAGE + "<end_of_image>\n\n"  # Gemma3Processor's
    ids = tok.encode(text.replace("<start_of_image>", full)).ids
    processor = Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    pixels = processor(images=image, return_tensors="pt")["pixel_values"]
    input_ids = torch.tensor([ids])
    image_id = tok.token_to_id("<image_soft_token>")
    out = model.generate(
        input_ids, pixel_values=pixels, token_type_ids=(input_ids == image_id).long(), max_new_tokens=n,
        do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        attention_mask=torch.ones_like(input_ids),
    )  # fmt: skip
    chosen = out.sequences[0, len(ids) :]
    logprobs = torch.stack(out.logits)[:, 0].log_softmax(-1).gather(1, chosen[:, None])[:, 0]
    return tok.decode(chosen.tolist(), skip_special_tokens=True), logprobs.tolist()


def ask(server, question: str, url: str, n: int = 10, slot: int = -1) -> tuple[str, int, list[float]]:
    """The answer's text, how many prompt tokens came from the cache, each token's logprob."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    content = [{"type": "text", "text": question}, {"type": "image_url", "image_url": {"url": url}}]
    answer = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}], max_tokens=n, temperature=0, logprobs=True,
        extra_body={"id_slot": slot},
    )  # fmt: skip
    assert answer.usage.completion_tokens == n
    logprobs = [t.logprob for t in answer.choices[0].logprobs.content]
    return answer.choices[0].message.content, answer.usage.prompt_tokens_details.cached_tokens, logprobs


def test_an_image_in_a_chat_message_is_answered_as_transformers_does(checkpoint, server):
    image, url = png(1)
    text, _, logprobs = ask(server, "what is this? ", url)
    expect_text, expect_logprobs = expected(checkpoint, "what is this? ", image, 10)
    assert text == expect_text
    assert logprobs == pytest.approx(expect_logprobs, abs=1e-4)
    _, other = png(7)
    other_logprobs = ask(server, "what is this? ", other)[2]
    assert max(abs(a - b) for a, b in zip(other_logprobs, logprobs)) > 1e-3  # the answer depends on the image


def test_the_same_image_again_comes_from_the_cache_another_does_not(server):
    _, url = png(2)
    _, other = png(3)
    ask(server, "describe: ", url)
    cached = ask(server, "describe: ", url)[1]  # the same prompt: all but the last token reused
    assert cached > 20
    cached_other = ask(server, "describe: ", other)[1]
    assert cached_other < 20  # up to the image at most (the question's text before it)


def test_bad_images_are_refused_with_the_part_named(server):
    import httpx

    def post(url: str) -> httpx.Response:
        content = [{"type": "text", "text": "hi"}, {"type": "image_url", "image_url": {"url": url}}]
        body = {"messages": [{"role": "user", "content": content}]}
        return httpx.post(server.url + "/v1/chat/completions", json=body)

    for url, says in (
        ("data:image/png;base64," + base64.b64encode(b"not a png").decode(), "image 0: not an image"),
        ("data:image/png;base64,@@@", "not valid base64"),
        ("https://example.com/cat.png", "start with --media-urls to fetch"),
    ):
        r = post(url)
        assert r.status_code == 400 and says in r.json()["error"]["message"], r.text
    assert httpx.get(server.url + "/health").status_code == 200


def test_images_past_what_the_process_holds_for_pending_requests_are_a_503(checkpoint, monkeypatch):
    """The frames of all pending requests are bounded together (engine/text/images.py,
    FRAMES): an image that does not fit beside them is a 503 with Retry-After, not a 400
    (the request is not at fault), and nothing is queued; with room again it is served."""
    import httpx
    from server_proc import InProcessServer

    from engine.text.images import FRAMES

    _, url = png(21)
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"},
                                                      {"type": "image_url", "image_url": {"url": url}}]}],
            "max_tokens": 2}  # fmt: skip
    with InProcessServer(model=checkpoint[0], parallel=1, ctx_size=1024) as srv:
        monkeypatch.setattr(FRAMES, "nbytes", FRAMES.held + 16)  # less room than one frame
        r = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        assert "images for pending requests" in r.json()["error"]["message"]
        monkeypatch.undo()
        assert httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=60).status_code == 200


def test_anthropic_and_responses_take_images_as_the_chat_route(server):
    """An Anthropic image block (base64 source) and a Responses input_image reach the
    model as the chat route's image part does: the same greedy answer, and the prompt
    counts the image's positions."""
    import httpx

    _, url = png(5)
    data = url.split(",", 1)[1]
    chat_text = ask(server, "see: ", url, n=8)[0]
    blocks = [{"type": "text", "text": "see: "}, {"type": "image", "source": {"type": "base64",
              "media_type": "image/png", "data": data}}]  # fmt: skip
    body = {"model": "m", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": blocks}]}
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == chat_text
    parts = [{"type": "input_text", "text": "see: "}, {"type": "input_image", "image_url": url}]
    r = httpx.post(server.url + "/v1/responses", json={"model": "m", "max_output_tokens": 8, "temperature": 0,
                                                       "input": [{"role": "user", "content": parts}]})  # fmt: skip
    assert r.status_code == 200, r.text
    assert r.json()["output"][-1]["content"][0]["text"] == chat_text
    with_image = httpx.post(server.url + "/v1/messages/count_tokens", json=body).json()["input_tokens"]
    body["messages"][0]["content"] = blocks[:1]
    without = httpx.post(server.url + "/v1/messages/count_tokens", json=body).json()["input_tokens"]
    assert with_image - without >= PER_IMAGE + 2  # the image tokens, begin and end


def test_an_image_in_a_tool_result_reaches_the_model(server):
    """A tool that returns a picture: Anthropic's tool_result with an image block, and
    OpenAI's tool message with an image part, give the same greedy answer (the image in
    the tool's turn), and another picture another answer."""
    import httpx

    _, url = png(21)
    call = {"id": "t1", "type": "function", "function": {"name": "camera", "arguments": "{}"}}
    openai_messages = [
        {"role": "user", "content": "take a picture"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "t1", "content": [{"type": "text", "text": "shot: "},
                                                            {"type": "image_url", "image_url": {"url": url}}]},
    ]  # fmt: skip
    chat = lambda messages: httpx.post(server.url + "/v1/chat/completions", json={  # noqa: E731
        "messages": messages, "max_tokens": 8, "temperature": 0, "logprobs": True})  # fmt: skip
    r = chat(openai_messages)
    assert r.status_code == 200, r.text
    chat_answer = r.json()["choices"][0]["message"]["content"]
    chat_logprobs = [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": url.split(",", 1)[1]}}
    messages = [
        {"role": "user", "content": "take a picture"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "camera", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [{"type": "text", "text": "shot: "}, image]}]},
    ]  # fmt: skip
    body = {"model": "m", "max_tokens": 8, "temperature": 0, "messages": messages}
    r = httpx.post(server.url + "/v1/messages", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["content"][0]["text"] == chat_answer
    assert r.json()["usage"]["input_tokens"] > PER_IMAGE
    openai_messages[2]["content"][1]["image_url"]["url"] = png(22)[1]
    other = [t["logprob"] for t in chat(openai_messages).json()["choices"][0]["logprobs"]["content"]]
    assert max(abs(a - b) for a, b in zip(chat_logprobs, other)) > 1e-4  # the picture matters


def test_embeddings_take_images(server):
    """llama-server's /embeddings with prompt objects (its test_vision_embeddings) and
    OpenAI's route with a content entry of text and image parts: the same image gives
    the same vector either way (to float rounding: llama-server's test asks bitwise,
    which a batch of other shapes does not give here), another image or none another."""
    import httpx

    data, other = png(23)[1].split(",", 1)[1], png(24)[1].split(",", 1)[1]
    text = "What is this: <__media__>\n"
    content = [
        {"prompt_string": text, "multimodal_data": [data]},
        {"prompt_string": text, "multimodal_data": [data]},
        {"prompt_string": text, "multimodal_data": [other]},
        {"prompt_string": "What is this: \n"},
    ]
    r = httpx.post(server.url + "/embeddings", json={"content": content})
    assert r.status_code == 200, r.text
    vectors = [torch.tensor(e["embedding"]) for e in r.json()]  # [1, hidden] each (pooled)
    assert (vectors[0] - vectors[1]).abs().max() < 1e-5  # equal to rounding: batch shapes differ (not bitwise)
    assert (vectors[0] - vectors[2]).abs().max() > 1e-3 and (vectors[0] - vectors[3]).abs().max() > 1e-3
    parts = [{"type": "text", "text": "What is this: "}, {"type": "image_url", "image_url": {"url": png(23)[1]}},
             {"type": "text", "text": "\n"}]  # fmt: skip
    r = httpx.post(server.url + "/v1/embeddings", json={"input": [{"content": parts}, content[0]]})
    assert r.status_code == 200, r.text
    a, b = (e["embedding"] for e in r.json()["data"])
    assert a == pytest.approx(b, abs=1e-6)
    bad = httpx.post(
        server.url + "/embeddings", json={"content": [{"prompt_string": text, "multimodal_data": ["eA=="]}]}
    )
    assert bad.status_code == 400 and "image 0" in bad.json()["error"]["message"]


def test_a_slot_with_an_image_is_saved_and_restored(server):
    """Beyond llama-server (which refuses multimodal slot saves): the file holds the
    image as its key; restored into the emptied slot, the same question about the same
    image computes only its last token, and the answer is the one before."""
    import httpx

    _, url = png(11)
    first = ask(server, "keep: ", url, slot=1)
    slot = lambda action, **body: httpx.post(f"{server.url}/slots/1", params={"action": action}, json=body)  # noqa: E731
    assert slot("save", filename="image.slot").status_code == 200
    assert slot("erase").json()["n_erased"] > 20
    restored = slot("restore", filename="image.slot")
    assert restored.status_code == 200, restored.text
    again = ask(server, "keep: ", url, slot=1)
    assert again[1] > 20 and again[0] == first[0]
    assert again[2] == pytest.approx(first[2], abs=1e-4)


def test_completion_takes_multimodal_data_at_its_markers(checkpoint, server):
    """llama-server's /completion: a prompt object whose text holds <__media__> and whose
    multimodal_data holds the image (base64): the greedy tokens transformers gives on
    the prompt Gemma 3's processor makes of that text."""
    import httpx
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    _, model, tok = checkpoint
    image, url = png(13)
    text = "look<__media__>then"
    full = "\n\n<start_of_image>" + "<image_soft_token>" * PER_IMAGE + "<end_of_image>\n\n"
    ids = tok.encode(text.replace("<__media__>", full)).ids
    processor = Gemma3ImageProcessorPil(size={"height": 28, "width": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3)
    input_ids = torch.tensor([ids])
    image_id = tok.token_to_id("<image_soft_token>")
    out = model.generate(
        input_ids, pixel_values=processor(images=image, return_tensors="pt")["pixel_values"],
        token_type_ids=(input_ids == image_id).long(), max_new_tokens=8, do_sample=False, pad_token_id=0,
        attention_mask=torch.ones_like(input_ids),
    )  # fmt: skip
    prompt = {"prompt_string": text, "multimodal_data": [url.split(",", 1)[1]]}
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "return_tokens": True}
    r = httpx.post(server.url + "/completion", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["tokens"] == out[0, len(ids) :].tolist()
    assert r.json()["tokens_evaluated"] == len(ids)


def test_tokenize_apply_template_and_models_show_the_images(checkpoint, server):
    """/tokenize of a prompt object shows the image's placeholders and where they stand
    (its id is the digest prefix reuse compares: the same image, the same id);
    /apply-template keeps the image part as llama-server's marker; /models says
    "multimodal" as llama-server does."""
    import httpx

    _, _, tok = checkpoint
    image_id = tok.token_to_id("<image_soft_token>")
    data = png(19)[1].split(",", 1)[1]
    body = {"content": {"prompt_string": "a<__media__>b", "multimodal_data": [data]}, "with_pieces": True}
    shown = httpx.post(server.url + "/tokenize", json=body).json()
    (span,) = shown["media"]
    pieces = shown["tokens"][span["start"] : span["start"] + span["n_tokens"]]
    assert span["n_tokens"] == PER_IMAGE and {p["id"] for p in pieces} == {image_id}
    assert {p["piece"] for p in pieces} == {"<image_soft_token>"}
    assert shown["tokens"][span["start"] - 1]["piece"] == "<start_of_image>"
    again = httpx.post(server.url + "/tokenize", json={**body, "with_pieces": False}).json()
    assert again["media"] == shown["media"] and again["tokens"] == [p["id"] for p in shown["tokens"]]
    other = {"content": {"prompt_string": "a<__media__>b", "multimodal_data": [png(20)[1].split(",", 1)[1]]}}
    assert httpx.post(server.url + "/tokenize", json=other).json()["media"][0]["id"] != span["id"]
    assert "media" not in httpx.post(server.url + "/tokenize", json={"content": "a<__media__>b"}).json()
    content = [{"type": "text", "text": "see "}, {"type": "image_url", "image_url": {"url": png(19)[1]}}]
    r = httpx.post(server.url + "/apply-template", json={"messages": [{"role": "user", "content": content}]})
    assert r.json()["prompt"].startswith("user: see <__media__>")
    models = httpx.get(server.url + "/v1/models").json()
    assert models["models"][0]["capabilities"] == ["completion", "multimodal"]


def test_the_encoders_work_is_counted_in_metrics(server):
    before = metric(server.url, "slotserve_images_encoded_total")
    seconds = metric(server.url, "slotserve_image_encode_seconds_total")
    ask(server, "count: ", png(17)[1], n=2)
    assert metric(server.url, "slotserve_images_encoded_total") == before + 1
    assert metric(server.url, "slotserve_image_encode_seconds_total") > seconds


def test_an_image_url_is_fetched_with_media_urls(checkpoint, tmp_path):
    """--media-urls fetches http(s) image URLs (here from this machine, so with
    --media-urls-private too): the same answer as the image's data: URL; a URL that
    answers 404 is a 400 naming the image. With --sleep-idle-seconds 1, an image that
    takes 3 s to arrive does not let the model go to sleep under its request (which
    then got a 503)."""
    import functools
    import http.server
    import threading
    import time

    image, url = png(19)
    (tmp_path / "cat.png").write_bytes(base64.b64decode(url.split(",", 1)[1]))

    class Files(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path.startswith("/slow/"):
                time.sleep(3)
                self.path = self.path[len("/slow") :]
            return super().do_GET()

    handler = functools.partial(Files, directory=str(tmp_path))
    files = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=files.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{files.server_address[1]}"
    try:
        flags = ("-np", "1", "-c", "512", "--no-webui", "--media-urls", "--media-urls-private")
        with ServerProcess("-m", str(checkpoint[0]), *flags, "--sleep-idle-seconds", "1") as srv:
            srv.wait_ready()
            fetched = ask(srv, "what is this? ", base + "/cat.png")
            inline = ask(srv, "what is this? ", url)
            assert fetched[0] == inline[0] and fetched[2] == pytest.approx(inline[2], abs=1e-4)
            import httpx

            content = [{"type": "image_url", "image_url": {"url": base + "/missing.png"}}]
            r = httpx.post(srv.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]})
            assert r.status_code == 400 and "image 0" in r.json()["error"]["message"] and "404" in r.text
            assert ask(srv, "what is this? ", base + "/slow/cat.png")[0] == inline[0]
    finally:
        files.shutdown()


def test_the_web_page_attaches_an_image(server, tmp_path):
    """The chat page shows the image control for a model that takes images (/props'
    modalities), sends the chosen file with the message and shows it."""
    import shutil

    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        from unavailable import unavailable

        unavailable("Debian's chromium is not installed (.ci/run installs it)", "SLOTSERVE_SKIP_BROWSER")
    _, url = png(23)
    (tmp_path / "dog.png").write_bytes(base64.b64decode(url.split(",", 1)[1]))
    before = metric(server.url, "slotserve_images_encoded_total")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(server.url + "/")
        page.locator("#attach").wait_for()  # shown: this model takes images
        page.set_input_files("#image", str(tmp_path / "dog.png"))
        page.fill("#prompt", "what is it?")
        page.fill("#max-tokens", "4")
        page.click("#send")
        page.wait_for_function("document.querySelector('#stop').disabled && document.querySelector('.msg.assistant')")
        assert page.locator(".msg.user img.attached").count() == 1
        browser.close()
    assert metric(server.url, "slotserve_images_encoded_total") == before + 1


@pytest.mark.parametrize("url, why", [("http://127.0.0.1:9/cat.png", "loopback"),
                                      ("http://169.254.169.254/latest", "link-local"),
                                      ("http://10.0.0.7/cat.png", "private")])  # fmt: skip
def test_an_image_url_to_a_private_address_is_refused_before_any_connection(url, why):
    """--media-urls alone: loopback, link-local (cloud metadata) and private targets are
    refused after resolution, by the MCP proxy's rules (server/pipeline/outbound.py)."""
    import asyncio
    from types import SimpleNamespace

    from server.errors import APIError
    from server.pipeline.media import image_bytes

    settings = SimpleNamespace(media_urls=True, media_urls_private=False)
    with pytest.raises(APIError) as refused:
        asyncio.run(image_bytes(url, "image 0", settings))
    message = refused.value.message
    assert refused.value.status == 403 and why in message and "--media-urls-private" in message


def test_one_bound_on_images_across_a_requests_prompts_and_inputs(server):
    """16 images a request, counted across /completion's prompt objects and the
    embeddings' inputs (each once held 16 of its own): 400 naming the part, and the
    server serves on."""
    import httpx

    data = png(29)[1].split(",", 1)[1]
    nine = {"prompt_string": "a" + "<__media__>" * 9, "multimodal_data": [data] * 9}
    r = httpx.post(server.url + "/completion", json={"prompt": [nine, nine], "n_predict": 1})
    assert r.status_code == 400 and "prompt[1].multimodal_data" in r.json()["error"]["message"], r.text
    assert "at most 16 images a request" in r.json()["error"]["message"]
    r = httpx.post(server.url + "/embeddings", json={"content": [nine, nine]})
    assert r.status_code == 400 and "input[1]" in r.json()["error"]["message"], r.text
    r = httpx.post(server.url + "/completion", json={"prompt": [nine], "n_predict": 1})
    assert r.status_code == 200, r.text


def test_decoding_stays_within_the_requests_budget(server):
    """Small files that decode big: a 7000 x 7000 PNG is ~50 KB and 196 MB decoded.
    Six of them in one chat pass the count and the pixel cap but not the request's
    1 GiB: 400 naming the image, before any is decoded; an 8000 x 8000 one (64 M
    pixels) is over the cap."""
    import httpx
    from PIL import Image

    def url(side: int) -> str:
        out = io.BytesIO()
        Image.new("L", (side, side)).save(out, format="PNG")
        return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()

    big = url(7000)
    content = [{"type": "text", "text": "hi"}] + [{"type": "image_url", "image_url": {"url": big}}] * 6
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]})
    message = r.json()["error"]["message"]
    assert r.status_code == 400 and "messages.0.content: image 5" in message and "decoded pixels" in message, r.text
    content = [{"type": "image_url", "image_url": {"url": url(8000)}}]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": content}]})
    assert r.status_code == 400 and "more than 50000000 pixels" in r.json()["error"]["message"], r.text
    assert httpx.get(server.url + "/health").status_code == 200
