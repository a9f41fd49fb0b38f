import pytest

from m3mem.errors import ModelError
from m3mem.parse import (
    ParseError,
    extract_json,
    find_ids,
    parse_action,
    parse_memory,
    split_atomic,
    strip_thinking,
    translate_ids,
)

KNOWN = {"face_1", "face_10", "voice_2"}


# ---------------------------------------------------------------- memory JSON

def test_fenced_json_with_m3mem_keys():
    reply = 'Sure.\n```json\n{"episodic": ["<face_1> opens the door."], "semantic": ["<face_1> is a host."]}\n```\n'
    m = parse_memory(reply, KNOWN)
    assert m.episodic == ("<face_1> opens the door.",)
    assert m.semantic == ("<face_1> is a host.",)


def test_bare_json_with_m3agent_keys():
    reply = ('{"video_descriptions": ["<face_1> sits down."], '
             '"high_level_conclusions": ["Equivalence: <face_1>, <voice_2>", "<face_1> is calm."]}')
    m = parse_memory(reply, KNOWN)
    assert m.episodic == ("<face_1> sits down.",)
    assert m.semantic == ("Equivalence: <face_1>, <voice_2>", "<face_1> is calm.")


def test_singular_video_description_and_text_objects():
    reply = ('{"video_description": [{"text": "<face_10> waves."}], '
             '"semantic_memory": [{"content": "<voice_2> sounds tired."}]}')
    m = parse_memory(reply, KNOWN)
    assert m.episodic == ("<face_10> waves.",)
    assert m.semantic == ("<voice_2> sounds tired.",)


def test_python_literal_dict_is_accepted():
    # M3-Agent's prompts ask for "a Python dict"; models answer with single quotes
    reply = "{'episodic_memory': ['<face_1> laughs.'], 'semantic_memory': []}"
    assert parse_memory(reply, KNOWN).episodic == ("<face_1> laughs.",)


def test_json_after_prose_and_thinking_with_braces():
    reply = '<think>I should output {"x": 1} maybe</think>Here it is: {"episodic": ["<face_1> eats."], "semantic": []} done'
    assert parse_memory(reply, KNOWN).episodic == ("<face_1> eats.",)


def test_bare_list_moves_equivalences_to_semantic():
    m = parse_memory('["<face_1> smiles.", "Equivalence: face_1, voice_2"]', KNOWN)
    assert m.episodic == ("<face_1> smiles.",)
    assert m.semantic == ("Equivalence: <face_1>, <voice_2>",)


def test_bare_ids_are_bracketed():
    m = parse_memory('{"episodic": ["face_1 talks to face_10."], "semantic": []}', KNOWN)
    assert m.episodic == ("<face_1> talks to <face_10>.",)


def test_unknown_id_raises_parse_error_naming_it():
    reply = '{"episodic": ["<face_1> greets <face_7>.", "<voice_9> laughs."], "semantic": []}'
    with pytest.raises(ParseError) as e:
        parse_memory(reply, KNOWN)
    assert e.value.bad_ids == ("face_7", "voice_9")
    assert "face_7" in str(e.value) and "voice_9" in str(e.value)
    assert "greets" in e.value.excerpt
    assert isinstance(e.value, ModelError)


def test_character_ids_must_be_known_too():
    with pytest.raises(ParseError):
        parse_memory('{"episodic": ["<character_1> waves."]}', KNOWN)
    assert parse_memory('{"episodic": ["<character_1> waves."]}', KNOWN | {"character_1"}).episodic


def test_no_json_raises():
    with pytest.raises(ParseError, match="no JSON"):
        parse_memory("I cannot describe this video.", KNOWN)


def test_json_without_memory_keys_raises():
    with pytest.raises(ParseError, match="none of the keys"):
        parse_memory('{"summary": "a meeting"}', KNOWN)


def test_malformed_equivalence_raises():
    with pytest.raises(ParseError, match="one face and one voice"):
        parse_memory('{"semantic": ["Equivalence: <face_1>, <face_10>"]}', KNOWN)


def test_duplicates_dropped_and_list_markers_removed():
    m = parse_memory('{"episodic": ["- <face_1> sits.", "<face_1> sits.", "2. <face_1> stands."]}', KNOWN)
    assert m.episodic == ("<face_1> sits.", "<face_1> stands.")


def test_multi_sentence_lines_split_into_facts():
    m = parse_memory('{"episodic": ["<face_1> enters the kitchen. <voice_2> greets everyone warmly."]}', KNOWN)
    assert m.episodic == ("<face_1> enters the kitchen.", "<voice_2> greets everyone warmly.")


