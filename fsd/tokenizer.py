"""Tokenizers: the byte-level one the presets use, HF `tokenizer.json` for checkpoints,
and the incremental detokenizer that streams text as tokens arrive.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from fsd.errors import ModelLoadError


@runtime_checkable
class Tokenizer(Protocol):
    """What the engine needs from a tokenizer."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_token_id(self) -> int | None: ...

    @property
    def eos_token_id(self) -> int | None: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation (eos_token_id first)."""
        ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then <bos>, <eos>, <pad>; vocab padded to 320 (5 x 64).

    `encode` adds no BOS unless built with add_bos=True, so a prompt of n bytes is
    n tokens. Ids past the specials decode to nothing.
    """

    BOS = 256
    EOS = 257
    PAD = 258
    SPECIALS = {BOS: "<bos>", EOS: "<eos>", PAD: "<pad>"}
    VOCAB_SIZE = 320

    def __init__(self, add_bos: bool = False) -> None:
        self.add_bos = add_bos

    @property
    def vocab_size(self) -> int:
        return self.VOCAB_SIZE

    @property
    def bos_token_id(self) -> int:
        return self.BOS

    @property
    def eos_token_id(self) -> int:
        return self.EOS

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return (self.EOS,)

    @property
    def pad_token_id(self) -> int:
        return self.PAD

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [self.BOS, *ids] if self.add_bos and add_special_tokens else ids

    def stream_decoder(self, skip_special_tokens: bool = True) -> ByteStream:
        """Decodes a sequence one id at a time (`IncrementalDetokenizer` uses it)."""
        return ByteStream(None if skip_special_tokens else self.SPECIALS)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            try:
                return bytes(ids).decode("utf-8", errors="replace")
            except ValueError:  # an id past a byte: skipped
                return bytes([i for i in ids if 0 <= i < 256]).decode("utf-8", errors="replace")
        out = bytearray()
        for i in ids:
            if 0 <= i < 256:
                out.append(i)
            elif not skip_special_tokens and i in self.SPECIALS:
                out += self.SPECIALS[i].encode()
        return out.decode("utf-8", errors="replace")


class ByteStream:
    """UTF-8 decoded as the bytes come: a character is emitted once its last byte is
    here, and what `decode` gives the whole sequence is what the steps give together."""

    def __init__(self, specials: dict[int, str] | None) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._specials = specials  # None: skipped
        self._open = False  # the decoder holds the first bytes of a character

    def step(self, token: int) -> str:
        if 0 <= token < 128 and not self._open:  # ASCII between characters: itself
            return chr(token)
        if 0 <= token < 256:
            text = self._utf8.decode(bytes((token,)))
            self._open = bool(self._utf8.getstate()[0])
            return text
        special = self._specials.get(token) if self._specials else None
        if not special:
            return ""
        text = self._utf8.decode(special.encode())
        self._open = False  # (a special is ASCII: it closed what was open)
        return text

    def flush(self) -> str:
        self._open = False
        return self._utf8.decode(b"", final=True)


class HFTokenizer:
    """A HuggingFace `tokenizer.json` (fast tokenizer) from a checkpoint directory.

    Special tokens (BOS) are added as the file's post-processor says. The stop ids
    come from generation_config.json, config.json and tokenizer_config.json.
    """

    def __init__(
        self, tokenizer: Any, bos_token_id: int | None, eos_token_ids: Sequence[int]
    ) -> None:
        self._tok = tokenizer
        self._bos = bos_token_id
        self._eos = tuple(dict.fromkeys(eos_token_ids))

    @classmethod
    def from_dir(cls, path: str | Path) -> HFTokenizer:
        from tokenizers import Tokenizer as RawTokenizer

        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ModelLoadError(f"no tokenizer.json in {path} (fsd needs a fast tokenizer file)")
        try:
            tok = RawTokenizer.from_file(str(file))
        except Exception as exc:  # the Rust side raises plain Exception subclasses
            raise ModelLoadError(f"cannot read {file}: {exc}") from None
        metas = [read_json_side_file(path / n) for n in ("generation_config.json", "config.json")]
        tok_cfg = read_json_side_file(path / "tokenizer_config.json")
        eos: list[int] = []
        bos: list[int] = []
        for meta in metas:
            eos += _ids(meta.get("eos_token_id"))
            bos += _ids(meta.get("bos_token_id"))
        eos += _ids(_token_id(tok, tok_cfg.get("eos_token")))
        bos += _ids(_token_id(tok, tok_cfg.get("bos_token")))
        return cls(tok, bos[0] if bos else None, eos)

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    @property
    def bos_token_id(self) -> int | None:
        return self._bos

    @property
    def eos_token_id(self) -> int | None:
        return self._eos[0] if self._eos else None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens))


