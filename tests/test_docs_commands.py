"""Every `cellar ...` command line the README and docs/*.md show parses: its subcommand and
flags exist (a guard, so a renamed flag cannot leave the docs behind), and every repository path
the README names in backticks exists."""

from __future__ import annotations

import pathlib
import re
import shlex

import pytest

from cellar.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for block in re.findall(r"```sh\n(.*?)```", doc.read_text(encoding="utf-8"), re.S):
            for raw in block.replace("\\\n", " ").splitlines():
                line = raw.split("#", 1)[0].strip()
                if line.startswith(".venv/bin/cellar "):
                    found.append((doc.name, line.removeprefix(".venv/bin/cellar ")))
    return found


@pytest.mark.parametrize(("doc", "line"), documented_commands())
def test_a_documented_command_line_parses(doc: str, line: str) -> None:
    args, unknown = build_parser().parse_known_args(shlex.split(line))
    assert unknown == [], f"{doc}: `cellar {line}`: unknown {unknown}"
    assert callable(args.handler)


def test_the_docs_show_command_lines() -> None:
    assert len(documented_commands()) >= 20


def test_the_paths_the_readme_names_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`((?:consensus|statemachine|agent|jepsen|cellar|tests|docs|examples)"
                           r"/[A-Za-z0-9_./-]*)`", text))
    assert named
    assert sorted(path for path in named if not (ROOT / path).exists()) == []
