"""The OpenAPI document, made true for this server once the model is loaded.

FastAPI's generated document is post-processed: validation errors are 400 in the error
shape (not 422), limits that depend on the model or the settings are filled in where
the request schemas mark them (``x-limit``: a token id below the vocabulary size, a
slot index, the number of slots, the inputs one retrieval request may hold), and the
API-key schemes are declared when keys are configured (the probes, and /metrics when
public, need none).
"""

from __future__ import annotations

import copy

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_VALIDATION_SCHEMAS = ("HTTPValidationError", "ValidationError")


def int_range_pattern(hi: int) -> str:
    """A regex for the decimal integers 0..hi written without leading zeros."""
    digits = str(hi)
    alternatives = ["0"] if hi >= 0 else []
    for n in range(1, len(digits)):  # every shorter length: [1-9] then n-1 digits
        alternatives.append("[1-9]" + ("[0-9]" * (n - 1)))
    for i, d in enumerate(digits):  # same length as hi: equal up to i, smaller at i
        low = "1" if i == 0 else "0"
        if int(d) > int(low):
            top = int(d) - 1
            cls = low if top == int(low) else f"[{low}-{top}]"
            alternatives.append(digits[:i] + cls + "[0-9]" * (len(digits) - i - 1))
    if hi >= 1:
        alternatives.append(digits)
    return "^(" + "|".join(dict.fromkeys(alternatives)) + ")$"


def build_openapi(app: FastAPI, limits: dict[str, int], api_keys: bool, public: frozenset[str]) -> dict:
    """``limits``: vocab (token ids < vocab), n_slots, n_embd (the embedding size), n_lora
    (adapters loaded) and max_inputs (``--max-inputs``)."""
    spec = get_openapi(title=app.title, version=app.version, routes=app.routes)
    for path, ops in spec["paths"].items():
        for op in ops.values():
            op.get("responses", {}).pop("422", None)
            if api_keys and path in public:
                op["security"] = []
    schemas = spec.get("components", {}).get("schemas", {})
    for name in _VALIDATION_SCHEMAS:
        schemas.pop(name, None)
    _fill_limits(spec, limits)
    if api_keys:
        spec["components"]["securitySchemes"] = {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "X-Api-Key"},
        }
        spec["security"] = [{"bearer": []}, {"apiKey": []}]
    return spec


def _fill_limits(node, limits: dict[str, int]) -> None:
    if isinstance(node, list):
        for item in node:
            _fill_limits(item, limits)
        return
    if not isinstance(node, dict):
        return
    mark = node.get("x-limit")
    if mark == "token":
        node["maximum"] = limits["vocab"] - 1
    elif mark == "slot":
        node["maximum"] = limits["n_slots"] - 1
    elif mark == "n_slots":
        node["maximum"] = limits["n_slots"]
    elif mark == "lora":
        node["maximum"] = limits["n_lora"] - 1
    elif mark == "n_embd":
        node["minimum"] = node["maximum"] = limits["n_embd"]
    elif mark == "inputs":
        node["maxItems"] = limits["max_inputs"]
    elif mark == "inputs_or_ids":  # embeddings: ids (text pieces among them) are one input, else each is one
        _inputs_or_ids(node, limits["max_inputs"])
    elif mark == "token_keys":
        for option in node.get("anyOf", [node]):
            if option.get("type") == "object":
                ids = int_range_pattern(limits["vocab"] - 1)[1:-1]
                option["propertyNames"] = {"pattern": f"^(?:{ids}|.*[^0-9].*|)$"}  # a token id, or text
    for value in node.values():
        _fill_limits(value, limits)


def _inputs_or_ids(node: dict, most: int) -> None:
    """An embeddings list: token ids with text pieces among them (at least one id) are
    one input, bounded by the context, not by ``--max-inputs``; any other list is that
    many inputs, at most ``most``."""
    listed = {k: v for k, v in node.items() if k != "x-limit"}
    pieces = [o for o in listed["items"].get("anyOf", []) if o.get("type") in ("integer", "string")]
    ids = {"type": "array", "minItems": 1, "items": {"anyOf": copy.deepcopy(pieces)}, "contains": {"type": "integer"}}
    node.clear()
    node["anyOf"] = [ids, {**listed, "maxItems": most}]