def test_truncated_json_raises():
    with pytest.raises(ParseError):
        parse_memory('{"episodic": ["<face_1> enters the kit', KNOWN)


# ---------------------------------------------------------------- atomic splitting

def test_split_keeps_pronoun_sentences_with_their_subject():
    line = "<face_1> wears a black suit. He has short black hair. The room is bright."
    assert split_atomic(line) == ["<face_1> wears a black suit. He has short black hair.", "The room is bright."]


def test_split_ignores_periods_inside_quotes():
    line = "<voice_2> says, 'Good afternoon, everyone. Let's begin.' The room quiets."
    assert split_atomic(line) == ["<voice_2> says, 'Good afternoon, everyone. Let's begin.'", "The room quiets."]
    assert split_atomic('<face_1> shouts "Stop. Now." A dog barks.') == ['<face_1> shouts "Stop. Now."', "A dog barks."]


def test_split_ignores_abbreviations_and_decimals():
    assert split_atomic("Mr. Smith pays 3.50 dollars at 5 p.m. today.") == ["Mr. Smith pays 3.50 dollars at 5 p.m. today."]


# ---------------------------------------------------------------- ids

def test_translate_ids_never_rewrites_a_longer_id():
    text = "<face_1> meets <face_10>; face_1 and face_10 and face_1b and myface_1"
    out = translate_ids(text, {"face_1": "character_3", "face_10": "character_4"})
    assert out == "<character_3> meets <character_4>; character_3 and character_4 and face_1b and myface_1"


def test_translate_ids_accepts_bracketed_keys_and_is_one_pass():
    # a single pass: character_1 -> character_2 must not cascade into character_3
    out = translate_ids("<character_1> and <character_2>", {"<character_1>": "<character_2>", "character_2": "character_3"})
    assert out == "<character_2> and <character_3>"


def test_find_ids():
    assert find_ids("<face_1> and voice_22, < character_3 >, face_1x") == ["face_1", "voice_22", "character_3"]


# ---------------------------------------------------------------- control actions

def test_parse_action_search_and_answer():
    assert parse_action("Action: [Search]\nContent: What is the name of <character_1>?") == (
        "search", "What is the name of <character_1>?")
    assert parse_action("Action: [Answer]\nContent: Alice, in the kitchen.") == ("answer", "Alice, in the kitchen.")


def test_parse_action_tolerates_case_markdown_and_thinking():
    reply = "<think>Need the name first. Action: [Answer]</think>\n**Action:** `[search]`\n**Content:** who is <face_1>?"
    assert parse_action(reply) == ("search", "who is <face_1>?")
    assert parse_action("action: answer\ncontent: 42") == ("answer", "42")


def test_parse_action_multi_line_content_and_last_action_wins():
    reply = ("Format: Action: [Answer] or [Search]\n\nAction: [Answer]\nContent: First line.\nSecond line.")
    assert parse_action(reply) == ("answer", "First line.\nSecond line.")


def test_parse_action_without_action_raises():
    with pytest.raises(ParseError, match="neither"):
        parse_action("I think the answer is Alice.")
    with pytest.raises(ParseError, match="no content"):
        parse_action("Action: [Search]\nContent:   ")
    with pytest.raises(ParseError):
        parse_action("<think>Action: [Answer] Content: Bob")  # cut off inside its reasoning


def test_strip_thinking_and_extract_json():
    assert strip_thinking("<think>a</think>b") == "b"
    assert extract_json("```\n[1, 2]\n```") == [1, 2]


def test_object_wins_over_bracketed_prose_and_list_items_stay_whole():
    reply = 'I wrote [2] lists below.\n{"episodic": ["<face_1> sits."], "semantic": []}'
    assert parse_memory(reply, KNOWN).episodic == ("<face_1> sits.",)
    assert extract_json('[{"text": "a"}, {"text": "b"}]') == [{"text": "a"}, {"text": "b"}]
    assert extract_json('Here: [{"text": "a"}, {"text": "b"}] end') == [{"text": "a"}, {"text": "b"}]
    assert parse_memory('[{"video_descriptions": ["<face_1> sits."]}]', KNOWN).episodic == ("<face_1> sits.",)


def test_python_literal_with_an_inner_empty_list_is_read_whole():
    reply = "Sure: {'episodic': ['<face_1> [quietly] sits.'], 'semantic': []} done"
    assert parse_memory(reply, KNOWN).episodic == ("<face_1> [quietly] sits.",)
