"""load_tokenizer on the real Qwen3 vocabulary and on the tiny test tokenizer."""

import json

import pytest
import tokenizers
from support.tiny_tokenizer import DEFAULT_SPECIAL_IDS, write_tiny_tokenizer

from ranger_jax.processing import tokenizer as tokenizer_lib

QWEN_IDS = {  # the real Qwen3 vocabulary's special ids (its tokenizer.json)
    "endoftext_id": 151643, "im_start_id": 151644, "im_end_id": 151645, "vision_start_id": 151652,
    "vision_end_id": 151653, "vision_pad_id": 151654, "image_pad_id": 151655, "video_pad_id": 151656,
    "tool_call_id": 151657, "tool_call_end_id": 151658, "tool_response_id": 151665,
    "tool_response_end_id": 151666, "think_id": 151667, "think_end_id": 151668,
}
TEXTS = [
    "Hello world",
    "<|im_start|>user\nDraw the 2026 sneaker, see <|vision_start|><|image_pad|><|vision_end|><|im_end|>\n",
    "<think>\nplan: search, then crop\n</think>\n\n<tool_call>\n{\"name\": \"crop_image\"}\n</tool_call>",
    "Café naïve Zürich 東京 Привет  — \t tabs\n\n\nand   spaces  ",
    "e\u0301 decomposed accents are NFC-normalised",
]


def test_real_qwen_ids(qwen_tokenizer):
    assert qwen_tokenizer.encode("Hello world") == [9707, 1879]
    assert qwen_tokenizer.vocab_size == 151669
    for name, expected in QWEN_IDS.items():
        assert getattr(qwen_tokenizer, name) == expected, name
    assert qwen_tokenizer.eos_id == 151645 and qwen_tokenizer.pad_id == 151643
    assert qwen_tokenizer.token_to_id("<|im_start|>") == 151644
    assert qwen_tokenizer.id_to_token(151667) == "<think>"


@pytest.mark.parametrize("text", TEXTS)
def test_encode_decode_match_transformers(qwen_tokenizer, hf_qwen_tokenizer, text):
    ids = qwen_tokenizer.encode(text)
    assert ids == hf_qwen_tokenizer.encode(text, add_special_tokens=False)
    assert qwen_tokenizer.decode(ids) == hf_qwen_tokenizer.decode(ids, skip_special_tokens=False)
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == hf_qwen_tokenizer.decode(ids, skip_special_tokens=True)
    assert qwen_tokenizer.encode_batch([text, text]) == [ids, ids]


def test_think_and_tool_tags_survive_skip_special_tokens(qwen_tokenizer):
    ids = qwen_tokenizer.encode("<|im_start|><think>x</think><tool_call>y</tool_call><|im_end|>")
    assert qwen_tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think><tool_call>y</tool_call>"


def test_lookup_errors_name_the_token(qwen_tokenizer):
    with pytest.raises(KeyError, match="'<not-a-token>' is not in the vocabulary"):
        qwen_tokenizer.token_to_id("<not-a-token>")
    with pytest.raises(KeyError, match="id 999999 is not in the vocabulary"):
        qwen_tokenizer.id_to_token(999999)


def test_missing_tokenizer_json_names_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"no tokenizer.json in {tmp_path}"):
        tokenizer_lib.load_tokenizer(tmp_path)


def test_malformed_files_name_the_file(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="cannot parse .*tokenizer.json"):
        tokenizer_lib.load_tokenizer(tmp_path)
    write_tiny_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{")
    with pytest.raises(ValueError, match="cannot parse .*tokenizer_config.json"):
        tokenizer_lib.load_tokenizer(tmp_path)


@pytest.mark.parametrize("token", ["<think>", "<|image_pad|>"])
def test_missing_special_token_is_named(tmp_path, token):
    path = write_tiny_tokenizer(tmp_path)
    data = json.loads(path.read_text())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != token]
    del data["model"]["vocab"][token]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=f"has no token '{token.replace('|', '[|]')}'"):
        tokenizer_lib.load_tokenizer(tmp_path)


def test_eos_and_pad_come_from_tokenizer_config(tmp_path):
    write_tiny_tokenizer(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    config["eos_token"] = {"content": "<|endoftext|>", "special": True}
    config["pad_token"] = "<|vision_pad|>"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = tokenizer_lib.load_tokenizer(tmp_path)
    assert (tokenizer.eos_id, tokenizer.pad_id) == (0, 7)
    (tmp_path / "tokenizer_config.json").unlink()
    tokenizer = tokenizer_lib.load_tokenizer(tmp_path)
    assert (tokenizer.eos_id, tokenizer.pad_id) == (2, 0)


def test_tiny_tokenizer_defaults_and_determinism(tmp_path):
    first = write_tiny_tokenizer(tmp_path / "a")
    second = write_tiny_tokenizer(tmp_path / "b")
    assert first.read_bytes() == second.read_bytes()
    tokenizer = tokenizer_lib.load_tokenizer(tmp_path / "a")
    assert tokenizer.vocab_size == 512
    for token, token_id in DEFAULT_SPECIAL_IDS.items():
        assert tokenizer.token_to_id(token) == token_id
    assert (tokenizer.vision_start_id, tokenizer.vision_end_id, tokenizer.image_pad_id) == (3, 4, 5)
    ids = tokenizer.encode("Hello world, search the image")
    assert 1 < len(ids) < len("Hello world, search the image") and max(ids) < 512
    assert tokenizer.decode(ids) == "Hello world, search the image"


def test_tiny_tokenizer_custom_ids_and_transformers_loading(tmp_path):
    from transformers import AutoTokenizer

    top = {token: 511 - k for k, token in enumerate(DEFAULT_SPECIAL_IDS)}
    write_tiny_tokenizer(tmp_path, vocab_size=512, special_ids=top)
    tokenizer = tokenizer_lib.load_tokenizer(tmp_path)
    assert tokenizer.endoftext_id == 511 and tokenizer.im_start_id == 510 and tokenizer.think_end_id == 498
    hf = AutoTokenizer.from_pretrained(tmp_path)
    for text in TEXTS:
        assert tokenizer.encode(text) == hf.encode(text, add_special_tokens=False)
    assert hf.eos_token_id == tokenizer.im_end_id


def test_tiny_tokenizer_rejects_bad_ids(tmp_path):
    with pytest.raises(ValueError, match="distinct"):
        write_tiny_tokenizer(tmp_path, special_ids={**DEFAULT_SPECIAL_IDS, "<think>": 0})
    with pytest.raises(ValueError, match="lacks"):
        write_tiny_tokenizer(tmp_path, special_ids={"<|im_start|>": 1})
    with pytest.raises(ValueError, match="fewer than the 256 byte tokens"):
        write_tiny_tokenizer(tmp_path, vocab_size=200)


def test_wrapper_rejects_backend_without_chat_tokens():
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    with pytest.raises(ValueError, match="has no token '<[|]endoftext[|]>'"):
        tokenizer_lib.Tokenizer(backend)
