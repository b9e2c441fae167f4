"""Builds the shared tokenizer and the tiny policy and GenRM models into the cache.

    python launchers/build_models.py [--out CACHE_DIR] [--force] [--threads N]

Writes ``CACHE_DIR/models/{tokenizer,policy,genrm}`` and ``manifest.json`` (default cache:
``$PIVOT_CACHE`` or ``<repo>/cache``); does nothing when a build of the same configuration
is already there. Prints the manifest's measured results.
"""

from __future__ import annotations

import argparse
import json
import logging

from pivot.models import BuildConfig, build_models, default_cache_dir, is_built, read_manifest


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="cache dir (default: $PIVOT_CACHE or ./cache)")
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out = args.out if args.out is not None else default_cache_dir()
    cfg = BuildConfig()
    if is_built(out, cfg) and not args.force:
        logging.info("up to date (%s): %s", cfg.digest(), out)
        manifest = read_manifest(out)
    else:
        manifest = build_models(out, cfg, args.threads)
    print(json.dumps({"build_seconds": manifest["build_seconds"], **manifest["results"]},
                     indent=2))


if __name__ == "__main__":
    main()
