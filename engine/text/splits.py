"""How a byte-pair tokenizer cuts text into words before its merges, by the name
llama.cpp's converter writes as ``tokenizer.ggml.pre`` (one entry per name the pinned
llama.cpp knows, ``src/llama-vocab.cpp``).

Each split is the family's own ``tokenizer.json`` pre-tokenizer: regexes applied in
order, each cutting the pieces of the one before (``Split``, behaviour ``Isolated``),
then the byte-level alphabet. Where llama.cpp rewrote a regex for its own regex engine
(``(?i:...)`` spelled out, ``\\p{Lu}`` approximated by lookaheads), this table keeps the
original: a GGUF file answers as the Hugging Face folder it was converted from. The
flags are the family's tokenizer's: ``ignore_merges`` (a word already in the
vocabulary is one token, llama.cpp's flag of the same name), ``nfc`` (the folder's
NFC normalizer), and the alphabet (GPT-2's bytes, or raw UTF-8 with spaces written as
U+2581 as Gemma 4's SentencePiece-style BPE, or raw UTF-8 as a whitespace split).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# The regexes as the families' tokenizer.json files write them.
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}" + _TAIL
QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL
QWEN35 = (
    _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_UPPER, _LOWER = r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]", r"[\p{Ll}\p{Lm}\p{Lo}\p{M}]"


def _cased(suffix: str) -> str:
    """Words cut where the case changes (an upper-case run, then lower case), ``suffix`` after each."""
    lead = r"[^\r\n\p{L}\p{N}]?"
    return f"{lead}{_UPPER}*{_LOWER}+{suffix}|{lead}{_UPPER}+{_LOWER}*{suffix}"


TEKKEN = _cased("") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
O200K = _cased(_CONTRACTIONS + "?") + r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_HANLESS = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
_HANLESS_UP = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*"
KIMI_K2 = (  # tiktoken's pattern in Kimi's tokenization_kimi.py (no tokenizer.json)
    rf"[\p{{Han}}]+|{_HANLESS}{_CONTRACTIONS}?|{_HANLESS_UP}{_CONTRACTIONS}?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"
_DEEPSEEK3_WORDS = (
    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK_LETTERS = (  # escaped: NFC would fold some of these letters into others
    r"\s?[A-Za-z"
    "\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-"
    "\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5"
    "\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba"
    "\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45"
    "\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe"
    "\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc"
    "\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134"
    "\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf"
    "\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-"
    "\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-"
    "\U000118df\U0001e900-\U0001e943"
    "]+"
)
_DEEPSEEK_CJK = "[一-龥ࠀ-一가-\ud7ff]+"
_PUNCT_RUN = r"[\p{P}\$\+<=>\^~\|`]+"  # tokenizers' Punctuation(contiguous) on ASCII and Unicode punctuation
_NOT_SENTENCE_END = r" ?[^(\s|.,!?…。，、।۔،)]+"
_AFMOE_CJK = "[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff가-\ud7afᄀ-ᇿ]+"
_DIGITS_BY_THREE = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?:\P{N}|$))"  # 1234567 -> 1 234 567

Alphabet = Literal["bytes", "escaped", "raw"]


@dataclass(frozen=True)
class Split:
    """One pre-tokenizer: ``regexes`` in order (each ``Split``/``Isolated`` over the
    pieces of the one before); ``alphabet``: ``bytes`` (GPT-2's byte-level characters),
    ``escaped`` (raw UTF-8, spaces as U+2581: Gemma 4, Sarvam), ``raw`` (raw UTF-8, cut
    at whitespace, which is dropped: jina-embeddings-v2-base-zh)."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False
    nfc: bool = False
    alphabet: Alphabet = "bytes"

    def pre_tokenizer(self) -> dict:
        """The ``pre_tokenizer`` object of a tokenizer.json."""
        if self.alphabet == "raw":  # llama.cpp's whitespace session: runs of non-space, the spaces dropped
            return {"type": "WhitespaceSplit"}
        steps = [
            {"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": False} for r in self.regexes
        ]
        if self.alphabet == "bytes":
            steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False})
        return steps[0] if len(steps) == 1 else {"type": "Sequence", "pretokenizers": steps}

    def normalizer(self) -> dict | None:
        """The ``normalizer`` object of a tokenizer.json (None: none)."""
        steps = [{"type": "NFC"}] if self.nfc else []
        if self.alphabet == "escaped":
            steps.append({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})
        return None if not steps else steps[0] if len(steps) == 1 else {"type": "Sequence", "normalizers": steps}


