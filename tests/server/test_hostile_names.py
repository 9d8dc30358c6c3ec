"""A name a client chooses that holds what a terminal would obey is refused with a
one-line error naming the character, over ZeroMQ and HTTP, and the daemon serves on."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

from fsd import protocol as P
from tests.server.daemon_proc import daemon_fixture, pool_config, raw
from tests.server.test_identity import collect

daemon = daemon_fixture(pool_config(64, 8, 0), "hostile-names", http=True)


def test_hostile_tags_affinity_and_req_ids_are_refused_naming_the_character(daemon):
    s = raw(daemon)
    cases = [
        (P.Submit(req_id="r1", prompt="hi", tags=["ok", "\x1b]52;c;eA==\x07"]), "tag 2 holds a control character (U+001B ESC)"),
        (P.Submit(req_id="r2", prompt="hi", affinity="user\x9b2J"), "affinity holds a C1 control character"),
        (P.Submit(req_id="r\n3", prompt="hi"), "req_id holds a control character (U+000A newline)"),
        (P.Inject(burst=P.Burst(count=1, input_len=4, output_len=2), tag="t\u202e", token=daemon.token), "tag holds a bidirectional control"),
    ]  # fmt: skip
    for msg, words in cases:
        s.send(P.encode(msg))
        [error] = collect(s, 10, P.Error)
        assert error.code == "invalid" and words in error.message and "\n" not in error.message
    s.close()
    with daemon.client() as c:  # the daemon serves on, tags in markup's brackets and all
        out = c.complete("hi", max_tokens=2, ignore_eos=True, tags=["[/]", "batch 7"])
        assert len(out.token_ids) == 2


def test_over_http_a_hostile_user_is_a_400(daemon):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 2, "user": "me\x1b]0;x\x07"}
    req = urllib.request.Request(
        f"{daemon.http}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(req, timeout=30)
        raise AssertionError("accepted")
    except urllib.error.HTTPError as exc:
        assert exc.code == 400
        assert "U+001B ESC" in json.loads(exc.read())["error"]["message"]
