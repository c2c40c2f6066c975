"""The mock domain (task management), for tests: 1 read, 2 write and the transfer tool, plus
the ``assert_task_status`` check its env assertions use."""

from __future__ import annotations

from typing import Any

from envace_engine.environments.tau2.tools import (
    GENERIC,
    Db,
    Tau2Error,
    Tool,
    find,
    params,
    string,
)

STATUSES = ("pending", "completed")


def get_users(db: Db) -> list[dict[str, Any]]:
    """Every user with their task ids."""
    return list(db["users"].values())


def create_task(db: Db, user_id: str, title: str, description: str | None = None) -> dict:
    """Create a pending task ``task_<n+1>`` for an existing user."""
    user = find(db, "users", user_id, "User")
    task_id = f"task_{len(db['tasks']) + 1}"
    if task_id in db["tasks"]:
        raise Tau2Error(f"Task {task_id} already exists")
    task = {"task_id": task_id, "title": title, "description": description, "status": "pending"}
    db["tasks"][task_id] = task
    user["tasks"].append(task_id)
    return task


def update_task_status(db: Db, task_id: str, status: str) -> dict[str, Any]:
    """Set a task's status (pending or completed)."""
    task = find(db, "tasks", task_id, "Task")
    if status not in STATUSES:
        raise Tau2Error(f"Invalid status {status}")
    task["status"] = status
    return task


def assert_task_status(db: Db, task_id: str, expected_status: str) -> bool:
    """Whether the task exists with that status (an env-assertion function, not a tool)."""
    task = db["tasks"].get(task_id)
    return task is not None and task.get("status") == expected_status


TOOLS: tuple[Tool, ...] = (
    Tool("get_users", get_users, "List all users and their tasks.", params({})),
    Tool(
        "create_task",
        create_task,
        "Create a new task for a user.",
        params(
            {"user_id": string("The user id, such as 'user_1'."), "title": string("The title.")},
            {"description": string("An optional description.")},
        ),
        writes=True,
    ),
    Tool(
        "update_task_status",
        update_task_status,
        "Update the status of a task.",
        params(
            {
                "task_id": string("The task id, such as 'task_1'."),
                "status": string("The new status.", list(STATUSES)),
            }
        ),
        writes=True,
    ),
    *[t for t in GENERIC if t.name == "transfer_to_human_agents"],
)
ASSERTIONS = {"assert_task_status": assert_task_status}
