"""``bfcl-gen`` templates over the account backends: TradingBot and MessageAPI.

Same shape as ``bfcl_gen_office``: a small random world for one class, a goal, >= 2 reference
calls, and two user turns for the ``*_then_*`` templates.
"""

from __future__ import annotations

import random
from typing import Any

from envace_engine.environments.bfcl.gen_office import PEOPLE, SYMBOLS, USERS, WORDS, draft
from envace_engine.environments.generated import Draft, call


def _market(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any]]:
    """4-5 stocks with small prices, a funded account, an open market and one open order."""
    stocks = {}
    for sym in rng.sample(SYMBOLS, rng.randint(4, 5)):
        price = float(rng.randint(20, 300))
        stocks[sym] = {
            "price": price,
            "percent_change": round(rng.uniform(-2, 2), 2),
            "volume": round(rng.uniform(0.5, 4), 3),
            "MA(5)": price,
            "MA(20)": price,
        }
    syms = sorted(stocks)
    order_id = rng.randint(10, 90) * 100
    cfg = {
        "stocks": stocks,
        "account_info": {
            "account_id": rng.randint(10000, 99999),
            "balance": float(rng.randint(20, 80) * 100),
            "binding_card": rng.randint(10**15, 10**16 - 1),
        },
        "authenticated": False,
        "market_status": "Open",
        "orders": {
            str(order_id): {
                "id": order_id,
                "order_type": "Buy",
                "symbol": syms[0],
                "price": stocks[syms[0]]["price"],
                "amount": 5,
                "status": "Open",
            }
        },
        "order_counter": order_id + 1,
        "watch_list": syms[:2],
        "transaction_history": [],
    }
    return {"TradingBot": cfg}, cfg


def _login(user: str) -> Any:
    return call("trading_login", username=user, password=f"{user}-pw")


def trade_look_and_buy(rng: random.Random) -> Draft:
    """trading_login, get_stock_info, place_order."""
    state, cfg = _market(rng)
    user, sym, amount = rng.choice(USERS), rng.choice(sorted(cfg["stocks"])), rng.randint(1, 5)
    price = cfg["stocks"][sym]["price"]
    text = (
        f"Log in to trading as '{user}' (password '{user}-pw'), check {sym}'s price and "
        f"buy {amount} shares of it at that price."
    )
    calls = [
        _login(user),
        call("get_stock_info", symbol=sym),
        call("place_order", order_type="Buy", symbol=sym, price=price, amount=amount),
    ]
    return draft("trade_look_and_buy", "TradingBot", state, [(text, calls)])


def trade_fund_account(rng: random.Random) -> Draft:
    """trading_login, fund_account, get_account_info."""
    state, _ = _market(rng)
    user, amount = rng.choice(USERS), float(rng.randint(1, 9) * 100)
    text = (
        f"Log in to trading as '{user}' (password '{user}-pw'), add ${amount:.0f} to my "
        "account and show me the account afterwards."
    )
    calls = [_login(user), call("fund_account", amount=amount), call("get_account_info")]
    return draft("trade_fund_account", "TradingBot", state, [(text, calls)])


def trade_swap_watchlist(rng: random.Random) -> Draft:
    """trading_login, remove_stock_from_watchlist, add_to_watchlist."""
    state, cfg = _market(rng)
    user = rng.choice(USERS)
    old = rng.choice(cfg["watch_list"])
    new = rng.choice([s for s in sorted(cfg["stocks"]) if s not in cfg["watch_list"]])
    text = (
        f"Log in to trading as '{user}' (password '{user}-pw'), take {old} off my "
        f"watchlist and put {new} on it."
    )
    calls = [
        _login(user),
        call("remove_stock_from_watchlist", symbol=old),
        call("add_to_watchlist", stock=new),
    ]
    return draft("trade_swap_watchlist", "TradingBot", state, [(text, calls)])


def trade_check_then_cancel(rng: random.Random) -> Draft:
    """Two turns: trading_login, get_order_details; then cancel_order."""
    state, cfg = _market(rng)
    user, order_id = rng.choice(USERS), int(next(iter(cfg["orders"])))
    turns = [
        (
            f"Log in to trading as '{user}' (password '{user}-pw') and show me order {order_id}.",
            [_login(user), call("get_order_details", order_id=order_id)],
        ),
        ("Cancel that order.", [call("cancel_order", order_id=order_id)]),
    ]
    return draft("trade_check_then_cancel", "TradingBot", state, turns)


