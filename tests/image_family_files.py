"""Image-language checkpoints shaped as the files users have (the image half of
tests/family_files.py's corpus):

- the config from transformers' composite config class with size arguments only (the
  image token ids it must name; where the text model's rotary is cut to a tiny head,
  the M-RoPE sections that fit it);
- the family's tokenizer (tests/family_files.write_tokenizer: a vocabulary trained with
  its real split or its SentencePiece kind, its special and image tokens, the class its
  tokenizer_config.json names) and its chat template from llama.cpp's corpus of real
  ones, where the corpus has one that takes images;
- the processor saved by the family's own processor class (``save_pretrained``:
  processor_config.json, transformers 5's form), or where that class cannot be built
  here the image processor saved by its class (preprocessor_config.json): Qwen3.5's
  Qwen3VLProcessor needs torchvision for its video half, which the torch pin rules out;
- the language-model GGUF and the ``--mmproj`` projector GGUF the pinned converter
  writes from the folder, with the family's ``tokenizer.ggml.pre``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from family_files import (
    CHATML,
    GEMMA_TURNS,
    LLAMA3_SPECIALS,
    QWEN35,
    QWEN35_ROPE,
    SIZES,
    Family,
    _mark_special,
    write_tokenizer,
)

QWEN_VISION = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
GEMMA3_IMAGE = ("<start_of_image>", "<image_soft_token>", "<end_of_image>")
IDEFICS3_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>",
                   *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)))  # fmt: skip


@dataclass(frozen=True)
class ImageFamily:
    """``text``: the tokenizer, template and end token (tests/family_files.Family; its
    config fields unused). ``tokens``: config field -> the token whose id it holds.
    ``marker``: what the processor's text holds where an image goes (a template's
    image part renders it; the server's ``<__media__>`` stands for it)."""

    config: str  # the composite config class
    model: str  # the *ForConditionalGeneration class
    text: Family
    image_processor: str
    images: dict  # the image processor's arguments
    marker: str
    processor: str | None = None  # the processor class, where it can be built here
    processor_args: dict = field(default_factory=dict)
    text_config: str | None = None  # the text config's class; None: the composite's name with TextConfig
    gguf: bool = True  # whether the pinned converter writes its language model
    expansion: str = "qwen"  # without a processor here: the processor's rule, "qwen" or "smolvlm"
    text_sizes: dict = field(default_factory=dict)  # text_config sizes over tests/family_files.SIZES
    vision: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)  # the composite config's own
    flags: tuple[str, ...] = ()  # the converter's, for the language model
    named: dict = field(default_factory=dict)  # tokens tokenizer_config.json names (the processor reads them)


QWEN35_TEXT = Family("", "", "Qwen3.5-4B", pre="qwen35", tokenizer_class="Qwen2Tokenizer",
                     specials=CHATML + QWEN_VISION)  # fmt: skip
QWEN35_VISION = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64, patch_size=16,
                     spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=36)  # fmt: skip
# sizes, and the mean and deviation Qwen3.5's published preprocessor_config.json carries
QWEN35_IMAGES = dict(size={"shortest_edge": 64 * 64, "longest_edge": 128 * 128}, patch_size=16, merge_size=2,
                     temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3)  # fmt: skip
QWEN_TOKENS = dict(image_token_id="<|image_pad|>", video_token_id="<|video_pad|>",
                   vision_start_token_id="<|vision_start|>", vision_end_token_id="<|vision_end|>")  # fmt: skip
QWEN35_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=48)

