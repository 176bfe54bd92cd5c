"""A checkpoint loaded: its config, tokenizer, model and fingerprint, from a Hugging
Face folder or a GGUF file, with ``--chat-template`` applied."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.errors import CheckpointError
from engine.loading.checkpoint import Progress, load_model
from engine.loading.fingerprint import model_fingerprint
from engine.loading.gguf.checkpoint import GGUFCheckpoint, is_gguf
from engine.loading.gguf.mmproj import MmprojFile
from engine.loading.gguf.tokenizer import gguf_tokenizer
from engine.loading.pooling_hint import checkpoint_pooling
from engine.loading.rank_head import RankHead, rank_head
from engine.models.base import DecoderLM
from engine.models.config import ModelConfig, load_model_config, parse_model_config
from engine.text.chat_template import resolve_template
from engine.text.tokenizer import Tokenizer

log = logging.getLogger("slotserve.engine")
VISION_ARCHS = {  # (a GGUF language model, its --mmproj's projector type) -> (the model, its model_type)
    ("Gemma3ForCausalLM", "gemma3"): ("Gemma3ForConditionalGeneration", "gemma3"),
    ("LlamaForCausalLM", "idefics3"): ("SmolVLMForConditionalGeneration", "smolvlm"),
    ("Qwen2ForCausalLM", "qwen2.5vl_merger"): ("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl"),
    ("Qwen3_5ForCausalLM", "qwen3vl_merger"): ("Qwen3_5ForConditionalGeneration", "qwen3_5"),
    ("Qwen3_5MoeForCausalLM", "qwen3vl_merger"): ("Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe"),
}


@dataclass
class LoadedModel:
    model_config: ModelConfig
    tokenizer: Tokenizer
    model: DecoderLM
    fingerprint: dict[str, str]  # for slot files: taken before any kernel repacks the weights
    pooling: str | None = None  # the embedding pooling the checkpoint names (engine/loading/pooling_hint.py)
    rank_head: RankHead | None = None  # a decoder reranker's score (engine/loading/rank_head.py)


def load(config: EngineConfig, progress: Progress | None = None) -> LoadedModel:
    """Raises CheckpointError (or UnsupportedArchitecture) naming the file and field;
    ValueError for a ``--chat-template`` that is neither a built-in name nor a template."""
    gguf = GGUFCheckpoint(config.model, mmap=config.mmap) if is_gguf(config.model) else None
    mmproj = None
    if gguf is not None:
        model_config = parse_model_config(gguf.hf_config(), config.model)
        tokenizer = gguf_tokenizer(gguf)
        if config.mmproj is not None:
            mmproj = MmprojFile(config.mmproj)
            media = mmproj.media_config(tokenizer.hf.token_to_id)
            arch = VISION_ARCHS.get((model_config.architecture, mmproj.kind))
            if arch is None:
                raise CheckpointError(
                    f"{config.mmproj}: a {mmproj.kind} projector for a {model_config.architecture} is not served"
                )
            model_config = dataclasses.replace(model_config, architecture=arch[0], model_type=arch[1], media=media)
    else:
        model_config = load_model_config(config.model)
        tokenizer = Tokenizer.from_folder(config.model, model_config.eos_token_ids)
    if config.chat_template is not None:
        tokenizer.use_chat_template(*resolve_template(config.chat_template))
    elif tokenizer.chat_template is None:  # llama-server's fallback
        tokenizer.use_chat_template(*resolve_template("chatml"))
        log.info("the model has no chat template: chat requests use chatml (as llama-server; --chat-template sets one)")
    if config.mmproj is not None and gguf is None:
        raise CheckpointError(
            f"{config.mmproj}: --mmproj goes with a GGUF model (a Hugging Face folder has its encoder)"
        )
    model = load_model(config.model, model_config, config.torch_dtype, config.torch_device, gguf, progress, mmproj)
    fingerprint = model_fingerprint(model_config, model, config.dtype)
    pooling = checkpoint_pooling(config.model, gguf.fields if gguf is not None else None)
    head = rank_head(model, tokenizer, gguf, config.rerank)
    return LoadedModel(model_config, tokenizer, model, fingerprint, pooling, head)
