"""Command-line options that `fsd` and `fsctl` share, and where their defaults come from.

An option that sets a config field takes its default from the config dataclass
(`default_of`), and an option that names one of a registry's entries lists them in
its help (`one_of`), so a default or a policy changes in one place: the way vLLM's
EngineArgs takes its defaults from its config classes. tests/test_cli_defaults.py
holds every command to it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from fsd.config import SLICE_TYPES, ClusterConfig, ServerConfig
from fsd.errors import ConfigError

if TYPE_CHECKING:
    from fsd.client import CurveKeys

# every dataclass whose fields a command-line option may set, by the field's own name
CONFIG_CLASSES: tuple[type, ...] = (*SLICE_TYPES.values(), ServerConfig, ClusterConfig)
CONFIG_FIELDS = frozenset(f.name for cls in CONFIG_CLASSES for f in dataclasses.fields(cls))
# `fsd generate` and `fsctl submit` answer at more length than SamplingParams' default
CLI_MAX_TOKENS = 64

ServerKey = Annotated[
    Optional[str],  # noqa: UP045 - typer reads the annotation at run time
    typer.Option(envvar="FSD_SERVER_KEY", help="CURVE: the daemon's public key file."),
]
ClientKey = Annotated[
    Optional[str],  # noqa: UP045
    typer.Option(envvar="FSD_CLIENT_KEY", help="CURVE: this client's .key_secret file."),
]


def default_of(config: type, name: str) -> Any:
    """The default of field `name` of `config` (a dataclass, or a msgspec Struct of the
    wire such as `protocol.Sampling`): a CLI option's default."""
    if dataclasses.is_dataclass(config):
        fields = [(f.name, f.default, f.default_factory) for f in dataclasses.fields(config)]
        missing: Any = dataclasses.MISSING
    else:
        import msgspec

        fields = [(f.name, f.default, f.default_factory) for f in msgspec.structs.fields(config)]
        missing = msgspec.NODEFAULT
    for field, default, factory in fields:
        if field != name:
            continue
        if default is not missing:
            return default
        if factory is not missing:
            return factory()
        raise TypeError(f"{config.__name__}.{name} has no default")
    raise TypeError(f"{config.__name__} has no field {name!r}")


def one_of(names: Iterable[str], last: str = "or") -> str:
    """('a', 'b', 'c') → 'a, b or c': a registry's entries in a help string."""
    items = list(names)
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"


def given_argv(ctx: typer.Context, skip: Collection[str] = ()) -> list[str]:
    """The options of this invocation that have a value, as FLAG VALUE pairs again
    (e.g. for the same command in a child process); flags named in `skip` stay out."""
    argv: list[str] = []
    for param in ctx.command.params:
        value = ctx.params.get(param.name or "")
        if param.name in skip or value is None or param.param_type_name != "option":
            continue
        if getattr(param, "is_flag", False) and isinstance(value, bool):  # --x / --no-x
            names = param.opts if value else getattr(param, "secondary_opts", [])
            argv += names[:1]
            continue
        items = value if isinstance(value, list | tuple) else [value]  # a repeatable option
        for item in items:
            argv += [param.opts[0], str(item)]
    return argv


def package_version() -> str:
    """The installed fsd's version (its metadata), else the source tree's."""
    try:
        return importlib.metadata.version("fsd")
    except importlib.metadata.PackageNotFoundError:  # a checkout run without installing
        from fsd.version import __version__

        return __version__


def version_option(prog: str) -> Any:
    """An eager `--version`: prints "PROG VERSION" and exits before any command runs."""

    def show(value: bool) -> None:
        if value:
            typer.echo(f"{prog} {package_version()}")
            raise typer.Exit()

    return typer.Option(
        "--version", callback=show, is_eager=True, help="Print the version and exit."
    )


def curve_keys(server_key: str | None, client_key: str | None) -> CurveKeys | None:
    """The client's CURVE keys from --server-key/--client-key (both or neither)."""
    from fsd.client import CurveKeys

    if server_key is None and client_key is None:
        return None
    if server_key is None or client_key is None:
        raise ConfigError("CURVE needs both --server-key and --client-key")
    return CurveKeys(server_key, None, client_key)
