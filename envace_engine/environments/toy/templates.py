"""Task templates for the ``toy`` suite: five per world, one or two user turns each.

A template draws a small world state, a request in plain words, the reference calls and, per
turn, the short answer (a number or a word) the agent's final answer must contain (``""`` when
the turn only changes state).
"""

from __future__ import annotations

import random

from envace_engine.environments.generated import Draft, Template, call

ITEMS = ("apples", "bolts", "cups", "gloves", "nails", "pens")
ACCOUNTS = ("ann", "bob", "cat", "dan")
TITLES = ("groceries", "gym", "ideas", "trip", "books", "work")
WORDS = ("milk", "run", "paint", "rome", "dune", "email", "bread", "swim", "tea")


def _draft(world: str, name: str, state: dict, turns: list[tuple[str, list, str]]) -> Draft:
    return Draft(
        template=f"{world}_{name}",
        user_turns=tuple(t for t, _, _ in turns),
        initial_state=state,
        calls=tuple(tuple(c) for _, c, _ in turns),
        meta={"world": world, "answers": [a for _, _, a in turns]},
    )


def _stock(rng: random.Random) -> tuple[dict, list[str]]:
    items = rng.sample(ITEMS, 3)
    return {"stock": {i: rng.randint(2, 9) for i in items}}, items


def wh_restock(rng: random.Random) -> Draft:
    """One call: add_stock."""
    state, items = _stock(rng)
    item, n = rng.choice(items), rng.randint(1, 5)
    return _draft(
        "warehouse",
        "restock",
        state,
        [(f"Add {n} {item}.", [call("add_stock", item=item, qty=n)], "")],
    )


def wh_ship_and_report(rng: random.Random) -> Draft:
    """remove_stock, answer the rest."""
    state, items = _stock(rng)
    item = rng.choice(items)
    n = rng.randint(1, state["stock"][item])
    left = str(state["stock"][item] - n)
    return _draft(
        "warehouse",
        "ship",
        state,
        [
            (
                f"Ship {n} {item} and tell me how many are left.",
                [call("remove_stock", item=item, qty=n)],
                left,
            )
        ],
    )


def wh_count(rng: random.Random) -> Draft:
    """check_stock, answer."""
    state, items = _stock(rng)
    item = rng.choice(items)
    return _draft(
        "warehouse",
        "count",
        state,
        [
            (
                f"How many {item} do we have?",
                [call("check_stock", item=item)],
                str(state["stock"][item]),
            )
        ],
    )


def wh_swap(rng: random.Random) -> Draft:
    """remove_stock, add_stock."""
    state, items = _stock(rng)
    out, into = rng.sample(items, 2)
    n = rng.randint(1, state["stock"][out])
    return _draft(
        "warehouse",
        "swap",
        state,
        [
            (
                f"Remove {n} {out} and add {n} {into}.",
                [call("remove_stock", item=out, qty=n), call("add_stock", item=into, qty=n)],
                "",
            )
        ],
    )


def wh_add_then_ask(rng: random.Random) -> Draft:
    """Two turns: add_stock; then check_stock and answer."""
    state, items = _stock(rng)
    item, n = rng.choice(items), rng.randint(1, 5)
    return _draft(
        "warehouse",
        "add_then_ask",
        state,
        [
            (f"Add {n} {item}.", [call("add_stock", item=item, qty=n)], ""),
            (
                f"How many {item} now?",
                [call("check_stock", item=item)],
                str(state["stock"][item] + n),
            ),
        ],
    )


def _ledger(rng: random.Random) -> tuple[dict, list[str]]:
    names = rng.sample(ACCOUNTS, 3)
    return {"balances": {n: rng.randint(5, 50) for n in names}}, names


def bank_deposit(rng: random.Random) -> Draft:
    """One call: deposit."""
    state, names = _ledger(rng)
    who, n = rng.choice(names), rng.randint(1, 20)
    return _draft(
        "bank",
        "deposit",
        state,
        [(f"Deposit ${n} to {who}.", [call("deposit", account=who, amount=n)], "")],
    )


def bank_withdraw_and_report(rng: random.Random) -> Draft:
    """withdraw, answer the new balance."""
    state, names = _ledger(rng)
    who = rng.choice(names)
    n = rng.randint(1, state["balances"][who])
    return _draft(
        "bank",
        "withdraw",
        state,
        [
            (
                f"Withdraw ${n} from {who} and tell me the new balance.",
                [call("withdraw", account=who, amount=n)],
                str(state["balances"][who] - n),
            )
        ],
    )


