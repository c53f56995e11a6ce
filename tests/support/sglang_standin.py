"""A stand-in for the `sglang` executable (and for `python -m sglang_router.launch_router`), so the serving helpers'
real process management runs in tests: it parses the same command line and serves the same endpoints on loopback.

    sglang serve --model-type llm|diffusion --model-path P --host H --port N [other flags recorded]
    router --host H --port N --worker-urls U1 U2 ... [--policy P]

`install(bin_dir)` writes an executable `bin_dir/sglang` running this file, and `install_router(dir)` a package
`dir/sglang_router` whose `launch_router` runs it in router mode (put `dir` on PYTHONPATH).

- llm: `/health`; `/generate` takes `input_ids` with ONE placeholder per image (as SGLang) and counts each PNG
  image's tokens as (H/32)·(W/32) (patch 16, merge 2, images already at grid size), returns three output ids with
  log-probs and `meta_info.weight_version`; `/model_info`, `/server_info` (the flags it was started with);
  `/update_weights_from_disk` loads a folder that must hold `config.json` and takes its `weight_version`.
- diffusion: `/health` (`{"status": "ok"}`), `/v1/images/generations` (a solid PNG of the asked size, b64_json).
- router: `/health`, and `/generate` forwarded to the workers in turn.

Faults by environment variable: STANDIN_EXIT=<code> exits at once (after a line on stderr), STANDIN_NEVER_HEALTHY=1
answers 503 forever, STANDIN_WARMUP_S=<s> answers 503 for that long, STANDIN_IGNORE_VERSION=1 keeps the old weight
version after an update.
"""

from __future__ import annotations

import argparse
import base64
import io
import itertools
import json
import os
import stat
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

IMAGE_PAD = int(os.environ.get("STANDIN_IMAGE_PAD", "5"))  # default: the tiny tokenizer's <|image_pad|>


