"""`shardlimit completion bash|zsh`: a shell completion script for the commands and
options of the parser."""

from __future__ import annotations

import argparse
import json
import sys

from cluster.cli.command_tree import Parser
from cluster.cli.parser import build_parser

COMPLETION_HELP = """usage: shardlimit completion [--json] {bash,zsh}

Print a completion script for shardlimit's commands and options.

  bash: eval "$(shardlimit completion bash)"   (e.g. in ~/.bashrc)
  zsh:  eval "$(shardlimit completion zsh)"    (e.g. in ~/.zshrc)

options:
  -h, --help  show this help message and exit
  --json      {"shell": ..., "script": ...} on one line, for an installer
"""


def cmd_completion(argv: list[str]) -> int:
    """`shardlimit completion bash|zsh [--json]`: a completion script for commands and
    options; with --json, {"shell": ..., "script": ...} for a script that installs it."""
    if "-h" in argv or "--help" in argv:
        print(COMPLETION_HELP, end="")
        return 0
    as_json = "--json" in argv
    words = [a for a in argv if a != "--json"]
    shell = words[0] if words else "bash"
    if shell not in ("bash", "zsh") or len(words) > 1:
        print(
            f"shardlimit: error: completion takes bash or zsh, not {' '.join(words)!r}",
            file=sys.stderr,
        )
        return 2
    script = completion_script(build_parser(), shell)
    if as_json:
        print(json.dumps({"shell": shell, "script": script}))
    else:
        print(script, end="")
    return 0


def _options(parser: Parser) -> list[str]:
    shown = (a for a in parser.options if a.help != argparse.SUPPRESS)
    return sorted(o for a in shown for o in a.option_strings if o.startswith("--"))


def _choices(parser: Parser) -> list[str]:
    """The words a positional argument of `parser` takes (`reshard plan|apply|...`)."""
    positional = (a for a in parser.options if not a.option_strings and a.choices)
    return [str(choice) for action in positional for choice in action.choices or ()]


def completion_script(parser: Parser, shell: str) -> str:
    """Words per command path ("", "serve", "serve router", "reshard plan", ...),
    completed by position."""
    table: dict[str, list[str]] = {}

    def walk(path: str, node: Parser) -> None:
        choices = _choices(node)
        table[path] = sorted(node.commands) + choices + _options(node)
        for choice in choices:  # after `reshard plan`: reshard's options
            table[f"{path} {choice}"] = _options(node)
        for name, child in node.commands.items():
            walk(f"{path} {name}".strip(), child)

    walk("", parser)
    table["completion"] = ["--json", "bash", "zsh"]
    cases = "\n".join(
        f'        "{path}") words="{" ".join(words)}" ;;' for path, words in sorted(table.items())
    )
    script = f"""# shardlimit {shell} completion: eval "$(shardlimit completion {shell})"
_shardlimit() {{
    local cur path="" i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in -*) break ;; esac
        path="${{path:+$path }}${{COMP_WORDS[i]}}"
    done
    local words=""
    case "$path" in
{cases}
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
}}
"""
    if shell == "zsh":
        script += "autoload -U +X bashcompinit && bashcompinit\n"
    return script + "complete -o default -F _shardlimit shardlimit\n"
