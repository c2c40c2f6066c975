"""Suite ``toy-library``: one library whose catalogue every task shares, so a world role can learn
it.

The toy worlds draw a new small state per task and write it into the agent's prompt; here the
database is the same for every task (as τ²'s is): sixteen books with their author, year and
number of copies, and no loans at the start. The agent is *not* told the catalogue: it must use
the tools. A world role can know the catalogue three ways — from the reference results in
grounded training prompts, from the environment's own description of its state
(``rollout.world_state``: ``TaskKey.WORLD_STATE`` holds the whole catalogue), or by having
learned it across tasks — which makes this the testbed where rehearsal fidelity can be learned
and measured on held-out tasks that ask about the same books differently.

Tools: ``find_book`` (author, year, copies available), ``books_by`` (an author's titles),
``borrow`` (refused when no copy is left), ``return_book`` (refused for a book the member does
not hold). Reward: as ``toy`` (``ToySuite.score``): state credit and expected answers.
"""

from __future__ import annotations

import copy
import random
from typing import Any

from envace_engine.environments.generated import Draft, call
from envace_engine.environments.schema import openai_tool
from envace_engine.environments.tool_environment import ToolEnvironment
from envace_engine.environments.toy.suite import ToySuite
from envace_engine.types import Task

# title -> (author, year, copies): fictional, so no pretrained model knows them
CATALOGUE: dict[str, tuple[str, int, int]] = {
    "amber road": ("ines vale", 1984, 2),
    "blue hour": ("ines vale", 1991, 1),
    "cold harbor": ("omar reyes", 1977, 3),
    "dry season": ("omar reyes", 2003, 1),
    "east window": ("omar reyes", 2011, 2),
    "far fields": ("lena ortiz", 1969, 1),
    "glass garden": ("lena ortiz", 1995, 3),
    "high tide": ("tom becker", 2008, 2),
    "iron bridge": ("tom becker", 1988, 1),
    "jade river": ("tom becker", 2015, 2),
    "kite season": ("tom becker", 1999, 3),
    "long night": ("mira chen", 1973, 2),
    "moss house": ("mira chen", 2020, 1),
    "north star": ("sam patel", 1981, 2),
    "open sea": ("sam patel", 1994, 1),
    "paper moon": ("sam patel", 2006, 3),
}
MEMBERS = ("ann", "bob", "cat", "dan", "eve", "fay")
_STR = {"type": "string"}


