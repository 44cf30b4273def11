"""Numbers in: a deployment's acceptance figures, read from what vLLM, SGLang or llama.cpp report (the formats:
``engine.product.io.production``).

    python -m cli.production FILE [--json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from engine.product.io.production import ProductionError, read_production


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cli.production", description=__doc__.splitlines()[0])
    ap.add_argument("file", type=Path, help="vLLM /metrics text, SGLang /generate JSON or llama.cpp /completion JSON")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    try:
        found = read_production(args.file.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError, ProductionError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(found.to_dict()))
        return 0
    rate = found.acceptance_rate
    tau = None if found.tau is None else f"{found.tau:.2f}" + (f", {found.tau_note}" if found.tau_note else "")
    facts = {"tau": tau,
             "acceptance rate": None if rate is None else f"{rate:.1%}", "steps": found.steps,
             "draft tokens": found.draft_tokens, "accepted": found.accepted,
             "by position": found.per_position and " ".join(f"{p:.1%}" for p in found.per_position)}
    print(found.source + "\n" + "\n".join(f"  {k}: {v}" for k, v in facts.items() if v is not None and v != ()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
