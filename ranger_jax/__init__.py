"""ranger_jax: agentic image generation in the wild, on JAX."""
