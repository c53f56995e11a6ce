"""HTTP clients: the shared retry loop and cache, OpenAI-compatible chat, the SGLang policy server, image generators.

Modules: `http` (retry loop, per-service `RetryPolicy`, error tree, `Session`), `cache` (on-disk JSON response
cache), `media` (images to PNG/JPEG bytes and data URLs), `chat` (`ChatClient`), `sglang` (`SGLangClient`) with its
wire contract in `sglang_protocol` and its image-placeholder convention in `sglang_mm`, `images`
(`SGLangImageGenerator`, `GenSearcherGenerator`) and `compositor` (the offline world's deterministic stand-in
generator).
"""

from ranger_jax.clients import cache, chat, compositor, http, images, media, sglang, sglang_mm, sglang_protocol

__all__ = ["cache", "chat", "compositor", "http", "images", "media", "sglang", "sglang_mm", "sglang_protocol"]
