"""Every encoder slotserve serves, one record each: the architecture config.json names,
the ``model_type`` that names it where ``architectures`` is absent, its
``*ForSequenceClassification`` (a cross-encoder: the same body with a head), and the
class that builds it. engine/core/encoder.py finds a folder's record here
(``find``); GGUF encoder files name their architecture in the config they make
(engine/loading/gguf/encoder_file.py)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.models.bert import BertEncoder
from engine.models.embedding_gemma import EmbeddingGemmaEncoder
from engine.models.embedding_gemma2 import EmbeddingGemma2Encoder
from engine.models.encoder_base import EncoderModel
from engine.models.modernbert import ModernBertEncoder
from engine.models.nomic_bert import NomicBertEncoder


@dataclass(frozen=True)
class Encoder:
    architecture: str  # config.json's architectures[0]
    kind: str  # what the class builds (BERT's and RoBERTa's differ in positions)
    model: type[EncoderModel]
    model_type: str | None = None  # config.json's model_type naming it when there is no architectures
    classifier: str | None = None  # its cross-encoder's architecture

    def build(self, raw: dict, head: tuple[int, bool] | None) -> EncoderModel:
        """The model (on the current device; ``head``: a classifier's (labels, dense))."""
        return self.model(raw, self.kind, head)


ENCODERS: tuple[Encoder, ...] = (
    Encoder("BertModel", "bert", BertEncoder, "bert", "BertForSequenceClassification"),
    Encoder("XLMRobertaModel", "roberta", BertEncoder, "xlm-roberta", "XLMRobertaForSequenceClassification"),
    Encoder("RobertaModel", "roberta", BertEncoder, "roberta", "RobertaForSequenceClassification"),
    Encoder("NomicBertModel", "nomic", NomicBertEncoder, "nomic_bert"),
    Encoder("ModernBertModel", "modernbert", ModernBertEncoder, "modernbert", "ModernBertForSequenceClassification"),
    Encoder("Gemma3TextModel", "embedding-gemma", EmbeddingGemmaEncoder),  # with use_bidirectional_attention
    Encoder("EmbeddingGemma2Model", "embedding-gemma2", EmbeddingGemma2Encoder, "embedding_gemma2"),
    Encoder("EmbeddingGemma2TextModel", "embedding-gemma2", EmbeddingGemma2Encoder, "embedding_gemma2_text"),
)
SERVED = [name for e in ENCODERS for name in (e.architecture, e.classifier) if name]


def find(raw: dict) -> tuple[Encoder, bool] | None:
    """(record, whether it is the cross-encoder) for a config.json, or None when it names
    no encoder served here (Gemma 3's bare model without bidirectional attention is a
    decoder's: last-token pooling)."""
    arch = (raw.get("architectures") or [None])[0]
    if arch == "Gemma3TextModel" and not raw.get("use_bidirectional_attention"):
        return None
    for enc in ENCODERS:
        if arch is not None and arch in (enc.architecture, enc.classifier):
            return enc, arch == enc.classifier
        if arch is None and enc.model_type is not None and raw.get("model_type") == enc.model_type:
            return enc, False
    return None