_GPT2 = Split((GPT2,))
_LLAMA3 = Split((LLAMA3,), ignore_merges=True)
_QWEN2 = Split((QWEN2,), nfc=True)
_DEEPSEEK3 = Split((r"\p{N}{1,3}", _CJK_KANA, _DEEPSEEK3_WORDS))
_STARCODER = Split((r"\p{N}", GPT2))  # Digits(individual_digits) then GPT-2's split
_BLOOM = Split((_NOT_SENTENCE_END,))
_GLM4 = Split((LLAMA3,), ignore_merges=True)
_O200K = Split((O200K,))
_NEWLINES = Split(("[^\n]+|[\n]+",), alphabet="escaped")
_BAILING = Split(
    (r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",)
)

_GPT2_NAMES = """gpt-2 mpt olmo jais trillion granite-docling phi-2 jina-es jina-de gigachat jina-v2-es
    jina-v2-de a.x-4.0 mellum modern-bert exaone4 jina-v1-en jina-v2-code roberta-bpe""".split()

SPLITS: dict[str, Split] = {
    # llama.cpp's DEFAULT: no family's folder writes it; its own four regexes
    "default": Split((r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    # Llama 3's split, a word in the vocabulary kept whole
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        _LLAMA3,
    ),
    "smaug-bpe": Split((LLAMA3,)),
    "dbrx": Split((LLAMA3,)),
    "jais-2": Split(
        (
            _CONTRACTIONS
            + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
            + "".join(rf"|\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
            + r"|\s{1,2}(?!\S)|\s{1}",
        )
    ),  # fmt: skip
    "deepseek-llm": Split(
        ("[\r\n]", _DEEPSEEK_LETTERS, "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$", _DEEPSEEK_CJK, r"\p{N}+")
    ),
    "deepseek-coder": Split(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _DEEPSEEK_CJK, r"\p{N}")),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense", "joyai-llm", "hy_v4"), _DEEPSEEK3),
    "spark2_5": Split(
        (
            r"\p{N}{1,3}",
            _CJK_KANA,
            r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+"
            r"|[\r\n]|\s+(?!\S)|\s+",
            r"\p{N}",
        )
    ),
    "youtu": Split(
        (
            "[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|" + _CJK_KANA,
            _cased(_CONTRACTIONS + "?") + r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        ),
        ignore_merges=True,
    ),
    "falcon": Split((_PUNCT_RUN, GPT2, "[0-9][0-9][0-9]")),
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"), _STARCODER
    ),
    # GPT-2's split
    **dict.fromkeys(_GPT2_NAMES, _GPT2),
    # Qwen's split (one digit at a time), NFC
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "f2llmv2"), _QWEN2),  # Qwen's own tokenizers (and NFC)
    **dict.fromkeys(("kormo", "megrez", "stablelm2", "hunyuan", "solar-open"), Split((QWEN2,))),
    "qwen35": Split((QWEN35,), nfc=True),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), _BLOOM),
    "chatglm-bpe": Split((LLAMA3,)),
    **dict.fromkeys(("glm4", "glm5"), _GLM4),
    "viking": Split((_NOT_SENTENCE_END, r"\p{N}")),
    "tekken": Split((TEKKEN,), ignore_merges=True),
    "chameleon": Split(
        (
            "<sentinel:[0-9]+>",
            "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z",
            "([\\t\\n]|    |  )",
            r"\p{N}",
            r"[\p{P}!-/:-@\[-`{-~]",
            GPT2,
        )
    ),  # fmt: skip
    # o200k (gpt-oss, Llama 4)
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _O200K),
    "granite-embed-multi-97m": Split((O200K,), ignore_merges=True),
    **dict.fromkeys(("tiny_aya", "cohere2moe"), Split((r"\d{1,3}(?=(?:\d{3})*\b)", O200K))),
    "kimi-k2": Split((KIMI_K2,)),
    "superbpe": Split((r"\p{N}+", r"(?=(\d{3})+(?!\d))")),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _BAILING),
    "seed-coder": Split(
        (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+",)
    ),
    "ufakzeka": Split((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}" + _TAIL,)),
    "grok-2": Split((QWEN2,)),
    "afmoe": Split((_DIGITS_BY_THREE, _AFMOE_CJK, _DEEPSEEK3_WORDS)),
    "laguna": Split(("[^\n]+|[\n]+", QWEN2)),
    "exaone-moe": Split(
        (
            _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?"
            r"|\s*[\r\n]|\s+(?!\S)|\s+",
        )
    ),
    **dict.fromkeys(("gemma4", "granite-embed-multi-311m", "sarvam-moe"), _NEWLINES),
    "minicpm5": Split((r"\p{N}{1,3}", _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+" + _TAIL), ignore_merges=True),
    "whitespace": Split((r"\S+",), alphabet="raw"),
}


def split_of(name: str | None) -> Split | None:
    """The split a GGUF file's ``tokenizer.ggml.pre`` names (a missing name is llama.cpp's
    ``default``), or None for a name the pinned llama.cpp does not know."""
    return SPLITS.get(name or "default")
