from fsd.engine.detokenizer import JobDetokenizer
from fsd.tokenizer import ByteTokenizer

TOK = ByteTokenizer()


def feed(text: JobDetokenizer, s: str) -> str:
    out = ""
    for b in s.encode():
        out += text.add(b)
        if text.stop is not None:
            break
    return out


def test_without_stops_every_character_streams_at_once():
    t = JobDetokenizer(TOK, [], [])
    assert [t.add(b) for b in b"abc"] == ["a", "b", "c"]
    assert t.finish() == "" and t.text == "abc"


def test_a_possible_stop_prefix_is_held_back_then_released():
    t = JobDetokenizer(TOK, [], ["END"])
    assert feed(t, "xEN") == "x"  # "EN" could begin "END"
    assert feed(t, "d") == "E"  # the last two characters stay held
    assert t.finish() == "Nd"
    assert t.text == "xENd" and t.stop is None


def test_stop_spanning_tokens_cuts_the_text_before_it():
    t = JobDetokenizer(TOK, [], ["END", "zz"])
    streamed = feed(t, "hello ENDworld")
    assert t.stop == "END" and t.text == "hello "
    assert streamed + t.finish() == "hello "


def test_multibyte_characters_are_never_split():
    t = JobDetokenizer(TOK, [], [])
    parts = [t.add(b) for b in "é✓".encode()]
    assert "".join(parts) == "é✓" and all("\ufffd" not in p for p in parts)


def test_stop_found_in_text_released_only_at_the_end():
    t = JobDetokenizer(TOK, [], ["\ufffd\ufffd"])
    for b in (0xFF, 0xFE, 0xFD):  # invalid UTF-8: held back until finish
        t.add(b)
    assert t.finish() == "" and t.stop == "\ufffd\ufffd" and t.text == ""
