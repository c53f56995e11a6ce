"""Gen-Searcher's SFT file (LLaMA-Factory sharegpt) read, rendered and batched, against transformers' Qwen3-VL
chat template and image processor; bad rows name the file, the row and the field."""

import dataclasses
import json

import numpy as np
import pytest
from PIL import Image
from support.tiny_tokenizer import qwen3_tokenizer_dir
from transformers import AutoTokenizer
from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as hf_image

from ranger_jax.data import batching, pipeline, sft_file
from ranger_jax.models.qwen3_vl import Qwen3VLConfig
from ranger_jax.models.qwen3_vl.model import check_inputs
from ranger_jax.processing import ChatRenderer, chat, load_tokenizer
from ranger_jax.rollout import sequence

VISION = sequence.VisionSettings(min_pixels=4096, max_pixels=16384)
SYSTEM = "You are a deep research agent for image generation. Tools: image_search, text_search.2026-05-01"
A1 = ('<think>\nFind the sneaker.\n</think>\n<tool_call>\n{"name": "image_search", "arguments": {"query": "x"}}\n'
      "</tool_call>")
OBS = "<tool_response>\nIMG_001: title: side view\n</tool_response>"
A2 = '<think>\nIMG_001 fits.\n</think>\n<answer>{"gen_prompt": "the shoe", "reference_images": []}</answer>'
GEN_SFT_ENTRY = {"file_name": "sft_data.json", "formatting": "sharegpt",
                 "columns": {"messages": "messages", "images": "images"},
                 "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                          "assistant_tag": "assistant", "system_tag": "system"}}


def gen_searcher_rows():
    return [
        {"messages": [{"role": "system", "content": SYSTEM},
                      {"role": "user", "content": "<image>Draw this sneaker on a wet street."},
                      {"role": "assistant", "content": A1},
                      {"role": "user", "content": "<image>" + OBS},
                      {"role": "assistant", "content": A2}],
         "images": ["images/a.png", "images/b.png"]},
        {"messages": [{"role": "user", "content": "Draw a lighthouse."}, {"role": "assistant", "content": A2}],
         "images": []},
    ]


@pytest.fixture(scope="module")
def renderer():
    return ChatRenderer(load_tokenizer(qwen3_tokenizer_dir()))


@pytest.fixture(scope="module")
def hf_tokenizer():
    return AutoTokenizer.from_pretrained(qwen3_tokenizer_dir())


@pytest.fixture()
def dataset_dir(tmp_path):
    """LLaMA-Factory's layout: data/dataset_info.json, data/sft_data.json, images relative to data/."""
    data = tmp_path / "data"
    (data / "images").mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name, size in (("a", (100, 70)), ("b", (40, 130))):
        pixels = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
        Image.fromarray(pixels).save(data / "images" / f"{name}.png")
    (data / "dataset_info.json").write_text(json.dumps({"gen_sft": GEN_SFT_ENTRY}))
    (data / "sft_data.json").write_text(json.dumps(gen_searcher_rows()))
    return data


def hf_reference(hf_tokenizer, messages, images):
    """transformers: the chat template's string, <|image_pad|> expanded by the image processor's grids."""
    processor = hf_image.Qwen2VLImageProcessorPil(
        patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": VISION.min_pixels, "longest_edge": VISION.max_pixels})
    text = hf_tokenizer.apply_chat_template(messages, chat_template=chat.qwen3_vl_chat_template(), tokenize=False)
    if not images:
        return hf_tokenizer(text, add_special_tokens=False)["input_ids"], None, np.zeros((0, 3))
    out = processor(images=images, return_tensors="np")
    pieces = text.split("<|image_pad|>")
    counts = [int(np.prod(g)) // 4 for g in out["image_grid_thw"]]
    text = pieces[0] + "".join("<|image_pad|>" * n + p for n, p in zip(counts, pieces[1:]))
    return hf_tokenizer(text, add_special_tokens=False)["input_ids"], out["pixel_values"], out["image_grid_thw"]


def test_gen_sft_entry_rows_render_as_transformers_does(dataset_dir, renderer, hf_tokenizer):
    sft = sft_file.SftFile(sft_file.SftColumns.from_dataset_info(dataset_dir / "dataset_info.json", "gen_sft"))
    assert len(sft) == 2 and sft[0]["images"] == [str(dataset_dir / "images" / "a.png"),
                                                  str(dataset_dir / "images" / "b.png")]
    example = sft.example(0, renderer=renderer, vision=VISION)
    images = [Image.open(dataset_dir / "images" / n).convert("RGB") for n in ("a.png", "b.png")]
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": [{"type": "image"},
                                             {"type": "text", "text": "Draw this sneaker on a wet street."}]},
                {"role": "assistant", "content": A1},
                {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": OBS}]},
                {"role": "assistant", "content": A2}]
    ids, pixels, grids = hf_reference(hf_tokenizer, messages, images)
    assert example["input_ids"].tolist() == ids
    np.testing.assert_array_equal(example["pixel_values"], pixels)
    assert example["image_grid_thw"].tolist() == grids.tolist() and example["image_grid_thw"].dtype == np.int32
    mask = np.concatenate([[0], example["loss_mask"], [0]]).astype(int)  # trained spans: assistant turns only
    starts, ends = np.flatnonzero(np.diff(mask) == 1), np.flatnonzero(np.diff(mask) == -1)
    assert [hf_tokenizer.decode(example["input_ids"][s:e]) for s, e in zip(starts, ends)] == \
        [A1 + "<|im_end|>", A2 + "<|im_end|>"]
    assert example["policy_version"] == -1 and not example["sampler_logp"].any()

    text_only = sft.example(1, renderer=renderer, vision=VISION)
    ids, _, _ = hf_reference(hf_tokenizer, gen_searcher_rows()[1]["messages"], [])
    assert text_only["input_ids"].tolist() == ids and text_only["pixel_values"].shape == (0, 1536)


def test_sft_batches(dataset_dir, renderer):
    sft = sft_file.SftFile(sft_file.SftColumns.from_dataset_info(dataset_dir, "gen_sft"))
    spec = batching.BatchSpec.for_tokenizer(renderer.tokenizer, batch_size=2, length_buckets=(256, 512),
                                            vision=VISION, patch_step=64, image_step=4)
    dataset = pipeline.sft_dataset(sft, renderer=renderer, spec=spec, vision=VISION, num_epochs=1, shard_index=0,
                                   shard_count=1)
    (batch,) = list(iter(dataset))
    assert "advantages" not in batch and batch["policy_version"].tolist() == [-1, -1]
    assert batch["row_valid"].tolist() == [1, 1] and batch["input_ids"].shape == (2, 256)
    rendered = {tuple(sft.example(i, renderer=renderer, vision=VISION)["input_ids"]) for i in range(2)}
    lengths = sorted(len(r) for r in rendered)
    assert {tuple(batch["input_ids"][r, :n]) for r, n in zip(range(2), lengths)} == rendered
    tiny = Qwen3VLConfig.tiny()
    qwen_ids = dataclasses.replace(tiny, image_token_id=151655, video_token_id=151656,
                                   text_config=dataclasses.replace(tiny.text_config, vocab_size=151936))
    check_inputs(qwen_ids, batch["input_ids"], batch["attention_mask"], batch["pixel_values"], batch["image_grid_thw"])
    with pytest.raises(ValueError, match=r"batch spec ids \(pad 0, image_pad 151655\) differ from the tokenizer's"):
        pipeline.sft_dataset(sft, renderer=renderer, spec=dataclasses.replace(spec, pad_id=0))


def test_llama_factory_default_tags_and_json_lines(tmp_path, renderer):
    rows = [{"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."},
                               {"from": "observation", "value": "42"}, {"from": "gpt", "value": "Done."}],
             "sys": "Be brief."}]
    (tmp_path / "rows.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"plain": {"file_name": "rows.jsonl", "formatting": "sharegpt", "columns": {"system": "sys"}}}))
    sft = sft_file.SftFile(sft_file.SftColumns.from_dataset_info(tmp_path, "plain"))
    assert sft[0] == {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                   {"role": "observation", "content": "42"}, {"role": "assistant", "content": "Done."}],
                      "images": [], "system": "Be brief."}
    example = sft.example(0, renderer=renderer, vision=VISION)
    text = renderer.tokenizer.decode(example["input_ids"])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>")
    assert "<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>" in text