def read_json_side_file(file: Path) -> dict[str, Any]:
    """An optional side file: {} when absent; a broken one is an error naming it."""
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ModelLoadError(f"{file} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _ids(value: Any) -> list[int]:
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


def _token_id(tok: Any, token: Any) -> int | None:
    """tokenizer_config.json names tokens as a string or {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return tok.token_to_id(token) if isinstance(token, str) else None


class IncrementalDetokenizer:
    """Turns a growing list of token ids into new text chunks.

    Decodes a small window of ids (so decoders that strip a leading space or merge
    bytes see some context) and emits what the newest ids added. Text ending in
    U+FFFD is held back: the next ids may complete a multi-byte character. `flush`
    releases whatever is held when the sequence ends. A tokenizer that decodes one id
    at a time (`stream_decoder`, as the byte tokenizer does) is used that way instead.
    """

    WINDOW = 5  # ids of context before the first new id

    def __init__(
        self,
        tokenizer: Tokenizer,
        prompt_ids: Sequence[int] = (),
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        stream = getattr(tokenizer, "stream_decoder", None)
        self._stream = stream(skip_special_tokens) if stream is not None else None
        self._ids = [] if self._stream is not None else list(prompt_ids)
        self._prefix_offset = max(len(self._ids) - self.WINDOW, 0)
        self._read_offset = len(self._ids)
        self.text = ""  # everything emitted so far

    def add(self, new_ids: int | Iterable[int]) -> str:
        """Append ids; return the text they complete (possibly '')."""
        if self._stream is not None:
            if isinstance(new_ids, int):
                chunk = self._stream.step(new_ids)
            else:
                chunk = "".join(self._stream.step(i) for i in new_ids)
            self.text += chunk
            return chunk
        if isinstance(new_ids, int):
            self._ids.append(new_ids)
        else:
            self._ids.extend(new_ids)
        return self._emit(final=False)

    def flush(self) -> str:
        """Release held-back text (an incomplete character becomes U+FFFD)."""
        if self._stream is not None:
            chunk = self._stream.flush()
            self.text += chunk
            return chunk
        return self._emit(final=True)

    def _emit(self, final: bool) -> str:
        decode = self.tokenizer.decode
        skip = self.skip_special_tokens
        prefix_text = decode(
            self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip
        )
        new_text = decode(self._ids[self._prefix_offset :], skip_special_tokens=skip)
        if new_text == prefix_text:  # the new ids decode to nothing (skipped): pass them,
            # or every later call would decode them again (a window growing per token)
            self._read_offset = len(self._ids)
            self._prefix_offset = max(self._prefix_offset, self._read_offset - self.WINDOW)
            return ""
        if len(new_text) <= len(prefix_text) or (new_text.endswith("\ufffd") and not final):
            return ""
        chunk = new_text[len(prefix_text) :]
        # the next call's context: the ids just read, at most WINDOW of them (a long
        # chunk, released after a hold, would otherwise be decoded again next time)
        self._prefix_offset = max(self._read_offset, len(self._ids) - self.WINDOW)
        self._read_offset = len(self._ids)
        self.text += chunk
        return chunk
