"""Which structured-output constraint a request asks for, whatever its spelling:
llama-server's ``grammar`` and ``json_schema``, OpenAI's ``response_format``, vLLM's
``structured_outputs`` and ``guided_*``. At most one may be given; an empty string
(``"grammar": ""``) means none, as in llama-server."""

from __future__ import annotations

from engine import ANY_JSON_OBJECT, Constraint, EngineService, RequestError
from server.schemas.requests import SamplingFields


def _requested(body: SamplingFields) -> list[tuple[str, str, object, bool]]:
    """(field, kind, source, strict) for each constraint the body names."""
    found = []
    if body.grammar:
        found.append(("grammar", "gbnf", body.grammar, False))
    if body.json_schema is not None:
        found.append(("json_schema", "json_schema", body.json_schema, False))
    fmt = body.response_format
    if fmt is not None and fmt.type == "json_object":
        found.append(("response_format", "json_schema", fmt.schema_ or ANY_JSON_OBJECT, False))
    if fmt is not None and fmt.type == "json_schema":
        spec = fmt.json_schema
        if spec is None or spec.schema_ is None:
            raise RequestError("response_format: type json_schema needs json_schema.schema")
        found.append(("response_format", "json_schema", spec.schema_, bool(spec.strict)))
    so = body.structured_outputs
    vllm = {
        "json_schema": so.json_ if so else None,
        "regex": so.regex if so else None,
        "choice": so.choice if so else None,
        "gbnf": so.grammar if so else None,
    }
    for kind, source in vllm.items():
        if source is not None and source != "":  # an empty text means none (llama-server)
            found.append(("structured_outputs", kind, source, False))
    guided = {"json_schema": body.guided_json, "regex": body.guided_regex, "choice": body.guided_choice}
    guided["gbnf"] = body.guided_grammar
    for kind, source in guided.items():
        if source is not None and source != "":  # an empty text means none (llama-server)
            found.append((f"guided_{'json' if kind == 'json_schema' else kind}", kind, source, False))
    return found


async def constraint_of(
    engine: EngineService, body: SamplingFields, forced: tuple[str, str] | None = None
) -> Constraint | None:
    """The body's constraint compiled, or None. Raises RequestError (a 400) when more
    than one is given or the one given does not compile. ``forced``: (kind, source)
    the route imposes (a required tool call), counted as one more."""
    found = _requested(body) + ([("tool_choice", *forced, False)] if forced else [])
    if len(found) > 1:
        names = ", ".join(sorted({f[0] for f in found}))
        raise RequestError(f"give one structured-output constraint, not several ({names})")
    if not found:
        return None
    _, kind, source, strict = found[0]
    return await engine.constraint(kind, source, strict)