GOOD = {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}


@pytest.mark.parametrize("row, match", [
    ("just text", r"row 1 field '': row must be an object, got str"),
    ({"images": []}, r"row 1 field 'messages': must be a non-empty list of turns, got NoneType"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
     r"row 1 field 'messages\[1\]\.role': role tag 'bot' is not one of \['assistant', 'observation', 'system', "
     r"'user'\]"),
    ({"messages": [{"role": "user", "content": ["a"]}]}, r"row 1 field 'messages\[0\]\.content': content must be a "
                                                         r"string, got list"),
    ({"messages": [{"role": "user", "content": "a"}]}, r"row 1 field 'messages': has no assistant turn"),
    ({"messages": [*GOOD["messages"], {"role": "system", "content": "s"}]},
     r"row 1 field 'messages\[2\]': a system turn may only come first"),
    ({"messages": [{"role": "user", "content": "<image>a"}, GOOD["messages"][1]]},
     r"row 1 field 'images': 1 <image> placeholders in the turns but 0 images"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "<image>"}], "images": ["x.png"]},
     r"row 1 field 'messages\[1\]\.content': <image> in a assistant turn"),
    ({**GOOD, "messages": [{"role": "user", "content": "<image>a"}, GOOD["messages"][1]], "images": ["missing.png"]},
     r"row 1 field 'images\[0\]': image file missing.png does not exist"),
    ({**GOOD, "images": "a.png"}, r"row 1 field 'images': must be a list of image paths"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, row, match):
    path = tmp_path / "sft_data.json"
    path.write_text(json.dumps([GOOD, row]))
    with pytest.raises(sft_file.SftFormatError, match=rf"sft_data.json {match}") as err:
        sft_file.SftFile(path)
    assert err.value.path == path and err.value.row == 1


