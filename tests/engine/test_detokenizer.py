from hypothesis import given
from hypothesis import strategies as st

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



def _counting(tok: ByteTokenizer) -> list[int]:
    """Make `tok.decode` record the length of every id list it is given."""
    sizes: list[int] = []
    real = tok.decode

    def decode(ids, skip_special_tokens=True):
        sizes.append(len(ids))
        return real(ids, skip_special_tokens=skip_special_tokens)

    tok.decode = decode  # type: ignore[method-assign]
    return sizes


class WindowedBytes(ByteTokenizer):
    """The byte tokenizer without its one-id-at-a-time decoder: the windowed path, as
    a HuggingFace tokenizer takes it."""

    stream_decoder = None


def test_ids_that_decode_to_nothing_are_passed_once_not_decoded_at_every_token():
    from fsd.tokenizer import IncrementalDetokenizer

    tok = WindowedBytes()
    detok = IncrementalDetokenizer(tok, list(b"hello"))
    sizes = _counting(tok)
    text = detok.add(ord("A")) + "".join(detok.add(300) for _ in range(200)) + detok.add(ord("B"))
    assert text + detok.flush() == "AB"
    assert max(sizes) <= IncrementalDetokenizer.WINDOW + 2  # not 200 skipped ids and more


@given(
    st.lists(st.integers(32, 126), max_size=8),
    st.lists(st.integers(0, 511), max_size=60),
    st.sampled_from([ByteTokenizer(), WindowedBytes()]),
    st.booleans(),
)
def test_the_streamed_text_is_the_whole_decode(prompt, output, tok, skip):
    from fsd.tokenizer import IncrementalDetokenizer

    detok = IncrementalDetokenizer(tok, prompt, skip_special_tokens=skip)
    streamed = "".join(detok.add(i) for i in output) + detok.flush()
    assert streamed == tok.decode(output, skip_special_tokens=skip)
    assert detok.text == streamed
