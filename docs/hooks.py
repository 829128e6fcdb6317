"""MkDocs hook: the reference pages are generated from the code, so they cannot drift from it.

``<!-- diloco:config-keys -->`` becomes the table of every :class:`~diloco.train.config.TrainConfig`
key (from :func:`diloco.train.config.reference`, the source ``diloco train --help`` reads too);
``<!-- diloco:cli -->`` becomes the ``--help`` of every ``diloco`` command.
"""

from __future__ import annotations

import contextlib
import io

CONFIG_MARK = "<!-- diloco:config-keys -->"
CLI_MARK = "<!-- diloco:cli -->"


def config_keys_markdown() -> str:
    from diloco.train.config import reference

    out, section = [], None
    for f in reference():
        if f.section != section:
            section = f.section
            out += [
                "",
                f"### {section[0].upper()}{section[1:]}",
                "",
                "| key | type | default | meaning |",
                "|---|---|---|---|",
            ]
        default = ",".join(f.default) if isinstance(f.default, list) else f.default
        default = "(empty)" if default == "" else str(default).lower() if isinstance(default, bool) else default
        doc = f.doc.replace("|", "\\|")
        typ = f.type.replace("tuple[str, ...]", "list of str")
        if f.choices:
            typ = "one of " + ", ".join(f"`{c}`" for c in f.choices)
        out.append(f"| `{f.name}` | {typ} | `{default}` | {doc} |")
    return "\n".join(out)


def cli_markdown() -> str:
    from diloco.cli import COMMANDS, _top_parser, build_parser

    def help_of(parser) -> str:
        with contextlib.redirect_stdout(io.StringIO()) as buf:
            parser.print_help()
        return buf.getvalue().rstrip()

    out = ["## diloco", "", "```text", help_of(_top_parser()), "```"]
    for name in COMMANDS:
        sub = build_parser(name)._subparsers._group_actions[0].choices[name]
        out += ["", f"## diloco {name}", "", "```text", help_of(sub), "```"]
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files) -> str:
    if CONFIG_MARK in markdown:
        markdown = markdown.replace(CONFIG_MARK, config_keys_markdown())
    if CLI_MARK in markdown:
        markdown = markdown.replace(CLI_MARK, cli_markdown())
    return markdown
