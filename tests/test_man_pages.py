"""The man pages document every command, option and config key, and `fsd man` shows them."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from fsd import manual
from fsd.cli import app as fsd_app
from fsd.console.cli import app as fsctl_app

ROOT = Path(__file__).resolve().parent.parent
# typer's own shell-completion switches are not fsd's to document
UNDOCUMENTED = {"--help", "--install-completion", "--show-completion"}


def commands(cmd, path: list[str]) -> Iterator[tuple[list[str], object]]:
    yield path, cmd
    for name, sub in (getattr(cmd, "commands", None) or {}).items():
        yield from commands(sub, [*path, name])


def surface(app: typer.Typer, name: str) -> tuple[set[str], set[str]]:
    """(every subcommand path like "bench slo", every option name) of a typer app."""
    paths, options = set(), set()
    for path, cmd in commands(typer.main.get_command(app), [name]):
        if len(path) > 1:
            paths.add(" ".join(path[1:]))
        for param in cmd.params:
            if param.param_type_name == "option":
                options.update(
                    o for o in param.opts + param.secondary_opts if o not in UNDOCUMENTED
                )
    return paths, options


def page_text(name: str) -> str:
    return manual.to_text((ROOT / "man" / manual.PAGES[name]).read_text())


@pytest.mark.parametrize(("app", "name"), [(fsd_app, "fsd"), (fsctl_app, "fsctl")])
def test_every_command_and_option_is_in_the_page(app, name):
    text = page_text(name)
    paths, options = surface(app, name)
    assert {"start", "man"} <= paths or {"top", "man"} <= paths
    missing = sorted(
        p for p in paths if not re.search(rf"\b{re.escape(name)} {re.escape(p)}\b", text)
    )
    assert not missing, f"{name}(1) lacks a section for: {missing}"
    missing = sorted(
        o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)
    )
    assert not missing, f"{name}(1) does not mention: {missing}"


def test_fsd_toml_documents_every_key_of_the_example():
    text = page_text("fsd.toml")
    keys, section = [], None
    for line in (ROOT / "fsd.example.toml").read_text().splitlines():
        if m := re.match(r"\[(\w+)\]", line):
            section = m.group(1)
            assert f"[{section}]" in text
        elif section and (m := re.match(r"#?\s*(\w+)\s*=", line)):
            keys.append(m.group(1))
    missing = [k for k in keys if not re.search(rf"^\s+{k}\b", text, re.M)]
    assert keys and not missing, f"fsd.toml(5) lacks: {missing}"


def test_fsd_man_and_fsctl_man_print_the_pages_without_a_terminal():
    runner = CliRunner()
    out = runner.invoke(fsd_app, ["man"])
    assert out.exit_code == 0 and out.output.startswith("FSD(1)") and "SYNOPSIS" in out.output
    assert "\\f" not in out.output and "\\-" not in out.output  # no roff left
    out = runner.invoke(fsctl_app, ["man", "fsd.toml"])
    assert out.exit_code == 0 and "http_allow_remote" in out.output
    out = runner.invoke(fsctl_app, ["man"])
    assert out.exit_code == 0 and out.output.startswith("FSCTL(1)")
    raw = runner.invoke(fsd_app, ["man", "fsctl.1", "--raw"])
    assert raw.exit_code == 0 and raw.output.startswith('.\\"')
    bad = runner.invoke(fsd_app, ["man", "nonsense"])
    assert bad.exit_code == 2 and "no man page" in bad.output


def test_the_renderer_fills_text_and_handles_items():
    src = '.TH X 1\n.SH NAME\nx \\- does\n.B things\nwell\n.TP\n.BR \\-\\-flag ", " \\-o\nBody \\fIhere\\fR.\n'
    assert manual.to_text(src) == (
        "X(1)\n\n\nNAME\n       x - does things well\n\n       --flag, -o\n           Body here.\n"
    )


def test_pages_ship_with_the_package():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"fsd.manpages" = "man"' in pyproject and '"fsd.manpages"' in pyproject
    assert manual.man_dir() is not None and set(manual.available()) >= {"fsd", "fsctl", "fsd.toml"}


def test_fsd_toml_states_each_keys_default_as_the_code_has_it():
    from fsd import config
    from fsd.config import CacheConfig, ModelConfig, ParallelConfig, SchedConfig, ServerConfig

    raw = (ROOT / "man" / manual.PAGES["fsd.toml"]).read_text()
    section, stated = None, {}
    for line in raw.splitlines():
        if m := re.match(r"\.SH \[(\w+)\]", line):
            section = m.group(1)
        elif section and (m := re.match(r'\.BR (\w+) " = (.+)"$', line)):
            stated[section, m.group(1)] = m.group(2).replace("\\(dq", '"').replace("\\-", "-")
    slices = {
        "model": ModelConfig(),
        "cache": CacheConfig(),
        "sched": SchedConfig(),
        "parallel": ParallelConfig(),
        "server": ServerConfig(),
        "cluster": config.ClusterConfig(),
    }

    def toml(value: object) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return f'"{value}"' if isinstance(value, str) else repr(value)

    assert len(stated) > 20
    wrong = {
        f"[{sec}] {key}": (text, toml(getattr(slices[sec], key)))
        for (sec, key), text in stated.items()
        if text != toml(getattr(slices[sec], key))
    }
    assert not wrong, f"fsd.toml(5) defaults differ from the code (page, code): {wrong}"


def see_also(page: Path) -> list[str]:
    """The pages a page's SEE ALSO section cites, as file names ("fsctl.1")."""
    section = page.read_text().split(".SH SEE ALSO", 1)[1].split("\n.SH", 1)[0]
    return [
        f"{name.replace(chr(92) + '-', '-')}.{sec}"
        for name, sec in re.findall(r"^\.BR\s+(\S+)\s+\((\d)\)", section, re.M)
    ]


