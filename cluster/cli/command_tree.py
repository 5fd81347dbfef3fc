"""The command line's parser classes. argparse keeps a parser's subcommands and options
only in private attributes; these keep them in public ones too, for shell completion
(cluster/cli/completion.py) and for the tests that walk every command."""

from __future__ import annotations

import argparse
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """A user mistake is one line on stderr (and exit status 2), never a usage screen.
    `commands` holds the subcommands added through `Commands`, `options` every option
    and argument added to it (`Exclusive` ones too, and --help)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.commands: dict[str, Parser] = {}
        self.options: list[argparse.Action] = []  # before argparse's own init adds --help
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.options.append(action)
        return action


class Commands:
    """The subcommands of `parser` (argparse's `add_subparsers`): each added one is a
    `Parser`, kept in `parser.commands`."""

    def __init__(self, parser: Parser, **kwargs: Any) -> None:
        self.parser = parser
        self._subparsers = parser.add_subparsers(**kwargs)

    def add_parser(self, name: str, **kwargs: Any) -> Parser:
        child = self._subparsers.add_parser(name, **kwargs)
        assert isinstance(child, Parser)  # argparse makes a child of its parent's class
        self.parser.commands[name] = child
        return child


class Exclusive:
    """Options of `parser` of which at most one may be given (argparse's mutually
    exclusive group), kept in `parser.options`."""

    def __init__(self, parser: Parser, *, required: bool = False) -> None:
        self.parser = parser
        self._group = parser.add_mutually_exclusive_group(required=required)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = self._group.add_argument(*args, **kwargs)
        self.parser.options.append(action)
        return action
