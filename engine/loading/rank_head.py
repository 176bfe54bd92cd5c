"""A decoder reranker's score (issue 54): Qwen3-Reranker judges a (query, document)
pair by its next-token logits for "yes" and "no" at the end of its prompt. The score
kept is their difference, the log-odds of "yes" (its sigmoid is the softmax probability
of "yes" over the two, what the model card computes and llama-server answers).

Where the two rows come from:
- a GGUF file the converter wrote as a reranker (``<arch>.pooling_type`` 4, rank): its
  ``cls.output`` [2, hidden], the LM head's rows of "yes" and "no" (the file may carry
  no other head);
- a folder or any other file, with ``--rerank``: the model's own logits at the tokens
  "yes" and "no" of its vocabulary.

The prompt: the file's ``tokenizer.chat_template.rerank`` (``{query}``, ``{document}``),
else the one the converter writes, Qwen3-Reranker's documented format."""

from __future__ import annotations

from collections.abc import Callable

import torch

TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct "
    'provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)


class RankHead:
    """``head(h)``: the log-odds of "yes" for the final hidden state h [hidden]."""

    def __init__(self, score: Callable[[torch.Tensor], torch.Tensor], template: str = TEMPLATE):
        self._score, self.template = score, template

    def __call__(self, h: torch.Tensor) -> float:
        yes, no = self._score(h).float().tolist()
        return yes - no

    def prompt(self, query: str, document: str) -> str:
        """The model's prompt for the pair (llama-server substitutes the same way)."""
        return self.template.replace("{query}", query).replace("{document}", document)


def rank_head(model, tokenizer, gguf, wanted: bool) -> RankHead | None:
    """The model's rank head, or None: a file written as a reranker always has one; other
    models only when ``wanted`` (``--rerank``) and the vocabulary has "yes" and "no"."""
    template = TEMPLATE
    if gguf is not None:
        template = gguf.fields.get("tokenizer.chat_template.rerank") or TEMPLATE
        if "cls.output.weight" in gguf.tensors and gguf.fields.get(f"{gguf.arch}.pooling_type") == 4:
            rows = gguf.small_tensor("cls.output.weight").float()  # [2, hidden]: yes, no
            return RankHead(lambda h: rows @ h.float(), template)
    if not wanted:
        return None
    yes, no = tokenizer.hf.token_to_id("yes"), tokenizer.hf.token_to_id("no")
    if yes is None or no is None:
        return None
    pair = torch.tensor([yes, no])

    def score(h: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return model.project(h[None].to(model_dtype(model)))[0, pair]  # [2]

    return RankHead(score, template)


def model_dtype(model) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