IMAGE_FAMILIES: dict[str, ImageFamily] = {
    "qwen3_5_vl": ImageFamily("Qwen3_5Config", "Qwen3_5ForConditionalGeneration", QWEN35_TEXT, "Qwen2VLImageProcessor",
                              QWEN35_IMAGES, "<|vision_start|><|image_pad|><|vision_end|>",
                              text_sizes=dict(QWEN35, rope_parameters=QWEN35_ROPE), vision=QWEN35_VISION,
                              tokens=QWEN_TOKENS, flags=("--no-mtp",)),
    "qwen3_5_moe_vl": ImageFamily("Qwen3_5MoeConfig", "Qwen3_5MoeForConditionalGeneration", QWEN35_TEXT,
                                  "Qwen2VLImageProcessor", QWEN35_IMAGES,
                                  "<|vision_start|><|image_pad|><|vision_end|>",
                                  text_sizes=dict(QWEN35, **QWEN35_MOE, rope_parameters=QWEN35_ROPE),
                                  vision=QWEN35_VISION, tokens=QWEN_TOKENS, flags=("--no-mtp",)),
    # the corpus holds no Gemma 3 template (Gemma 2's takes no images): served by /completion
    "gemma3_vl": ImageFamily("Gemma3Config", "Gemma3ForConditionalGeneration",
                             Family("", "", None, tokenizer="gemma-spm", tokenizer_class="GemmaTokenizer",
                                    specials=GEMMA_TURNS + GEMMA3_IMAGE, bos="<bos>", eos="<end_of_turn>"),
                             "Gemma3ImageProcessor",
                             dict(size={"height": 28, "width": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3),
                             "<start_of_image>", processor="Gemma3Processor",
                             text_sizes=dict(num_hidden_layers=6, sliding_window=8, query_pre_attn_scalar=16),
                             vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=2, image_size=28, patch_size=7),
                             tokens=dict(image_token_index="<image_soft_token>", boi_token_index="<start_of_image>",
                                         eoi_token_index="<end_of_image>"),
                             sizes=dict(mm_tokens_per_image=4), processor_args=dict(image_seq_length=4),
                             named=dict(boi_token="<start_of_image>", eoi_token="<end_of_image>",
                                        image_token="<image_soft_token>")),
    # no Qwen2.5-VL template in the corpus (Qwen2.5's takes no images): served by /completion;
    # the processor (Qwen2_5_VLProcessor) needs torchvision for its video half
    "qwen2_5_vl": ImageFamily("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
                              Family("", "", None, pre="qwen2", tokenizer_class="Qwen2Tokenizer",
                                     specials=CHATML + QWEN_VISION),
                              "Qwen2VLImageProcessor",
                              dict(size={"shortest_edge": 56 * 56, "longest_edge": 112 * 112}, patch_size=14,
                                   merge_size=2, temporal_patch_size=2),
                              "<|vision_start|><|image_pad|><|vision_end|>",
                              # M-RoPE's sections for a 16-wide head (8 frequencies)
                              text_sizes=dict(rope_parameters={"rope_type": "default", "rope_theta": 1000000.0,
                                                               "mrope_section": [2, 3, 3]}),
                              vision=dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2,
                                          out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                                          temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1]),
                              tokens=QWEN_TOKENS),
    # no Idefics3 template in the corpus: served by /completion; the pinned converter writes
    # only its projector (SmolVLM's language model, not Idefics3's): served from the folder
    "idefics3": ImageFamily("Idefics3Config", "Idefics3ForConditionalGeneration",
                            Family("", "", None, pre="llama-bpe", specials=LLAMA3_SPECIALS + IDEFICS3_TOKENS,
                                   bos="<|begin_of_text|>", eos="<end_of_utterance>"),
                            "Idefics3ImageProcessor",
                            dict(do_image_splitting=True, size={"longest_edge": 56},
                                 max_image_size={"longest_edge": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3),
                            "<image>", processor="Idefics3Processor", processor_args=dict(image_seq_len=4),
                            text_config="LlamaConfig",
                            vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, image_size=28, patch_size=7),
                            tokens=dict(image_token_id="<image>"), sizes=dict(scale_factor=2), gguf=False),
    # no SmolVLM template in the corpus: served by /completion; the processor (SmolVLMProcessor)
    # needs torchvision for its video half
    "smolvlm": ImageFamily("SmolVLMConfig", "SmolVLMForConditionalGeneration",
                           Family("", "", None, pre="smollm", tokenizer_class="GPT2Tokenizer",
                                  specials=CHATML + IDEFICS3_TOKENS, eos="<end_of_utterance>"),
                           "SmolVLMImageProcessor",
                           dict(do_image_splitting=True, size={"longest_edge": 56},
                                max_image_size={"longest_edge": 28}, image_mean=[0.5] * 3, image_std=[0.5] * 3),
                           "<image>", text_config="LlamaConfig",
                           vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                       num_attention_heads=2, image_size=28, patch_size=7),
                           tokens=dict(image_token_id="<image>"), sizes=dict(scale_factor=2), expansion="smolvlm"),
}  # fmt: skip


