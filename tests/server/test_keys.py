"""CURVE key files: private on disk whatever the umask, refused when exposed, operators."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import zmq

from fsd.config import ServerConfig
from fsd.errors import ConfigError
from fsd.server.security import Security, generate_keys


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask():
    """The loosest umask: nothing narrows the files but fsd itself."""
    old = os.umask(0)
    yield
    os.umask(old)


def curve_config(keys: dict[str, Path], **extra: str | None) -> ServerConfig:
    fields: dict[str, str | None] = {
        "curve_secret_key": str(keys["server_secret"]),
        "curve_authorized_dir": str(keys["authorized"]),
        "curve_operators_dir": str(keys["operators"]),
        **extra,
    }
    return ServerConfig(**fields)


def test_generated_secrets_are_0600_in_0700_folders_whatever_the_umask(tmp_path, open_umask):
    keys = generate_keys(tmp_path / "keys", clients=2, operators=2)
    root = tmp_path / "keys"
    for folder in (root, keys["authorized"], keys["operators"]):
        assert mode(folder) == 0o700, folder
    secrets = sorted(root.glob("*.key_secret"))
    assert [p.name for p in secrets] == [
        "client-1.key_secret",
        "client-2.key_secret",
        "operator-1.key_secret",
        "operator-2.key_secret",
        "server.key_secret",
    ]
    for secret in secrets:
        assert mode(secret) == 0o600, secret
        public, private = zmq.auth.load_certificate(str(secret))
        assert private is not None and zmq.curve_public(private) == public
    for public in root.glob("*.key"):
        assert mode(public) & 0o022 == 0  # nobody else may change who is trusted
    # every client and operator is admitted; only operators are listed as operators
    assert {p.name for p in keys["authorized"].iterdir()} == {
        "client-1.key",
        "client-2.key",
        "operator-1.key",
        "operator-2.key",
    }
    assert {p.name for p in keys["operators"].iterdir()} == {"operator-1.key", "operator-2.key"}


def test_an_existing_open_folder_is_narrowed(tmp_path):
    root = tmp_path / "keys"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    generate_keys(root, clients=0, operators=0)
    assert mode(root) == 0o700 and mode(root / "server.key_secret") == 0o600


def test_keys_generate_prints_the_config_lines_with_the_operators_dir(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsd.cli",
            "keys",
            "generate",
            str(tmp_path / "k"),
            "--operators",
            "2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert f'curve_operators_dir = "{tmp_path / "k" / "operators"}"' in proc.stdout
    assert f'curve_secret_key = "{tmp_path / "k" / "server.key_secret"}"' in proc.stdout
    assert (tmp_path / "k" / "operators" / "operator-2.key").is_file()


def test_the_daemon_refuses_a_server_secret_others_can_read(tmp_path):
    keys = generate_keys(tmp_path / "keys")
    os.chmod(keys["server_secret"], 0o644)
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError, match=r"curve_secret_key .* readable by others.*chmod 600"):
            Security(ctx, curve_config(keys))
    finally:
        ctx.term()


def test_operator_keys_are_loaded_as_z85_user_ids_and_admitted(tmp_path):
    keys = generate_keys(tmp_path / "keys", clients=1, operators=1)
    # an operator whose key is only in the operators folder is still let in
    extra_public, _ = zmq.curve_keypair()
    (keys["operators"] / "extra.key").write_text(
        f'curve\n    public-key = "{extra_public.decode()}"\n'
    )
    op_public, _ = zmq.auth.load_certificate(str(keys["operator-1_secret"]))
    client_public, _ = zmq.auth.load_certificate(str(keys["client-1_secret"]))
    ctx = zmq.Context()
    security = Security(ctx, curve_config(keys))
    try:
        assert security.operator_keys == frozenset({op_public.decode(), extra_public.decode()})
        admitted = security.auth.certs["*"]
        assert {op_public, client_public, extra_public} <= set(admitted)
    finally:
        security.close()
        ctx.term()


@pytest.mark.parametrize("which", ["missing", "bad-file"])
def test_a_bad_operators_folder_is_a_config_error_naming_the_field(tmp_path, which):
    keys = generate_keys(tmp_path / "keys")
    folder = keys["operators"]
    if which == "missing":
        folder = tmp_path / "nowhere"
    else:
        (folder / "junk.key").write_text("not a key\n")
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError, match="curve_operators_dir"):
            Security(ctx, curve_config(keys, curve_operators_dir=str(folder)))
    finally:
        ctx.term()


def test_operators_without_curve_are_refused():
    ctx = zmq.Context()
    try:
        with pytest.raises(ConfigError, match="curve_operators_dir needs curve_secret_key"):
            Security(ctx, ServerConfig(curve_operators_dir="/tmp"))
    finally:
        ctx.term()
