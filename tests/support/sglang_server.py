"""A loopback SGLang LLM server whose generation is OUR JAX sampler: token-in/token-out for real.

    with SGLangSamplerServer(checkpoint_dir, min_pixels=1024, max_pixels=16384) as server:
        client = SGLangClient(server.url)
        result = client.generate(input_ids, image_data=[...], sampling_params={...})

Routes (as in sglang 0.5.23): `POST /generate`, `GET /health`, `GET /model_info` (and its deprecated alias
`/get_model_info`), `GET /server_info` (alias `/get_server_info`: the launch arguments, among them
`enable_deterministic_inference`), `POST|GET /flush_cache`, `POST /update_weights_from_disk` (loads a checkpoint
directory with `qwen3_vl.load` and swaps the weights in).

`/generate` with `input_ids` and `image_data` follows upstream's multimodal processor: images are decoded and
preprocessed with our processor at the server's pixel bounds; a prompt holding exactly ONE `<|image_pad|>` per image
keeps its ids verbatim and each placeholder is expanded to its image's token count (upstream `_expand_input_ids`);
a prompt with any other placeholder count (e.g. runs already expanded) is decoded to text, each
`<|vision_start|><|image_pad|>…<|vision_end|>` span is collapsed to one placeholder (upstream's Qwen-VL image token
pattern), the text is re-tokenised and then expanded — the token drift upstream warns about
(`retokenized` counts these requests, `last_prompt` holds the ids the last request actually ran). `prompt_tokens`
counts the expanded prompt. `sampling_seed` is honoured only when the server runs with
`deterministic_inference=True` (upstream `--enable-deterministic-inference`); otherwise each request samples with a
fresh seed of its own. Errors use SGLang's bodies: contract violations (unknown sampling param, wrong JSON type) 400
`{"error": "<text>"}`; bad input (placeholders that cannot match the images, `text` prompts, which this server does
not tokenize) 400 `{"error": {"message"}}`; an unparsable body 400 `{"object": "error", …}`.

Like SGLang's radix cache, the server keeps each conversation's KV cache in a session row and reuses the longest
cached prefix of a request (same expanded tokens, same images): a multi-turn episode only appends its new tokens,
exactly as the in-process sampler policy does, so the two produce the same tokens for the same seeds. Requests run
one at a time.
"""

from __future__ import annotations

import base64
import hashlib
import io
import itertools
import re
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from ranger_jax import sampling
from ranger_jax.clients import sglang_protocol
from ranger_jax.models import qwen3_vl
from ranger_jax.processing import image as image_lib
from ranger_jax.processing import tokenizer as tokenizer_lib
from support.loopback import LoopbackServer, Reply

FLUSH_OK = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting "
            "requests, the operation will not be performed.)\n")
DEFAULT_MAX_NEW_TOKENS = 128
# upstream's Qwen-VL image token pattern: a whole placeholder span, however many pads it holds, is one image
VISION_SPAN = re.compile(r"<\|vision_start\|>(?:<\|image_pad\|>)+<\|vision_end\|>")
ONE_IMAGE = "<|vision_start|><|image_pad|><|vision_end|>"


def expand_placeholders(ids: list[int], pad_id: int, counts: list[int]) -> list[int]:
    """Upstream's `_expand_input_ids`: the caller's ids verbatim, the i-th placeholder repeated `counts[i]` times."""
    out, images = [], iter(counts)
    for token in ids:
        out.extend([token] * next(images) if token == pad_id else [token])
    return out


class BadRequest(Exception):
    """Maps to an SGLang error body: `kind` "contract" ({"error": str}) or "input" ({"error": {"message"}})."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind, self.message = kind, message

    def reply(self) -> Reply:
        body = {"error": self.message} if self.kind == "contract" else {"error": {"message": self.message}}
        return Reply.json(body, status=400)


def _type_name(value: Any) -> str:
    if isinstance(value, bool):
        return f"boolean `{str(value).lower()}`"
    if isinstance(value, int):
        return f"integer `{value}`"
    if isinstance(value, float):
        return f"floating point `{value}`"
    if isinstance(value, str):
        return f'string "{value}"'
    return type(value).__name__


def check_sampling_params(params: Any) -> dict[str, Any]:
    """SGLang's JSON contract on `sampling_params` (unknown keys and wrong types are refused)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise BadRequest("contract", f"invalid type: {_type_name(params)}, expected struct SamplingParams")
    known = sglang_protocol.SAMPLING_PARAM_TYPES
    for key, value in params.items():
        if key not in known:
            raise BadRequest("contract", f"unknown field `{key}`, expected one of {', '.join(f'`{k}`' for k in known)}")
        types = known[key]
        if value is not None and ((isinstance(value, bool) and bool not in types) or not isinstance(value, types)):
            raise BadRequest("contract", f"invalid type: {_type_name(value)}, expected {types[0].__name__} "
                                         f"for `{key}`")
    return params