def build(folder: Path, name: str, seed: int = 0) -> Path:
    """The folder of image family ``name``: tokenizer, template and processor, then the
    model (random weights, every one moved off its init) saved by ``save_pretrained``."""
    import inspect

    import torch
    import transformers
    from checkpoints import jitter
    from tokenizers import Tokenizer as HFTokenizer

    fam = IMAGE_FAMILIES[name]
    write_tokenizer(folder, fam.text)
    if fam.named:  # as the family's published tokenizer_config.json names them
        cfg = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**cfg, "extra_special_tokens": fam.named}))
    image_processor = getattr(transformers, fam.image_processor)(**fam.images)
    if fam.processor is None:
        image_processor.save_pretrained(folder)
    else:
        processor_cls = getattr(transformers, fam.processor)
        tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
        processor = processor_cls(image_processor=image_processor, tokenizer=tokenizer, **fam.processor_args)
        processor.save_pretrained(folder)
        # transformers 5 saved the tokenizer again without added_tokens_decoder, which the
        # hub's files carry and the converter reads the special tokens from
        _mark_special(folder, fam.text.specials, fam.text.rstrip)
    vocab = HFTokenizer.from_file(str(folder / "tokenizer.json"))
    ids = {k: vocab.token_to_id(t) for k, t in fam.tokens.items()}
    end = vocab.token_to_id(fam.text.eos)
    text_cls = getattr(transformers, fam.text_config or fam.config.replace("Config", "TextConfig"))
    known = inspect.signature(text_cls.__init__).parameters
    text = {k: v for k, v in {**SIZES, "vocab_size": vocab.get_vocab_size(), **fam.text_sizes}.items() if k in known}
    text.update({k: end for k in ("eos_token_id", "pad_token_id") if k in known})
    if fam.text.bos is not None and "bos_token_id" in known:
        text["bos_token_id"] = vocab.token_to_id(fam.text.bos)
    config = getattr(transformers, fam.config)(text_config=text, vision_config=fam.vision, **ids, **fam.sizes)
    torch.manual_seed(seed)
    model = getattr(transformers, fam.model)(config)
    jitter(model)
    model.save_pretrained(folder)
    return folder


def hub_spelling(folder: Path, dst: Path, name: str) -> Path:
    """The folder as the family's releases spell it, where transformers 5 saves it in a
    way the pinned converter cannot read: Gemma 3's vision tower under
    ``vision_tower.vision_model.`` (transformers 5.25 saves it under ``vision_tower.``,
    which the converter cannot map); SmolVLM's ``text_config.architectures``
    (``VLlama3ForCausalLM``, by which the converter takes its language model; transformers
    5 writes none). ``folder`` itself for every other family."""
    import shutil

    from safetensors.torch import load_file, save_file

    if name not in ("gemma3_vl", "smolvlm"):
        return folder
    shutil.copytree(folder, dst)
    if name == "gemma3_vl":
        weights = load_file(dst / "model.safetensors")
        moved = {k.replace("vision_tower.", "vision_tower.vision_model.", 1): v for k, v in weights.items()}
        save_file(moved, dst / "model.safetensors", metadata={"format": "pt"})
    else:
        config = json.loads((dst / "config.json").read_text())
        config["text_config"]["architectures"] = ["VLlama3ForCausalLM"]
        (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def convert(folders: dict[str, Path], root: Path) -> dict[str, tuple[Path, Path]]:
    """family -> (model GGUF, projector GGUF) of each folder (as the family's releases
    spell it) by the pinned converter: the language models in one interpreter, the
    projectors in another, side by side."""
    from gguf_tools import _run_converters

    models, projectors, out = [], [], {}
    for name, folder in folders.items():
        fam = IMAGE_FAMILIES[name]
        source = str(hub_spelling(folder, root / f"{name}-hub", name))
        model, mmproj = root / f"{name}.gguf", root / f"{name}-mmproj.gguf"
        pre = fam.text.pre if fam.text.tokenizer == "bpe" else None
        models.append(("convert_hf_to_gguf.py", ["--outfile", str(model), "--outtype", "f32", *fam.flags, source], pre))
        projectors.append(("convert_hf_to_gguf.py", ["--outfile", str(mmproj), "--outtype", "f32", "--mmproj", source],
                           None))  # fmt: skip
        out[name] = (model, mmproj)
    _run_converters([models, projectors])
    return out
