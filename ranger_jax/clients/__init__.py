"""HTTP clients: the shared retry loop and cache, OpenAI-compatible chat, the SGLang policy server, image generators."""