def decode_image(item: Any, index: int) -> tuple[str, Image.Image]:
    """(sha256 of the bytes, RGB image) of one `image_data` item: a data URL, base64, or `{"url": …}`."""
    if isinstance(item, dict):
        item = item.get("url")
    if not isinstance(item, str):
        raise BadRequest("input", f"image_data[{index}] must be a string or {{'url': …}}")
    payload = item.split(",", 1)[1] if item.startswith("data:") else item
    try:
        data = base64.b64decode(payload, validate=True)
        with Image.open(io.BytesIO(data)) as opened:
            image = opened.convert("RGB")
    except (ValueError, OSError) as err:
        raise BadRequest("input", f"image_data[{index}] is not a decodable image ({err}); this loopback server "
                                  "takes data URLs or base64") from err
    return hashlib.sha256(data).hexdigest(), image


class SGLangSamplerServer:
    """The server (see the module docstring). Use as a context manager.

    Args:
        checkpoint: HF checkpoint directory (model, and `tokenizer.json` for `text` in responses).
        sampler: reuse this sampler (and its compiled functions) instead of loading `checkpoint`'s weights.
        num_rows: cached conversations (session rows); the least recently used row is reused.
        capacity: initial cache slots per row.
        min_pixels / max_pixels: the server's image processor bounds.
        weight_version: initial `weight_version`.
        deterministic_inference: honour `sampling_seed` (upstream `--enable-deterministic-inference`).
    """

    def __init__(self, checkpoint: str | Path, *, sampler: sampling.Sampler | None = None, num_rows: int = 4,
                 capacity: int | None = None, min_pixels: int = 4096, max_pixels: int = 160_000,
                 weight_version: str = "default", deterministic_inference: bool = False):
        self.model_path = str(checkpoint)
        self.tokenizer = tokenizer_lib.load_tokenizer(checkpoint)
        if sampler is None:
            sampler = sampling.Sampler(qwen3_vl.load(checkpoint), suppress_token_ids=sorted(self.tokenizer.vision_ids))
        self.sampler = sampler
        self.session = sampler.new_session(num_rows, capacity=capacity)
        self.min_pixels, self.max_pixels = min_pixels, max_pixels
        self.weight_version = weight_version
        self._row_images: list[list[str]] = [[] for _ in range(num_rows)]  # image hashes each row consumed
        self._row_used = [0.0] * num_rows
        self._lock = threading.Lock()
        self.num_generate = 0
        self.deterministic_inference = deterministic_inference
        self.retokenized = 0
        self.last_prompt: list[int] = []
        self._fresh_seeds = itertools.count(1)
        self.http = LoopbackServer()
        self.http.route("POST", "/generate", self._generate)
        self.http.route("PUT", "/generate", self._generate)
        self.http.route("GET", "/health", lambda req: Reply())
        for path in ("/model_info", "/get_model_info"):
            self.http.route("GET", path, self._model_info)
        for path in ("/server_info", "/get_server_info"):
            self.http.route("GET", path, self._server_info)
        self.http.route("POST", "/flush_cache", self._flush)
        self.http.route("GET", "/flush_cache", self._flush)
        self.http.route("POST", "/update_weights_from_disk", self._update_weights)

    @property
    def url(self) -> str:
        return self.http.url

    def __enter__(self) -> "SGLangSamplerServer":
        self.http.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.http.__exit__(*exc)

    # ----- /generate ----------------------------------------------------------------------------------------------

    def _parse(self, req) -> dict[str, Any]:
        try:
            body = req.json()
        except (ValueError, UnicodeDecodeError) as err:
            raise BadRequest("parse", f"failed to parse the request body: {err}") from err
        if not isinstance(body, dict):
            raise BadRequest("parse", "the request body must be a JSON object")
        if body.get("text") is not None or body.get("input_embeds") is not None:
            raise BadRequest("input", "this loopback server takes input_ids only (it does not tokenize text)")
        ids = body.get("input_ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise BadRequest("input", "input_ids must be a non-empty list of ints (one prompt per request here)")
        vocab = self.sampler.config.text_config.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise BadRequest("input", f"input_ids hold an id outside the vocabulary [0, {vocab})")
        if body.get("logprob_start_len", -1) not in (-1, None):
            raise BadRequest("input", "this loopback server returns output log-probs only (logprob_start_len -1)")
        return body

    def _images(self, body: dict[str, Any]) -> list[tuple[str, np.ndarray, np.ndarray]]:
        items = body.get("image_data") or []
        items = items if isinstance(items, list) else [items]
        vision = self.sampler.config.vision_config
        out = []
        for index, item in enumerate(items):
            digest, image = decode_image(item, index)
            pixel_values, grid = image_lib.preprocess_image(
                image, min_pixels=self.min_pixels, max_pixels=self.max_pixels, patch_size=vision.patch_size,
                merge_size=vision.spatial_merge_size, temporal_patch_size=vision.temporal_patch_size)
            out.append((digest, pixel_values, grid))
        return out

    def _pick_row(self, ids: list[int], digests: list[str]) -> tuple[int, int, int]:
        """(row, cached tokens, cached images): the longest row prefix of the request, else the LRU row emptied."""
        best = None
        for row in range(self.session.num_rows):
            held, images = self.session.token_ids[row], self._row_images[row]
            if held and len(held) <= len(ids) and ids[:len(held)] == held and digests[:len(images)] == images:
                if best is None or len(held) > best[1]:
                    best = (row, len(held), len(images))
        if best is not None:
            return best
        row = min(range(self.session.num_rows), key=lambda r: self._row_used[r])
        self.session.reset_rows(row)
        self._row_images[row] = []
        return row, 0, 0

    def _expanded_prompt(self, ids: list[int], images: list[tuple[str, np.ndarray, np.ndarray]]) -> list[int]:
        """The ids the model runs: one placeholder per image expanded, anything else re-tokenised first."""
        pad_id = self.sampler.config.image_token_id
        merge = self.sampler.config.vision_config.spatial_merge_size
        counts = [image_lib.image_token_count(g, merge_size=merge) for _, _, g in images]
        if ids.count(pad_id) != len(images) and images:  # upstream falls back to decode + re-tokenise
            self.retokenized += 1
            ids = self.tokenizer.encode(VISION_SPAN.sub(ONE_IMAGE, self.tokenizer.decode(ids)))
        if ids.count(pad_id) != len(images):
            raise BadRequest("input", f"prompt has {ids.count(pad_id)} image placeholder token(s) but "
                                      f"{len(images)} image(s) were provided")
        expanded = expand_placeholders(ids, pad_id, counts)
        self.last_prompt = expanded
        return expanded

    def _seed(self, params: dict[str, Any]) -> int:
        """The request's seed when the server is deterministic, else a fresh one (upstream ignores the seed)."""
        if self.deterministic_inference and params.get("sampling_seed") is not None:
            return int(params["sampling_seed"]) & 0xFFFFFFFF
        return (next(self._fresh_seeds) * 2654435761) & 0xFFFFFFFF

    def _generate(self, req) -> Reply:
        started = time.monotonic()
        try:
            body = self._parse(req)
            params = check_sampling_params(body.get("sampling_params"))
            images = self._images(body)
        except BadRequest as err:
            if err.kind == "parse":
                return Reply.json({"object": "error", "message": err.message, "type": "Bad Request", "param": None,
                                   "code": 400}, status=400)
            return err.reply()
        try:
            ids = self._expanded_prompt(body["input_ids"], images)
        except BadRequest as err:
            return err.reply()
        if params.get("n") not in (None, 1):
            return BadRequest("input", "this loopback server generates one sample per request (n = 1)").reply()
        max_new = params.get("max_new_tokens")
        max_new = DEFAULT_MAX_NEW_TOKENS if max_new is None else max_new
        stop_ids = tuple(params.get("stop_token_ids") or ())
        if not params.get("ignore_eos"):
            stop_ids = tuple(dict.fromkeys((*stop_ids, self.tokenizer.eos_id)))
        top_k = params.get("top_k")
        try:
            sampling_params = sampling.SamplingParams(
                temperature=float(1.0 if params.get("temperature") is None else params["temperature"]),
                top_p=float(params.get("top_p") or 1.0), top_k=0 if top_k in (None, -1) or top_k >= 2**30 else top_k,
                max_new_tokens=max(1, max_new), stop_token_ids=stop_ids, seed=self._seed(params))
        except ValueError as err:
            return BadRequest("input", str(err)).reply()
        rid = str(body.get("rid") or uuid.uuid4().hex)
        with self._lock:
            digests = [d for d, _, _ in images]
            row, cached, cached_images = self._pick_row(ids, digests)
            delta, new_images = ids[cached:], images[cached_images:]
            segment = None
            if delta:
                segment = sampling.Segment(delta)
                if new_images:
                    segment = sampling.Segment(delta, np.concatenate([p for _, p, _ in new_images]),
                                               np.stack([g for _, _, g in new_images]))
            segments = [None] * self.session.num_rows
            segments[row] = segment
            try:
                self.sampler.append(self.session, segments)
            except ValueError as err:
                self.session.reset_rows(row)
                self._row_images[row] = []
                return BadRequest("input", str(err)).reply()
            self._row_images[row] = digests
            self._row_used[row] = time.monotonic()
            if max_new == 0:
                completion = sampling.Completion(np.zeros(0, np.int32), np.zeros(0, np.float32), "length")
            else:
                params_per_row: list[sampling.SamplingParams | None] = [None] * self.session.num_rows
                params_per_row[row] = sampling_params
                completion = self.sampler.generate(self.session, params_per_row)[row]
            self.num_generate += 1
        return Reply.json(self._response(body, rid, ids, images, cached, completion, max_new, started))

    def _response(self, body, rid, ids, images, cached, completion, max_new, started) -> dict[str, Any]:
        out = [int(i) for i in completion.token_ids]
        stopped = completion.finish_reason == sampling.FINISH_STOP
        finish = {"type": "stop", "matched": out[-1]} if stopped else {"type": "length", "length": max_new}
        params = body.get("sampling_params") or {}
        text_ids = out[:-1] if stopped and not params.get("no_stop_trim") else out
        skip = params.get("skip_special_tokens", True) is not False
        meta: dict[str, Any] = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids),
                                "weight_version": self.weight_version, "num_retractions": 0}
        if body.get("return_logprob"):
            with_text = bool(body.get("return_text_in_logprobs"))
            meta["input_token_logprobs"] = []
            meta["output_token_logprobs"] = [
                [float(lp), tok, self.tokenizer.decode([tok]) if with_text else None]
                for lp, tok in zip(completion.logprobs.tolist(), out)]
            meta["output_token_logprobs_length"] = len(out)
        meta.update({"reasoning_tokens": 0, "completion_tokens": len(out), "cached_tokens": cached,
                     "weight_versions": [{"version": self.weight_version, "start": 0, "end": len(out)}],
                     "dp_rank": 0, "e2e_latency": time.monotonic() - started,
                     "response_sent_to_client_ts": time.time()})
        if images:
            meta["image_tokens"] = ids.count(self.sampler.config.image_token_id)
        return {"text": self.tokenizer.decode(text_ids, skip_special_tokens=skip), "output_ids": out, "meta_info": meta}

    # ----- control endpoints --------------------------------------------------------------------------------------

    def _model_info(self, req) -> Reply:
        return Reply.json({"model_path": self.model_path, "served_model_name": self.model_path,
                           "tokenizer_path": self.model_path, "is_generation": True,
                           "preferred_sampling_params": None, "weight_version": self.weight_version,
                           "load_format": "auto", "reasoning_parser": None, "tool_call_parser": None,
                           "disaggregation_mode": "null", "has_image_understanding": True,
                           "has_audio_understanding": False, "model_type": "qwen3_vl",
                           "architectures": ["Qwen3VLForConditionalGeneration"]})

    def _server_info(self, req) -> Reply:
        return Reply.json({"model_path": self.model_path, "tokenizer_path": self.model_path,
                           "enable_deterministic_inference": self.deterministic_inference,
                           "mm_attention_backend": None, "max_running_requests": 1, "internal_states": [{}],
                           "version": "0.5.23"})

    def flush(self) -> None:
        """Empties every cached row."""
        with self._lock:
            self.session.reset_rows(list(range(self.session.num_rows)))
            self._row_images = [[] for _ in range(self.session.num_rows)]

    def _flush(self, req) -> Reply:
        self.flush()
        return Reply.text(FLUSH_OK)

    def _update_weights(self, req) -> Reply:
        try:
            body = req.json()
        except (ValueError, UnicodeDecodeError) as err:
            return Reply.json({"success": False, "message": f"failed to parse the request body: {err}",
                               "num_paused_requests": 0}, status=400)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not path:
            return Reply.json({"success": False, "message": "model_path is required", "num_paused_requests": 0},
                              status=400)
        try:
            model = qwen3_vl.load(path)
        except (OSError, ValueError) as err:
            return Reply.json({"success": False, "message": f"Failed to get weights iterator: {err}",
                               "num_paused_requests": 0}, status=400)
        with self._lock:
            try:
                self.sampler.update_weights(model)
            except ValueError as err:
                return Reply.json({"success": False, "message": f"Failed to update weights: {err}.\nRolling back to "
                                                                "original weights.", "num_paused_requests": 0},
                                  status=400)
            self.model_path = str(path)
            message = "Succeeded to update model weights."
            if body.get("weight_version") is not None:
                self.weight_version = str(body["weight_version"])
                message += f" Weight version updated to {self.weight_version}."
        if body.get("flush_cache", True):
            self.flush()
        return Reply.json({"success": True, "message": message, "num_paused_requests": 0})