def _tool(name: str, description: str, **params: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": params, "required": list(params)}
    return openai_tool(name, description, schema)


def initial_state() -> dict[str, Any]:
    """The one database every task starts from: the catalogue, and no loans."""
    books = {t: {"author": a, "year": y, "copies": c} for t, (a, y, c) in CATALOGUE.items()}
    return {"books": books, "loans": {}}


class Library:
    """The catalogue and who holds which book."""

    TOOLS = (
        _tool("find_book", "Author, year and copies available of one book.", title=_STR),
        _tool("books_by", "Titles by one author.", author=_STR),
        _tool("borrow", "Lend a book to a member.", title=_STR, member=_STR),
        _tool("return_book", "Take a book back from a member.", title=_STR, member=_STR),
    )

    def __init__(self, state: dict[str, Any]) -> None:
        """Load ``{"books": {title: {author, year, copies}}, "loans": {title: [members]}}``."""
        self.books: dict[str, dict[str, Any]] = copy.deepcopy(state["books"])
        self.loans: dict[str, list[str]] = copy.deepcopy(state["loans"])

    def _available(self, title: str) -> int:
        return int(self.books[title]["copies"]) - len(self.loans.get(title, []))

    def find_book(self, title: str) -> dict[str, Any]:
        """One book's record and how many copies are on the shelf."""
        if title not in self.books:
            return {"error": f"no book titled {title}"}
        book = self.books[title]
        return {
            "title": title,
            "author": book["author"],
            "year": book["year"],
            "available": self._available(title),
        }

    def books_by(self, author: str) -> dict[str, Any]:
        """An author's titles, sorted (none for an author the library does not hold)."""
        titles = sorted(t for t, b in self.books.items() if b["author"] == author)
        return {"author": author, "titles": titles}

    def borrow(self, title: str, member: str) -> dict[str, Any]:
        """Lend one copy; refused for an unknown book or when none is on the shelf."""
        if title not in self.books:
            return {"error": f"no book titled {title}"}
        if self._available(title) < 1:
            return {"error": f"no copy of {title} available"}
        self.loans.setdefault(title, []).append(member)
        return {"title": title, "member": member, "available": self._available(title)}

    def return_book(self, title: str, member: str) -> dict[str, Any]:
        """Take back a copy the member holds."""
        if member not in self.loans.get(title, []):
            return {"error": f"{member} does not hold {title}"}
        self.loans[title].remove(member)
        return {"title": title, "member": member, "available": self._available(title)}


def describe_library(state: dict[str, Any]) -> str:
    """The whole database in the environment's own words (``TaskKey.WORLD_STATE``)."""
    books = "; ".join(
        f"{t!r} by {b['author']}, {b['year']}, {b['copies']} copies"
        for t, b in sorted(state["books"].items())
    )
    loans = "; ".join(f"{t!r}: {', '.join(m)}" for t, m in sorted(state["loans"].items()) if m)
    return f"Catalogue: {books}. Loans: {loans or 'none'}."


def _draft(name: str, turns: list[tuple[str, list, str]]) -> Draft:
    return Draft(
        template=f"library_{name}",
        user_turns=tuple(t for t, _, _ in turns),
        initial_state=initial_state(),
        calls=tuple(tuple(c) for _, c, _ in turns),
        meta={"world": "library", "answers": [a for _, _, a in turns]},
    )


def year_of(rng: random.Random) -> Draft:
    """find_book, answer the year."""
    title = rng.choice(sorted(CATALOGUE))
    ask = f"When was {title!r} published?"
    return _draft("year", [(ask, [call("find_book", title=title)], str(CATALOGUE[title][1]))])


def author_of(rng: random.Random) -> Draft:
    """find_book, answer the author's surname."""
    title = rng.choice(sorted(CATALOGUE))
    surname = CATALOGUE[title][0].split()[-1]
    return _draft("author", [(f"Who wrote {title!r}?", [call("find_book", title=title)], surname)])


def count_by(rng: random.Random) -> Draft:
    """books_by, answer how many."""
    author = rng.choice(sorted({a for a, _, _ in CATALOGUE.values()}))
    n = sum(a == author for a, _, _ in CATALOGUE.values())
    ask = f"How many books by {author} do we have?"
    return _draft("count", [(ask, [call("books_by", author=author)], str(n))])


def older_of(rng: random.Random) -> Draft:
    """Two find_book calls, answer the older title."""
    a, b = rng.sample(sorted(CATALOGUE), 2)
    older = a if CATALOGUE[a][1] < CATALOGUE[b][1] else b
    ask = f"Which is older, {a!r} or {b!r}?"
    calls = [call("find_book", title=a), call("find_book", title=b)]
    return _draft("older", [(ask, calls, older)])


def lend(rng: random.Random) -> Draft:
    """borrow; no answer."""
    title, member = rng.choice(sorted(CATALOGUE)), rng.choice(MEMBERS)
    ask = f"Lend {title!r} to {member}."
    return _draft("lend", [(ask, [call("borrow", title=title, member=member)], "")])


def lend_then_left(rng: random.Random) -> Draft:
    """Two turns: borrow; then find_book and answer the copies left."""
    title, member = rng.choice(sorted(CATALOGUE)), rng.choice(MEMBERS)
    left = str(CATALOGUE[title][2] - 1)
    return _draft(
        "lend_then_left",
        [
            (f"Lend {title!r} to {member}.", [call("borrow", title=title, member=member)], ""),
            (f"How many copies of {title!r} are left?", [call("find_book", title=title)], left),
        ],
    )


TEMPLATES = (year_of, author_of, count_by, older_of, lend, lend_then_left)


class LibrarySuite(ToySuite):
    """``toy-library``: ``train`` (512) and ``validation`` (64) splits of the shared library."""

    name = "toy-library"
    templates = TEMPLATES
    system = "You help at a library. Use the tools, then answer briefly."

    def tools_for(self, draft: Draft) -> list[dict[str, Any]]:
        """The library's four tools."""
        return list(Library.TOOLS)

    def context(self, draft: Draft) -> str:
        """The agent is told nothing of the catalogue: it must use the tools."""
        return self.system

    def world_state(self, draft: Draft) -> str:
        """The whole catalogue and the loans."""
        return describe_library(draft.initial_state)

    def make_env(self, task: Task) -> ToolEnvironment:
        """A fresh library at the shared starting state."""
        owners = {t["function"]["name"]: "library" for t in Library.TOOLS}
        return ToolEnvironment(
            task,
            {"library": Library(task.initial_state)},
            list(task.tools),
            owners,
            snapshot=lambda instances: dict(vars(instances["library"])),
        )
