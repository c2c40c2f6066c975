"""Suite ``bfcl-gen``: new tasks over BFCL's backends, for training without the benchmark.

Twenty templates over four classes (``bfcl_gen_office``: GorillaFileSystem, TicketAPI;
``bfcl_gen_accounts``: TradingBot, MessageAPI). Environments, the whitelist dispatcher and the
success check are exactly the ``bfcl`` suite's: a generated task is scored by BFCL's multi-turn
checker (state after every turn plus the reference results among the agent's results), 0 or 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from envace_engine.environments.bfcl import gen_accounts as accounts
from envace_engine.environments.bfcl import gen_office as office
from envace_engine.environments.bfcl.backends import make_bfcl_env, tools_for
from envace_engine.environments.bfcl.checker import bfcl_check
from envace_engine.environments.generated import Draft, GeneratedSuite, Template
from envace_engine.environments.tool_environment import ToolEnvironment
from envace_engine.types import Task, ToolCall

TEMPLATES: tuple[Template, ...] = (
    office.fs_move_into_new_folder,
    office.fs_write_new_file,
    office.fs_copy_file,
    office.fs_count_then_delete,
    office.fs_grep_then_tail,
    office.fs_sort_in_other_folder,
    office.ticket_login_and_create,
    office.ticket_check_and_close,
    office.ticket_resolve_then_edit,
    office.ticket_create_then_describe,
    office.ticket_list_and_close,
    accounts.trade_look_and_buy,
    accounts.trade_fund_account,
    accounts.trade_swap_watchlist,
    accounts.trade_check_then_cancel,
    accounts.trade_balance_then_withdraw,
    accounts.msg_send,
    accounts.msg_add_contact_and_send,
    accounts.msg_review_then_delete,
    accounts.msg_search_then_reply,
    accounts.msg_send_and_stats,
)


class BfclGenSuite(GeneratedSuite):
    """Generated BFCL-backend tasks: ``train`` (512) and ``validation`` (64) splits."""

    name = "bfcl-gen"
    templates = TEMPLATES

    def tools_for(self, draft: Draft) -> list[dict[str, Any]]:
        """All documented tools of the task's classes (nothing excluded or held out)."""
        return tools_for(draft.meta["involved_classes"])

    def make_env(self, task: Task) -> ToolEnvironment:
        """Fresh BFCL backend instances at the task's initial state."""
        return make_bfcl_env(task)

    def score(
        self, task: Task, calls_per_turn: Sequence[Sequence[ToolCall]], answers: Sequence[str]
    ) -> float:
        """BFCL's multi-turn checker verdict over the agent's calls: 1.0 or 0.0."""
        return 1.0 if bfcl_check(task, calls_per_turn, make_bfcl_env).valid else 0.0