def install(bin_dir: Path) -> Path:
    """Writes the executable `bin_dir/sglang` that runs this stand-in with the test interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "sglang"
    path.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[0] = 'sglang'\n"
                    f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def install_router(package_root: Path) -> Path:
    """Writes a package `package_root/sglang_router` whose `launch_router` module runs this stand-in as a router."""
    package = package_root / "sglang_router"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "launch_router.py").write_text(
        f"import runpy, sys\nsys.argv = ['sglang', 'router', *sys.argv[1:]]\n"
        f"runpy.run_path({str(Path(__file__).resolve())!r}, run_name='__main__')\n")
    return package_root


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (40, 120, 200)).save(buffer, "PNG")
    return buffer.getvalue()


def _image_tokens(item: str) -> int:
    from PIL import Image

    data = base64.b64decode(item.split(",", 1)[1] if item.startswith("data:") else item)
    width, height = Image.open(io.BytesIO(data)).size
    return (height // 32) * (width // 32)


class State:
    def __init__(self, args: argparse.Namespace, flags: list[str]):
        self.args, self.flags = args, flags
        self.started = time.monotonic()
        self.weight_version, self.model_path = "default", args.model_path
        self.worker_turn = itertools.count()

    def health_status(self) -> int:
        if os.environ.get("STANDIN_NEVER_HEALTHY"):
            return 503
        return 503 if time.monotonic() - self.started < float(os.environ.get("STANDIN_WARMUP_S", "0")) else 200


def make_handler(state: State):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):
            print(f"{self.command} {self.path} -> {args[1] if len(args) > 1 else ''}", flush=True)

        def reply(self, status: int, body=None):
            data = b"" if body is None else json.dumps(body).encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def body(self):
            length = int(self.headers.get("Content-Length", "0"))
            return json.loads(self.rfile.read(length) or b"{}")

        def do_GET(self):
            path = self.path.split("?")[0]
            if path in ("/health", "/health_generate"):
                status = state.health_status()
                ok = {"status": "ok"} if state.args.model_type == "diffusion" else None
                return self.reply(status, ok if status == 200 else None)
            if path in ("/model_info", "/get_model_info"):
                return self.reply(200, {"model_path": state.model_path, "weight_version": state.weight_version,
                                        "is_generation": True, "has_image_understanding": True})
            if path in ("/server_info", "/get_server_info"):
                return self.reply(200, {"model_path": state.model_path, "version": "0.5.23", "flags": state.flags,
                                        "enable_deterministic_inference":
                                            "--enable-deterministic-inference" in state.flags})
            return self.reply(404, {"detail": "Not Found"})

        def do_POST(self):
            path = self.path.split("?")[0]
            if state.args.mode == "router" and path == "/generate":
                return self.forward()
            if path == "/generate":
                return self.generate(self.body())
            if path == "/update_weights_from_disk":
                return self.update(self.body())
            if path == "/v1/images/generations":
                body = self.body()
                width, height = (int(x) for x in body.get("size", "64x64").split("x"))
                return self.reply(200, {"id": "standin", "created": int(time.time()), "data": [
                    {"b64_json": base64.b64encode(_png(width, height)).decode("ascii"), "url": None,
                     "revised_prompt": body.get("prompt"), "file_path": None, "resize": None}],
                    "peak_memory_mb": None, "inference_time_s": 0.0, "usage": None})
            return self.reply(404, {"detail": "Not Found"})

        def generate(self, body):
            ids = body.get("input_ids") or []
            images = body.get("image_data") or []
            if ids.count(IMAGE_PAD) != len(images):
                return self.reply(400, {"error": {"message": f"{ids.count(IMAGE_PAD)} placeholders for "
                                                             f"{len(images)} images"}})
            prompt_tokens = len(ids) - len(images) + sum(_image_tokens(i) for i in images)
            limit = (body.get("sampling_params") or {}).get("max_new_tokens", 128)
            out = [(ids[-1] + 1 + i) % 500 for i in range(min(3, limit))]
            meta = {"id": body.get("rid", "r"), "finish_reason": {"type": "length", "length": limit},
                    "prompt_tokens": prompt_tokens, "weight_version": state.weight_version, "completion_tokens":
                    len(out), "cached_tokens": 0, "served_by": state.args.port}
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [[-0.5, t, None] for t in out]
            return self.reply(200, {"text": "abc", "output_ids": out, "meta_info": meta})

        def update(self, body):
            path = Path(body.get("model_path") or "")
            if not (path / "config.json").is_file():
                return self.reply(400, {"success": False, "num_paused_requests": 0,
                                        "message": f"Failed to get weights iterator: no config.json in {path}"})
            state.model_path = str(path)
            message = "Succeeded to update model weights."
            if body.get("weight_version") is not None and not os.environ.get("STANDIN_IGNORE_VERSION"):
                state.weight_version = str(body["weight_version"])
                message += f" Weight version updated to {state.weight_version}."
            return self.reply(200, {"success": True, "message": message, "num_paused_requests": 0})

        def forward(self):
            workers = state.args.worker_urls
            url = workers[next(state.worker_turn) % len(workers)] + "/generate"
            data = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 — loopback workers
                return self.reply(response.status, json.loads(response.read()))

    return Handler


def main() -> None:
    if os.environ.get("STANDIN_EXIT"):
        print("stand-in sglang: failing at start-up as asked (CUDA out of memory)", file=sys.stderr, flush=True)
        sys.exit(int(os.environ["STANDIN_EXIT"]))
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["serve", "router"])
    parser.add_argument("--model-type", default="llm")
    parser.add_argument("--model-path")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker-urls", nargs="*", default=[])
    args, _ = parser.parse_known_args()
    state = State(args, sys.argv[1:])
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    print(f"stand-in sglang {args.mode} ({args.model_type}) on {args.host}:{args.port}, CUDA_VISIBLE_DEVICES="
          f"{os.environ.get('CUDA_VISIBLE_DEVICES', '')}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