def bank_transfer(rng: random.Random) -> Draft:
    """One call: transfer."""
    state, names = _ledger(rng)
    src, dst = rng.sample(names, 2)
    n = rng.randint(1, state["balances"][src])
    return _draft(
        "bank",
        "transfer",
        state,
        [
            (
                f"Move ${n} from {src} to {dst}.",
                [call("transfer", source=src, target=dst, amount=n)],
                "",
            )
        ],
    )


def bank_balance(rng: random.Random) -> Draft:
    """get_balance, answer."""
    state, names = _ledger(rng)
    who = rng.choice(names)
    return _draft(
        "bank",
        "balance",
        state,
        [
            (
                f"What is {who}'s balance?",
                [call("get_balance", account=who)],
                str(state["balances"][who]),
            )
        ],
    )


def bank_transfer_then_ask(rng: random.Random) -> Draft:
    """Two turns: transfer; then get_balance and answer."""
    state, names = _ledger(rng)
    src, dst = rng.sample(names, 2)
    n = rng.randint(1, state["balances"][src])
    return _draft(
        "bank",
        "transfer_then_ask",
        state,
        [
            (
                f"Move ${n} from {src} to {dst}.",
                [call("transfer", source=src, target=dst, amount=n)],
                "",
            ),
            (
                f"What does {dst} have now?",
                [call("get_balance", account=dst)],
                str(state["balances"][dst] + n),
            ),
        ],
    )


def _notebook(rng: random.Random) -> tuple[dict, list[str]]:
    titles = rng.sample(TITLES, 3)
    return {"notes": {t: " ".join(rng.sample(WORDS, 2)) for t in titles}}, titles


def notes_write(rng: random.Random) -> Draft:
    """One call: write_note."""
    state, titles = _notebook(rng)
    title = rng.choice([t for t in TITLES if t not in titles])
    text = " ".join(rng.sample(WORDS, 2))
    return _draft(
        "notes",
        "write",
        state,
        [
            (
                f"Save a note '{title}' saying '{text}'.",
                [call("write_note", title=title, text=text)],
                "",
            )
        ],
    )


def notes_read(rng: random.Random) -> Draft:
    """read_note, answer its first word."""
    state, titles = _notebook(rng)
    title = rng.choice(titles)
    return _draft(
        "notes",
        "read",
        state,
        [
            (
                f"What is the first word of my '{title}' note?",
                [call("read_note", title=title)],
                state["notes"][title].split()[0],
            )
        ],
    )


def notes_delete(rng: random.Random) -> Draft:
    """One call: delete_note."""
    state, titles = _notebook(rng)
    title = rng.choice(titles)
    return _draft(
        "notes",
        "delete",
        state,
        [(f"Delete the '{title}' note.", [call("delete_note", title=title)], "")],
    )


def notes_rename(rng: random.Random) -> Draft:
    """read_note, write_note, delete_note."""
    state, titles = _notebook(rng)
    old = rng.choice(titles)
    new = rng.choice([t for t in TITLES if t not in titles])
    return _draft(
        "notes",
        "rename",
        state,
        [
            (
                f"Rename the note '{old}' to '{new}'.",
                [
                    call("read_note", title=old),
                    call("write_note", title=new, text=state["notes"][old]),
                    call("delete_note", title=old),
                ],
                "",
            )
        ],
    )


def notes_write_then_list(rng: random.Random) -> Draft:
    """Two turns: write_note; then list_notes and answer the count."""
    state, titles = _notebook(rng)
    title = rng.choice([t for t in TITLES if t not in titles])
    text = " ".join(rng.sample(WORDS, 2))
    return _draft(
        "notes",
        "write_then_list",
        state,
        [
            (
                f"Save a note '{title}' saying '{text}'.",
                [call("write_note", title=title, text=text)],
                "",
            ),
            ("How many notes do I have now?", [call("list_notes")], str(len(titles) + 1)),
        ],
    )


TEMPLATES: tuple[Template, ...] = (
    wh_restock,
    wh_ship_and_report,
    wh_count,
    wh_swap,
    wh_add_then_ask,
    bank_deposit,
    bank_withdraw_and_report,
    bank_transfer,
    bank_balance,
    bank_transfer_then_ask,
    notes_write,
    notes_read,
    notes_delete,
    notes_rename,
    notes_write_then_list,
)