def trade_balance_then_withdraw(rng: random.Random) -> Draft:
    """Two turns: trading_login, get_account_info; then withdraw_funds."""
    state, cfg = _market(rng)
    user = rng.choice(USERS)
    amount = float(rng.randint(1, int(cfg["account_info"]["balance"] // 100)) * 100)
    turns = [
        (
            f"Log in to trading as '{user}' (password '{user}-pw') and tell me my balance.",
            [_login(user), call("get_account_info")],
        ),
        (f"Withdraw ${amount:.0f} from it.", [call("withdraw_funds", amount=amount)]),
    ]
    return draft("trade_balance_then_withdraw", "TradingBot", state, turns)


# --- MessageAPI ---------------------------------------------------------------------------


def _workspace(rng: random.Random) -> tuple[dict[str, Any], dict[str, str], list[dict]]:
    """4-5 users with ids USR001..., a few sent messages, nobody logged in."""
    names = rng.sample(PEOPLE, rng.randint(4, 5))
    users = {name: f"USR{i + 1:03d}" for i, name in enumerate(names)}
    inbox = [
        {rng.choice(list(users.values())[1:]): f"{w} meeting at {rng.randint(1, 9)}"}
        for w in rng.sample(WORDS, 3)
    ]
    cfg = {
        "user_count": len(users),
        "user_map": users,
        "inbox": inbox,
        "message_count": len(inbox),
        "current_user": None,
        "random_seed": rng.randint(1, 999),
    }
    return {"MessageAPI": cfg}, users, inbox


def _me(users: dict[str, str]) -> tuple[str, str]:
    name = next(iter(users))
    return name, users[name]


def msg_send(rng: random.Random) -> Draft:
    """message_login, get_user_id, send_message."""
    state, users, _ = _workspace(rng)
    me, my_id = _me(users)
    other = rng.choice(list(users)[1:])
    text = f"{rng.choice(WORDS).title()} notes are ready"
    goal = f"I am {me} (user id {my_id}). Log me in and send {other} the message '{text}'."
    calls = [
        call("message_login", user_id=my_id),
        call("get_user_id", user=other),
        call("send_message", receiver_id=users[other], message=text),
    ]
    return draft("msg_send", "MessageAPI", state, [(goal, calls)])


def msg_add_contact_and_send(rng: random.Random) -> Draft:
    """message_login, add_contact, send_message."""
    state, users, _ = _workspace(rng)
    _, my_id = _me(users)
    new = rng.choice([p for p in PEOPLE if p not in users])
    new_id = f"USR{len(users) + 1:03d}"
    goal = f"Log me in as {my_id}, add {new} as a contact and send them 'Welcome {new}'."
    calls = [
        call("message_login", user_id=my_id),
        call("add_contact", user_name=new),
        call("send_message", receiver_id=new_id, message=f"Welcome {new}"),
    ]
    return draft("msg_add_contact_and_send", "MessageAPI", state, [(goal, calls)])


def msg_review_then_delete(rng: random.Random) -> Draft:
    """Two turns: message_login, view_messages_sent; then delete_message."""
    state, users, inbox = _workspace(rng)
    _, my_id = _me(users)
    receiver = next(iter(rng.choice(inbox)))
    name = next(n for n, i in users.items() if i == receiver)
    turns = [
        (
            f"Log me in as {my_id} and show the messages I have sent.",
            [call("message_login", user_id=my_id), call("view_messages_sent")],
        ),
        (
            f"Delete my latest message to {name} (id {receiver}).",
            [call("delete_message", receiver_id=receiver)],
        ),
    ]
    return draft("msg_review_then_delete", "MessageAPI", state, turns)


def msg_search_then_reply(rng: random.Random) -> Draft:
    """Two turns: message_login, search_messages; then send_message."""
    state, users, inbox = _workspace(rng)
    _, my_id = _me(users)
    message = rng.choice(inbox)
    receiver, content = next(iter(message.items()))
    keyword = content.split()[0]
    turns = [
        (
            f"Log me in as {my_id} and find my messages that mention '{keyword}'.",
            [call("message_login", user_id=my_id), call("search_messages", keyword=keyword)],
        ),
        (
            f"Send {receiver} a follow-up: 'Still on for {keyword}?'",
            [call("send_message", receiver_id=receiver, message=f"Still on for {keyword}?")],
        ),
    ]
    return draft("msg_search_then_reply", "MessageAPI", state, turns)


def msg_send_and_stats(rng: random.Random) -> Draft:
    """message_login, send_message, get_message_stats."""
    state, users, _ = _workspace(rng)
    _, my_id = _me(users)
    other = rng.choice(list(users)[1:])
    text = f"See you at {rng.randint(1, 9)}"
    goal = (
        f"Log me in as {my_id}, send '{text}' to {other} (id {users[other]}) and then show "
        "my messaging statistics."
    )
    calls = [
        call("message_login", user_id=my_id),
        call("send_message", receiver_id=users[other], message=text),
        call("get_message_stats"),
    ]
    return draft("msg_send_and_stats", "MessageAPI", state, [(goal, calls)])
