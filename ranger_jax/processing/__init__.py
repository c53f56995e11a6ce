"""Image preprocessing, tokenizer loading and Qwen3-VL chat rendering (messages -> ids, loss masks, images)."""

from ranger_jax.processing.chat import ChatRenderer, Rendered, concat, qwen3_vl_chat_template
from ranger_jax.processing.image import image_token_count, preprocess_image, preprocess_images, smart_resize
from ranger_jax.processing.sharegpt import messages_from_sharegpt
from ranger_jax.processing.tokenizer import SPECIAL_TOKENS, Tokenizer, load_tokenizer

__all__ = [
    "SPECIAL_TOKENS",
    "ChatRenderer",
    "Rendered",
    "Tokenizer",
    "concat",
    "image_token_count",
    "load_tokenizer",
    "messages_from_sharegpt",
    "preprocess_image",
    "preprocess_images",
    "qwen3_vl_chat_template",
    "smart_resize",
]
