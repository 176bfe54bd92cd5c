"""Fill-in-the-middle (llama-server's ``/infill``): the model's FIM tokens, and the
prompt laid out as llama-server lays it out (the repository-level pattern of
Qwen2.5-Coder's report, arXiv 2409.12186):

    [FIM_REP]myproject\\n [FIM_SEP]name0\\n text0 ... [FIM_SEP]filename\\n
    [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]prompt-so-far

The tokens come from GGUF metadata where it names them, else from the vocabulary by
the names the model families use (llama.cpp's list: Qwen, StarCoder, CodeLlama,
DeepSeek, CodeGemma, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

NAMES = {  # role -> token texts that play it, in the order llama.cpp tries them
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<|fim▁begin|>", "<｜fim▁begin｜>", "<|fim_begin|>",
            "<PRE>", "▁<PRE>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<|fim▁hole|>", "<｜fim▁hole｜>", "<|fim_hole|>",
            "<SUF>", "▁<SUF>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<|fim▁end|>", "<｜fim▁end｜>", "<|fim_end|>",
            "<MID>", "▁<MID>"),
    "rep": ("<|repo_name|>", "<repo_name>", "<reponame>"),
    "sep": ("<|file_sep|>", "<file_sep>", "<filename>"),
}  # fmt: skip
GGUF_KEYS = {
    "pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "rep": ("tokenizer.ggml.fim_rep_token_id",),
    "sep": ("tokenizer.ggml.fim_sep_token_id",),
}
SNIPPET = "\n\n--- snippet ---\n\n"  # between extra files when the model has no file separator (llama-server's)


@dataclass(frozen=True)
class FimTokens:
    pre: int | None = None
    suf: int | None = None
    mid: int | None = None
    rep: int | None = None
    sep: int | None = None

    def missing(self) -> list[str]:
        """What keeps the model from infilling (llama-server's words), [] when nothing."""
        names = {"pre": "prefix", "suf": "suffix", "mid": "middle"}
        return [f"{names[r]} token is missing" for r in ("pre", "suf", "mid") if getattr(self, r) is None]


def find_fim_tokens(token_to_id: Callable[[str], int | None], gguf_fields: dict | None = None) -> FimTokens:
    """The FIM tokens: GGUF metadata first, then the known names (``token_to_id``: a
    token's id or None, asked of a few names only, never the whole vocabulary)."""
    found = {}
    for role, names in NAMES.items():
        ids = [gguf_fields.get(k) for k in GGUF_KEYS[role]] if gguf_fields else []
        ids += [token_to_id(n) for n in names]
        found[role] = next((i for i in ids if isinstance(i, int) and i >= 0), None)
    return FimTokens(**found)


def infill_prompt(
    encode, bos: int | None, fim: FimTokens, prefix: str, suffix: str, extra: list[tuple[str, str]], prompt: str,
    n_batch: int, n_predict: int, n_ctx: int,
) -> list[int]:  # fmt: skip
    """The infill prompt's token ids, as llama-server builds them. ``encode(text)``:
    ids without special tokens; ``bos``: the id to start with, or None; ``extra``:
    (filename, text) of other files. The prefix keeps its last 3/4 of a batch, the
    suffix its first quarter less the prompt; the extra files fill what the context
    has left after a batch and twice the answer, the latest kept."""
    extra_ids: list[int] = []
    if fim.rep is not None:
        extra_ids += [fim.rep, *encode("myproject\n")]
    for filename, text in extra:
        extra_ids += [fim.sep, *encode(filename + "\n")] if fim.sep is not None else encode(SNIPPET)
        extra_ids += encode(text)
    if fim.sep is not None:
        extra_ids += [fim.sep, *encode("filename\n")]
    prompt_ids = encode(prompt) if prompt else []
    prefix_ids, suffix_ids = encode(prefix), encode(suffix)
    n_prefix = min(len(prefix_ids), 3 * (n_batch // 4))
    n_suffix = min(len(suffix_ids), max(0, n_batch // 4 - (2 + len(prompt_ids))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_ids))
    head = [fim.pre, *prefix_ids[len(prefix_ids) - n_prefix :], *prompt_ids]
    tail = [fim.suf, *suffix_ids[:n_suffix]]
    start = ([bos] if bos is not None else []) + (extra_ids[len(extra_ids) - n_extra :] if n_extra else [])
    return [*start, *head, *tail, fim.mid]
