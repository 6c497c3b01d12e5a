"""One help style for every command and subcommand, checked by walking the parser itself (a
new command that breaks it fails here): the same word for a command slot, a help line for the
listing and a description for its own page, options worded alike, `--as` defaulting to
$AWL_ACTOR, and `-h` working everywhere."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from awl.cli import main
from awl.cli._main import build_parser


def commands(parser: argparse.ArgumentParser | None = None,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser,
                                                     str | None]]:
    """Every command as (its words, its parser, its line in its group's listing)."""
    parser = parser or build_parser()
    if not path:
        yield path, parser, None
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            lines = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), sub, lines.get(name)
                yield from commands(sub, (*path, name))


def groups() -> Iterator[tuple[tuple[str, ...],
                              argparse._SubParsersAction[argparse.ArgumentParser]]]:
    for path, parser, _ in commands():
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                yield path, action


COMMANDS = [path for path, _, _ in commands() if path]


def test_every_command_slot_is_called_command() -> None:
    """It was COMMAND in some groups and SUBCOMMAND in others."""
    assert {" ".join(path) or "awl": group.metavar for path, group in groups()
            if group.metavar != "COMMAND"} == {}


def test_every_command_has_a_listing_line_and_a_page_of_its_own() -> None:
    """The line (in its group's list) starts lower-case with no full stop; the description
    (its own -h page) is sentences: about 20 commands had none, so their -h said nothing."""
    bad = []
    for path, parser, line in commands():
        if not path:
            continue
        name = " ".join(path)
        if not line or line[0].isupper() or line.endswith("."):
            bad.append(f"{name}: listing line {line!r}")
        description = parser.description or ""
        if not description or not description[0].isupper() or not description.endswith("."):
            bad.append(f"{name}: description {description[:40]!r}")
    assert bad == []


def test_every_option_is_explained_alike() -> None:
    """Each option has a help text starting lower-case with no full stop; every --json says
    "... as JSON instead of text" (it was "print JSON", "print JSON for scripts", "print the
    results as JSON"); every --as names its default, $AWL_ACTOR (effects settle and retry
    ignored it)."""
    bad = []
    for path, parser, _ in commands():
        name = " ".join(("awl", *path))
        for action in parser._actions:
            if not action.option_strings or action.help == argparse.SUPPRESS:
                continue
            flag = action.option_strings[-1]
            text = action.help or ""
            if flag in ("-h", "--help", "--version"):
                continue
            if not text or text[0].isupper() or text.endswith("."):
                bad.append(f"{name} {flag}: {text[:50]!r}")
            if flag == "--json" and not text.endswith(" as JSON instead of text"):
                bad.append(f"{name} --json: {text!r}")
            if flag == "--as" and "$AWL_ACTOR" not in text:
                bad.append(f"{name} --as: {text!r} does not name $AWL_ACTOR")
    assert bad == []


@pytest.mark.parametrize("words", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_help_works_for_every_command(words: tuple[str, ...],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([*words, "-h"])
    out, err = capsys.readouterr()
    assert done.value.code == 0 and err == ""
    assert out.startswith(f"usage: awl {' '.join(words)}")
