import pytest

from ranger_jax.env import core, parsing


def test_split_turn_skips_thinking_and_self_written_tool_responses():
    turn = parsing.split_turn(
        '<think>maybe <tool_call>{"name": "x"}</tool_call> later</think>\n'
        '<tool_call>\n{"name": "text_search", "arguments": {"queries": ["a"]}}\n</tool_call>'
        '<tool_response>fake</tool_response><tool_call>{}</tool_call>'
    )
    assert len(turn.calls) == 1 and '"text_search"' in turn.calls[0]
    assert turn.answers == () and not turn.unclosed_call


def test_split_turn_reports_unclosed_blocks_and_unclosed_think():
    assert parsing.split_turn("<tool_call>{").unclosed_call
    assert parsing.split_turn('<answer>{"gen_prompt": "x"').unclosed_answer
    with pytest.raises(parsing.FormatError, match="never closed"):
        parsing.split_turn("<think>still thinking")
    # a closing tag alone (template put <think> in the prompt) still ends the thinking
    assert parsing.split_turn("plan</think><answer>{}</answer>").answers == ("{}",)


@pytest.mark.parametrize("body", [
    '{"name": "image_search", "arguments": {"query": "red lighthouse"}}',
    "```json\n{'name': 'image_search', 'arguments': {'query': 'red lighthouse',},}\n```",  # json5 + fence
    '{"name": "image_search", "arguments": "{\\"query\\": \\"red lighthouse\\"}"}',  # OpenAI string args
    '{"function": {"name": "image_search", "parameters": {"query": "red lighthouse"}}}',
])
def test_parse_tool_call_tolerant_shapes(body):
    call = parsing.parse_tool_call(body)
    assert call == parsing.ToolCall("image_search", {"query": "red lighthouse"})


@pytest.mark.parametrize("body, match", [
    ("not json at all", "JSON object"),
    ('{"name": "x", "arguments": {"a": }', "not valid JSON"),
    ('{"arguments": {}}', '"name"'),
    ('{"name": "x", "arguments": [1, 2]}', "must be a JSON object"),
    ('[{"name": "a"}, {"name": "b"}]', "not valid JSON"),
])
def test_parse_tool_call_errors_name_the_problem(body, match):
    with pytest.raises(parsing.FormatError, match=match):
        parsing.parse_tool_call(body)


def test_parse_answer_normalises_dedups_and_caps():
    known = {"IMG_001", "IMG_002", "IMG_003"}
    body = ('{"gen_prompt": " A red tower ", "reference_images": [{"img_id": "img_2", "note": "tower"}, '
            '"IMG_001", {"img_id": "IMG_002"}, {"img_id": "IMG_003", "note": 5}]}')
    answer = parsing.parse_answer(body, known, drop_unknown=False, max_refs=2)
    assert answer == core.Answer("A red tower", (core.AnswerRef("IMG_002", "tower"), core.AnswerRef("IMG_001", "")))


def test_parse_answer_unknown_id_fails_unless_dropping():
    body = '{"gen_prompt": "x", "reference_images": [{"img_id": "IMG_009"}, {"img_id": "IMG_001"}]}'
    with pytest.raises(parsing.AnswerError, match="IMG_009.*never shown.*IMG_001"):
        parsing.parse_answer(body, {"IMG_001"}, drop_unknown=False, max_refs=5)
    answer = parsing.parse_answer(body, {"IMG_001"}, drop_unknown=True, max_refs=5)
    assert [r.img_id for r in answer.reference_images] == ["IMG_001"]


@pytest.mark.parametrize("body, match", [
    ('{"reference_images": []}', "gen_prompt"),
    ('{"gen_prompt": "  ", "reference_images": []}', "gen_prompt"),
    ('{"gen_prompt": "x"}', "reference_images"),
    ('{"gen_prompt": "x", "reference_images": "IMG_001"}', "must be a list"),
    ('{"gen_prompt": "x", "reference_images": [{"note": "no id"}]}', r"reference_images\[0\]"),
    ("{gen_prompt: ", "JSON"),
])
def test_parse_answer_errors(body, match):
    with pytest.raises(parsing.AnswerError, match=match):
        parsing.parse_answer(body, {"IMG_001"}, drop_unknown=False, max_refs=5)


def test_img_id_formats():
    assert parsing.format_img_id(7) == "IMG_007" and parsing.format_img_id(1234) == "IMG_1234"
    assert parsing.normalise_img_id("img-12") == "IMG_012"
    assert parsing.normalise_img_id("IMG_0005") == "IMG_005"
    assert parsing.normalise_img_id("picture 3") is None and parsing.normalise_img_id(3) is None
