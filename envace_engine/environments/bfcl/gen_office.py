"""``bfcl-gen`` templates over the office backends: GorillaFileSystem and TicketAPI.

Every template draws a small random world for one class, a goal in plain words and the calls
that reach it (>= 2 per task; the ``*_then_*`` templates have two user turns). Names and texts
come from our own vocabularies, so no generated task repeats a BFCL entry.
"""

from __future__ import annotations

import random
from typing import Any

from envace_engine.environments.generated import Draft, call

USERS = ("alex", "sam", "lee", "maya", "omar", "nina", "ivan", "zoe")
DIRS = ("docs", "notes", "logs", "src", "data", "drafts", "photos", "music")
STEMS = ("report", "todo", "summary", "draft", "plan", "log", "ideas", "budget", "recipe")
EXTS = (".txt", ".md", ".csv")
WORDS = ("alpha", "beta", "gamma", "delta", "lemon", "river", "stone", "cloud", "amber", "coral")
TITLES = ("Printer jam", "VPN down", "Laptop slow", "Email bounce", "Screen flicker", "No wifi")
SYMBOLS = ("AAPL", "GOOG", "TSLA", "MSFT", "NVDA", "AMZN", "META", "NFLX")
PEOPLE = ("Alice", "Bob", "Carla", "Dev", "Elena", "Farid", "Grace", "Hugo")


def bfcl_meta(cls: str) -> dict[str, Any]:
    """``Task.meta`` for a one-class generated task."""
    return {"involved_classes": [cls], "excluded_function": [], "missed_function": {}}


def _lines(rng: random.Random) -> list[str]:
    return [" ".join(rng.sample(WORDS, 3)) for _ in range(rng.randint(2, 5))]


def _tree(rng: random.Random) -> tuple[dict[str, Any], dict[str, dict[str, list[str]]]]:
    """A root folder with 2-3 sub-folders of 2-3 small text files each."""
    tree: dict[str, dict[str, list[str]]] = {}
    for folder in rng.sample(DIRS, rng.randint(2, 3)):
        names = [s + rng.choice(EXTS) for s in rng.sample(STEMS, rng.randint(2, 3))]
        tree[folder] = {name: _lines(rng) for name in names}
    contents = {
        folder: {
            "type": "directory",
            "contents": {f: {"type": "file", "content": "\n".join(t)} for f, t in files.items()},
        }
        for folder, files in tree.items()
    }
    root = {rng.choice(USERS): {"type": "directory", "contents": contents}}
    return {"GorillaFileSystem": {"root": root}}, tree


def _pick(rng: random.Random, tree: dict[str, dict[str, list[str]]]) -> tuple[str, str, str]:
    folder = rng.choice(sorted(tree))
    first, second = rng.sample(sorted(tree[folder]), 2)
    return folder, first, second


def fresh(rng: random.Random, taken: Any, pool: tuple[str, ...], ext: str = "") -> str:
    """A name from ``pool`` (plus ``ext``) not in ``taken``."""
    return rng.choice([p + ext for p in pool if p + ext not in taken])


def draft(name: str, cls: str, state: dict[str, Any], turns: list[tuple[str, list]]) -> Draft:
    """A one-class ``Draft`` from (user text, reference calls) pairs."""
    return Draft(
        template=name,
        user_turns=tuple(text for text, _ in turns),
        initial_state=state,
        calls=tuple(tuple(calls) for _, calls in turns),
        meta=bfcl_meta(cls),
    )


# --- GorillaFileSystem -------------------------------------------------------------------


def fs_move_into_new_folder(rng: random.Random) -> Draft:
    """cd, mkdir, mv."""
    state, tree = _tree(rng)
    folder, file, _ = _pick(rng, tree)
    new = fresh(rng, tree[folder], ("archive", "old", "backup", "keep"))
    text = f"Go into '{folder}', create a folder '{new}' there and move '{file}' into it."
    calls = [call("cd", folder=folder), call("mkdir", dir_name=new)]
    calls.append(call("mv", source=file, destination=new))
    return draft("fs_move_into_new_folder", "GorillaFileSystem", state, [(text, calls)])


def fs_write_new_file(rng: random.Random) -> Draft:
    """cd, touch, echo."""
    state, tree = _tree(rng)
    folder = rng.choice(sorted(tree))
    name = fresh(rng, tree[folder], STEMS, ".txt")
    words = " ".join(rng.sample(WORDS, 2))
    text = f"In '{folder}', create a file '{name}' and write '{words}' into it."
    calls = [call("cd", folder=folder), call("touch", file_name=name)]
    calls.append(call("echo", content=words, file_name=name))
    return draft("fs_write_new_file", "GorillaFileSystem", state, [(text, calls)])


def fs_copy_file(rng: random.Random) -> Draft:
    """cd, cp, ls."""
    state, tree = _tree(rng)
    folder, file, _ = _pick(rng, tree)
    name = fresh(rng, tree[folder], STEMS, "_copy.txt")
    text = f"Copy '{file}' in '{folder}' to '{name}' in the same folder, then list the folder."
    calls = [call("cd", folder=folder), call("cp", source=file, destination=name), call("ls")]
    return draft("fs_copy_file", "GorillaFileSystem", state, [(text, calls)])


def fs_count_then_delete(rng: random.Random) -> Draft:
    """Two turns: cd, wc; then rm."""
    state, tree = _tree(rng)
    folder, file, other = _pick(rng, tree)
    turns = [
        (
            f"Open '{folder}' and count the lines of '{file}'.",
            [call("cd", folder=folder), call("wc", file_name=file, mode="l")],
        ),
        (f"Now delete '{other}' from that folder.", [call("rm", file_name=other)]),
    ]
    return draft("fs_count_then_delete", "GorillaFileSystem", state, turns)