def test_rows_that_fail_when_rendered_name_the_field(tmp_path, renderer):
    (tmp_path / "broken.png").write_bytes(b"not an image at all")
    rows = [{"messages": [{"role": "user", "content": "<image>a"}, GOOD["messages"][1]], "images": ["broken.png"]},
            {"messages": [{"role": "user", "content": "see <|image_pad|>"}, GOOD["messages"][1]]}]
    (tmp_path / "sft_data.json").write_text(json.dumps(rows))
    sft = sft_file.SftFile(tmp_path / "sft_data.json")
    with pytest.raises(sft_file.SftFormatError, match=r"sft_data.json row 0 field 'images\[0\]': image .*broken.png: "
                                                      r"cannot identify image file"):
        sft.example(0, renderer=renderer, vision=VISION)
    with pytest.raises(sft_file.SftFormatError, match=r"sft_data.json row 1 field 'messages': text of message 0 "
                                                      r"\(user\) contains '<\|image_pad\|>'"):
        sft.example(1, renderer=renderer, vision=VISION)


def test_dataset_info_errors(tmp_path):
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps({"gen_sft": GEN_SFT_ENTRY, "alp": {"file_name": "a.json"},
                                "hub": {"hf_hub_url": "org/x", "formatting": "sharegpt"}}))
    with pytest.raises(sft_file.SftFormatError, match=r"field 'nope': no such dataset entry \(entries: \['alp', "
                                                      r"'gen_sft', 'hub'\]\)"):
        sft_file.SftColumns.from_dataset_info(info, "nope")
    with pytest.raises(sft_file.SftFormatError, match=r"field 'alp.formatting': 'alpaca' is not supported"):
        sft_file.SftColumns.from_dataset_info(info, "alp")
    with pytest.raises(sft_file.SftFormatError, match=r"field 'hub.file_name': needs a local file name"):
        sft_file.SftColumns.from_dataset_info(info, "hub")
    with pytest.raises(FileNotFoundError, match=r"SFT file .*sft_data.json does not exist"):
        sft_file.SftFile(sft_file.SftColumns.from_dataset_info(info, "gen_sft"))
    with pytest.raises(FileNotFoundError, match="dataset_info file .*missing.json does not exist"):
        sft_file.SftColumns.from_dataset_info(tmp_path / "missing.json", "gen_sft")