def test_every_see_also_cites_a_page_that_ships():
    shipped = sorted(p.name for p in (ROOT / "man").glob("*.[1-9]"))
    assert {"fsd.1", "fsctl.1", "fsd.toml.5", "fsd-scenario.5"} <= set(shipped)
    assert sorted(manual.PAGES.values()) == shipped  # `fsd man` shows every page
    for name in shipped:
        cited = see_also(ROOT / "man" / name)
        assert cited, f"{name} has no SEE ALSO"
        missing = [c for c in cited if c not in shipped]
        assert not missing, f"{name} cites pages that do not ship: {missing}"


def test_setup_links_the_pages_where_man_finds_them(tmp_path):
    """`man fsd` in an activated venv: man(1) derives VENV/share/man from VENV/bin on PATH."""
    import shutil
    import subprocess

    assert "scripts/install-man.sh" in (ROOT / "scripts" / "setup.sh").read_text()
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    subprocess.run(["bash", str(ROOT / "scripts" / "install-man.sh"), str(venv)], check=True)
    for name in manual.PAGES.values():
        installed = venv / "share" / "man" / f"man{name[-1]}" / name
        assert installed.read_text() == (ROOT / "man" / name).read_text()
    man = shutil.which("man")
    if man is None:  # the files are where man would look; man itself is not installed
        return
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "LANG": "C"}
    for page, file in (("fsd", "fsd.1"), ("fsctl", "fsctl.1"), ("fsd.toml", "fsd.toml.5")):
        found = subprocess.run([man, "-w", page], env=env, capture_output=True, text=True)
        assert found.returncode == 0, found.stderr
        assert Path(found.stdout.strip()).resolve() == (ROOT / "man" / file).resolve()


def test_fsctl_retune_lists_every_retunable_key():
    """Each config key by name; a policy's own settings (declared on its class, their
    help generated) by the POLICY.FIELD form, so a new policy edits no page."""
    from fsd.sched.retune import POLICY_SETTINGS, RETUNABLE

    text = page_text("fsctl").split("fsctl retune", 1)[1].split("fsctl inject", 1)[0]
    keys = [k for k in RETUNABLE if k not in POLICY_SETTINGS]
    missing = [k for k in keys if not re.search(rf"\b{k}\b", text)]
    assert not missing, f"fsctl(1)'s retune section lacks: {missing}"
    assert POLICY_SETTINGS and "POLICY.FIELD" in text


def test_fsd_toml_states_each_mlfq_rule_with_fsds_and_the_papers_value():
    """[sched.fsd]: every rule of fsd (fsd.sched.rules), with fsd's and sj-mlfq's values."""
    import dataclasses

    from fsd.sched.rules import FsdRules, PaperRules

    raw = (ROOT / "man" / manual.PAGES["fsd.toml"]).read_text()
    stated = {
        key: (fsd, paper)
        for key, fsd, paper in re.findall(
            r'^\.BR (\w+) " \(fsd (.+), sj\\-mlfq (.+)\)"$', raw, re.M
        )
    }

    def toml(value: object) -> str:
        if isinstance(value, bool):
            return str(value).lower()
        return "\\(dq" + value + "\\(dq" if isinstance(value, str) else repr(value)

    code = {
        f.name: (toml(getattr(FsdRules(), f.name)), toml(getattr(PaperRules(), f.name)))
        for f in dataclasses.fields(FsdRules)
    }
    assert stated == code
