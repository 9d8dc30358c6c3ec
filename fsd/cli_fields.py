"""Command-line options generated from the config dataclasses.

Each option is a field: its name, its type, its help line (`fsd.config_checks.doc`)
and its default (the field's, or None where the config file decides: `fsd start`).
A command declares only its own options and names the fields it takes; `with_fields`
adds them to its signature, so typer builds them as if they were written out, and the
command receives them by name. A new config field is an option of every command that
takes its slice's fields, with no line of the command changed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Iterable, Mapping
from typing import Annotated, Any, Optional

import typer

from fsd.cli_options import default_of
from fsd.config_checks import help_of

# a field of (NAME, VALUE) pairs (a policy's own settings) is a repeatable option
PAIRS = tuple[tuple[str, Any], ...]


def field_names(config: type, skip: Iterable[str] = ()) -> list[str]:
    """The fields of `config` in declaration order, less `skip`."""
    left_out = set(skip)
    return [f.name for f in dataclasses.fields(config) if f.name not in left_out]


def field_options(
    config: type,
    names: Iterable[str],
    *,
    unset: bool = False,
    defaults: Mapping[str, Any] | None = None,
    helps: Mapping[str, str] | None = None,
    notes: Mapping[str, str] | None = None,
) -> list[inspect.Parameter]:
    """One typer option per field of `config` named in `names`.

    `unset`: every default is None (the config file, then the field's default, decide)
    and the help ends with the field's default. `defaults` and `helps` replace a
    field's own where a command means something else by it (the simulator's profile);
    `notes` are added to a field's help (each policy's own value of a setting).
    """
    hints = typing.get_type_hints(config)
    params = []
    for name in names:
        kind = hints[name]
        text = (helps or {}).get(name) or help_of(config, name)
        if name in (notes or {}):
            text = f"{text} {notes[name]}"  # type: ignore[index]
        option = typer.Option(help=text)
        if kind == PAIRS:  # a repeatable NAME=VALUE option
            kind, option = list[str], typer.Option(help=text, metavar="NAME=VALUE")
        if unset:
            kind = Optional[kind]  # noqa: UP045 - typer reads the annotation at run time
            own = default_of(config, name)
            if own not in (None, ()) and not isinstance(own, bool):
                text = f"{text} Default: {own}."
            default = None
        else:
            default = (defaults or {}).get(name, default_of(config, name))
        params.append(
            inspect.Parameter(
                name,
                inspect.Parameter.KEYWORD_ONLY,
                default=default,
                annotation=Annotated[kind, option],
            )
        )
    return params


def with_fields(
    *groups: list[inspect.Parameter], before: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Add the generated options to a command's own, ahead of its option `before`
    (else last); the command is called with every option by name."""

    def wrap(func: Callable[..., Any]) -> Callable[..., Any]:
        own = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in inspect.signature(func, eval_str=True).parameters.values()
            if p.kind is not inspect.Parameter.VAR_KEYWORD  # `**options`: the generated ones
        ]
        extra = [p for group in groups for p in group]
        clash = {p.name for p in own} & {p.name for p in extra}
        if clash:
            raise TypeError(f"{func.__name__}: options declared twice: {sorted(clash)}")
        at = next((i for i, p in enumerate(own) if p.name == before), len(own))
        params = own[:at] + extra + own[at:]

        @functools.wraps(func)
        def command(**options: Any) -> Any:
            return func(**options)

        command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        return command

    return wrap


def given(options: Mapping[str, Any], config: type) -> dict[str, Any]:
    """The options that are fields of `config`, by name."""
    names = {f.name for f in dataclasses.fields(config)}
    return {k: v for k, v in options.items() if k in names}