def fs_grep_then_tail(rng: random.Random) -> Draft:
    """Two turns: cd, grep; then tail."""
    state, tree = _tree(rng)
    folder, file, _ = _pick(rng, tree)
    word = rng.choice(rng.choice(tree[folder][file]).split())
    lines = rng.randint(1, 2)
    turns = [
        (
            f"In '{folder}', search '{file}' for the word '{word}'.",
            [call("cd", folder=folder), call("grep", file_name=file, pattern=word)],
        ),
        (
            f"Show me the last {lines} line(s) of that file.",
            [call("tail", file_name=file, lines=lines)],
        ),
    ]
    return draft("fs_grep_then_tail", "GorillaFileSystem", state, turns)


def fs_sort_in_other_folder(rng: random.Random) -> Draft:
    """cd, ls, cd .., cd, sort."""
    state, tree = _tree(rng)
    first, second = rng.sample(sorted(tree), 2)
    file = rng.choice(sorted(tree[second]))
    text = f"List what is in '{first}', then go to '{second}' and sort the lines of '{file}'."
    calls = [
        call("cd", folder=first),
        call("ls"),
        call("cd", folder=".."),
        call("cd", folder=second),
        call("sort", file_name=file),
    ]
    return draft("fs_sort_in_other_folder", "GorillaFileSystem", state, [(text, calls)])


# --- TicketAPI ----------------------------------------------------------------------------


def _tickets(rng: random.Random, user: str | None) -> tuple[dict[str, Any], list[dict]]:
    start = rng.randint(1, 9) * 100
    queue = []
    for i, title in enumerate(rng.sample(TITLES, 3)):
        owner = user if i < 2 else rng.choice(USERS)
        queue.append(
            {
                "id": start + i,
                "title": title,
                "description": f"{title} since today",
                "status": "Open",
                "priority": rng.randint(1, 5),
                "created_by": owner,
            }
        )
    cfg = {"ticket_queue": queue, "ticket_counter": start + 3, "current_user": user}
    return {"TicketAPI": cfg}, queue


def ticket_login_and_create(rng: random.Random) -> Draft:
    """ticket_login, create_ticket."""
    user = rng.choice(USERS)
    state, queue = _tickets(rng, None)
    title = fresh(rng, {t["title"] for t in queue}, TITLES)
    prio = rng.randint(1, 5)
    text = (
        f"Log in to the ticket system as '{user}' with password '{user}123' and open a "
        f"ticket titled '{title}' with priority {prio}."
    )
    calls = [
        call("ticket_login", username=user, password=f"{user}123"),
        call("create_ticket", title=title, priority=prio),
    ]
    return draft("ticket_login_and_create", "TicketAPI", state, [(text, calls)])


def ticket_check_and_close(rng: random.Random) -> Draft:
    """get_ticket, close_ticket."""
    state, queue = _tickets(rng, rng.choice(USERS))
    ticket = rng.choice(queue)
    text = f"Show me ticket {ticket['id']}, then close it."
    calls = [
        call("get_ticket", ticket_id=ticket["id"]),
        call("close_ticket", ticket_id=ticket["id"]),
    ]
    return draft("ticket_check_and_close", "TicketAPI", state, [(text, calls)])


def ticket_resolve_then_edit(rng: random.Random) -> Draft:
    """Two turns: resolve_ticket; then get_ticket, edit_ticket."""
    state, queue = _tickets(rng, rng.choice(USERS))
    first, second = rng.sample(queue, 2)
    note = f"Fixed by {rng.choice(('restart', 'update', 'cable swap', 'reset'))}"
    prio = rng.randint(1, 5)
    turns = [
        (
            f"Resolve ticket {first['id']} with the note '{note}'.",
            [call("resolve_ticket", ticket_id=first["id"], resolution=note)],
        ),
        (
            f"Look up ticket {second['id']} and set its priority to {prio}.",
            [
                call("get_ticket", ticket_id=second["id"]),
                call("edit_ticket", ticket_id=second["id"], updates={"priority": prio}),
            ],
        ),
    ]
    return draft("ticket_resolve_then_edit", "TicketAPI", state, turns)


def ticket_create_then_describe(rng: random.Random) -> Draft:
    """Two turns: create_ticket; then edit_ticket on the new id."""
    state, queue = _tickets(rng, rng.choice(USERS))
    title = fresh(rng, {t["title"] for t in queue}, TITLES)
    new_id = state["TicketAPI"]["ticket_counter"]
    desc = f"Started after the {rng.choice(WORDS)} update"
    turns = [
        (
            f"Open a ticket titled '{title}' with priority 2.",
            [call("create_ticket", title=title, priority=2)],
        ),
        (
            f"Add the description '{desc}' to that new ticket, then show it to me.",
            [
                call("edit_ticket", ticket_id=new_id, updates={"description": desc}),
                call("get_ticket", ticket_id=new_id),
            ],
        ),
    ]
    return draft("ticket_create_then_describe", "TicketAPI", state, turns)


def ticket_list_and_close(rng: random.Random) -> Draft:
    """get_user_tickets, close_ticket."""
    state, queue = _tickets(rng, rng.choice(USERS))
    ticket = rng.choice(queue[:2])
    text = f"List my open tickets and close the one titled '{ticket['title']}'."
    calls = [call("get_user_tickets", status="Open"), call("close_ticket", ticket_id=ticket["id"])]
    return draft("ticket_list_and_close", "TicketAPI", state, [(text, calls)])
