"""The ``slotserve`` console script."""

from __future__ import annotations

import argparse
import sys


def _generate(args: argparse.Namespace) -> int:
    from engine import DEMO_MODEL, Engine, EngineError, SamplingParams

    try:
        engine = Engine.from_pretrained(
            args.model or str(DEMO_MODEL), dtype=args.dtype, n_threads=args.threads, n_seq_max=max(1, len(args.prompt))
        )
    except (EngineError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    params = SamplingParams(
        max_tokens=args.n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p, seed=args.seed
    )
    for prompt, gen in zip(args.prompt, engine.generate(args.prompt, params)):
        print(prompt + gen.text)
        print(f"--- {len(gen.token_ids)} tokens, finish_reason={gen.finish_reason}", file=sys.stderr)
    return 0


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from server.config.flags import settings_from_args

    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            print(f"error: {where}: {err['msg']}", file=sys.stderr)
        return 2
    routes = settings.models_dir is not None or settings.models_preset is not None
    if routes and "model" not in settings.model_fields_set:
        # router mode: only without a model (-m, SLOTSERVE_MODEL), as llama-server; a child, given -m, never routes
        from server.router.serve import serve_router

        return serve_router(settings, getattr(args, "argv", sys.argv[2:]))
    from server.serve import serve  # the model server: torch and the engine

    return serve(settings)


def build_parser() -> argparse.ArgumentParser:
    from server.config.flags import add_flags

    # no abbreviations: "--hos" is not "--host" (the router passes flags it does not know to
    # its children, whose parser would have expanded them past its filter)
    ap = argparse.ArgumentParser(
        prog="slotserve", description="OpenAI-compatible LLM server built around slots", allow_abbrev=False
    )
    sub = ap.add_subparsers(dest="command", required=True)
    srv = sub.add_parser(
        "serve",
        allow_abbrev=False,
        help="serve the OpenAI and llama-server APIs",
        description="Serve a model over HTTP. Every flag also reads SLOTSERVE_<NAME> (flag wins over env).",
    )
    add_flags(srv)
    srv.set_defaults(func=_serve)
    gen = sub.add_parser(
        "generate", help="generate offline for one or more prompts (all batched together)", allow_abbrev=False
    )
    gen.add_argument("prompt", nargs="+")
    gen.add_argument("-m", "--model", default=None, help="Hugging Face checkpoint folder (default: the demo model)")
    gen.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    gen.add_argument("-n", "--n-predict", type=int, default=128)
    gen.add_argument("--temp", type=float, default=0.7)
    gen.add_argument("--top-k", type=int, default=40)
    gen.add_argument("--top-p", type=float, default=0.95)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("-t", "--threads", type=int, default=None)
    gen.set_defaults(func=_generate)
    return ap


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    args.argv = argv[1:]  # the subcommand's own flags (router mode passes most to its children)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
