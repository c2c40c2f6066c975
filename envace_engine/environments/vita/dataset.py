"""VitaBench data files (``data/``): the task schema and the per-task database, and loaders.

A task file is a JSON array of tasks (spec §2); each task carries its **whole database** in
``environment`` (§3: the frozen "now", the one user, weather, a gazetteer, pre-existing orders,
and the stores or shops with their products). Both are parsed with pydantic because they are
outside JSON: every model forbids unknown keys, so a field upstream adds later fails loudly
instead of leaking to the agent or vanishing unnoticed.

**Hidden fields.** The in-store data carries annotation fields the agent must never see (shop
``category``, ``shop_type``, ``target_reason``; product ``product_type``), and a few fields that
upstream's own models silently drop (so its agent never sees them either: shop ``description``,
``special_note``, ``products_preview``, ``business_hours``; product ``field``; order
``order_time``). Each is declared here with ``exclude=True``: it is parsed and kept on the model
for evaluation-side code, and left out of every ``model_dump`` — the agent's database
(``agent_db``) is such a dump. ``product_type`` inside a pre-existing order's product is dropped
at parse time (order products are free-form dicts upstream, which would show it).

Numbers follow upstream's models: prices, scores, totals and coordinates are floats (the agent
reads ``price=25.0``), counts are ints, and the product lists of pre-existing orders stay raw.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml  # type: ignore[import-untyped]
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DOMAINS = ("delivery", "instore")
LANGUAGES: dict[str, tuple[str, ...]] = {"delivery": ("zh", "en"), "instore": ("en",)}
# Upstream names languages "chinese" / "english" in its prompts and tool descriptions.
LANGUAGE_KEYS = {"zh": "chinese", "en": "english"}
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
_FILES = {
    ("delivery", "zh"): "delivery/tasks.json",
    ("delivery", "en"): "delivery/tasks_en.json",
    ("instore", "en"): "instore/tasks_en.json",
}
HIDDEN_PRODUCT_FIELDS = ("product_type",)

OrderType = Literal["delivery", "instore", "hotel", "attraction", "flight", "train"]
OrderStatus = Literal[
    "unpaid", "paid", "unconsumed", "consumed", "processed", "in-progress", "delivered", "cancelled"
]
InstoreStatus = Literal["unpaid", "paid", "unconsumed", "consumed", "cancelled"]


def hidden() -> Any:
    """A field that is parsed and kept but never dumped (so never in the agent's database)."""
    return Field(default=None, exclude=True, repr=False)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Location(_Model):
    """A geocoded address: an entry of the gazetteer, a store's or an order's place."""

    address: str
    longitude: float
    latitude: float


class Weather(_Model):
    """One city's weather on one day."""

    city: str
    category: str
    datetime: str
    temperature: tuple[float, float]
    humidity: float


class Order(_Model):
    """An order of any type (shared by every domain); ``store_id`` is the provider's id."""

    order_id: str
    order_type: OrderType
    user_id: str
    store_id: str
    note: str | None = ""
    location: Location | None = None
    dispatch_time: str | None = ""
    shipping_time: float | None = 0.0
    delivery_time: str | None = ""
    total_price: float = 0.0
    create_time: str = ""
    update_time: str = ""
    status: OrderStatus = "unpaid"
    products: list[dict[str, Any]] = Field(default_factory=list)
    order_time: str | None = hidden()

    @model_validator(mode="before")
    @classmethod
    def _update_time(cls, data: Any) -> Any:
        # Upstream: an order without an update time was last updated when it was created.
        if isinstance(data, dict) and not data.get("update_time") and data.get("create_time"):
            return {**data, "update_time": data["create_time"]}
        return data

    @field_validator("products", mode="before")
    @classmethod
    def _without_hidden(cls, products: Any) -> Any:
        if not isinstance(products, list):
            return products
        return [
            {k: v for k, v in p.items() if k not in HIDDEN_PRODUCT_FIELDS}
            if isinstance(p, dict)
            else p
            for p in products
        ]


class DeliveryProduct(_Model):
    """A dish of a delivery store; ``attributes`` (the options) joined into one string."""

    product_id: str
    name: str
    store_id: str
    store_name: str
    price: float
    quantity: int | None = 0
    attributes: str
    tags: list[str]

    @field_validator("attributes", mode="before")
    @classmethod
    def _joined(cls, value: Any) -> Any:
        return ", ".join(value) if isinstance(value, list) else value


class Store(_Model):
    """A delivery store with its menu."""

    store_id: str
    name: str
    score: float
    location: Location
    tags: list[str]
    products: list[DeliveryProduct]


class ShopProduct(_Model):
    """A product (package, set meal, service) of an in-store shop."""

    product_id: str
    name: str
    shop_id: str
    price: float
    quantity: int | None = 0
    tags: list[str]
    product_type: str | None = hidden()  # annotation: "target" or "distraction"
    field: str | None = hidden()  # a stray key in one task, dropped upstream


class Shop(_Model):
    """An in-store shop with its products and booking options."""

    shop_id: str
    shop_name: str
    score: float
    location: Location
    tags: list[str]
    enable_book: bool
    book_price: float
    enable_reservation: bool
    products: list[ShopProduct]
    category: str | None = hidden()
    shop_type: str | None = hidden()  # annotation: "target" or "distraction"
    target_reason: str | None = hidden()
    description: str | None = hidden()
    special_note: str | None = hidden()
    products_preview: str | None = hidden()
    business_hours: str | None = hidden()


class Book(_Model):
    """A table booking at a shop."""

    book_id: str
    shop_id: str
    book_time: str
    update_time: str
    customer_id: str
    customer_count: int
    book_price: float
    status: InstoreStatus


class Reservation(_Model):
    """A reservation at a shop."""

    reservation_id: str
    shop_id: str
    reservation_time: str
    update_time: str
    customer_id: str
    customer_count: int
    status: InstoreStatus


class Db(_Model):
    """What every domain's database holds. Field order is upstream's: it decides the order in
    which places and products are registered (the gazetteer, the product registry)."""

    time: str
    user_id: str
    weather: list[Weather] = Field(default_factory=list)
    location: list[Location] = Field(default_factory=list)
    user_historical_behaviors: dict[str, Any] = Field(default_factory=dict)
    orders: dict[str, Order] = Field(default_factory=dict)

    @field_validator("time")
    @classmethod
    def _time(cls, value: str) -> str:
        datetime.strptime(value, TIME_FORMAT)  # fails loudly: every tool reads "now"
        return value


class DeliveryDb(Db):
    """A delivery task's database."""

    stores: dict[str, Store] = Field(default_factory=dict)


class InstoreDb(Db):
    """An in-store task's database."""

    shops: dict[str, Shop] = Field(default_factory=dict)
    books: dict[str, Book] = Field(default_factory=dict)
    reservations: dict[str, Reservation] = Field(default_factory=dict)


class ExpectedState(_Model):
    """One expected end state: reference orders (annotation only) and its rubrics."""

    required_orders: list[dict[str, Any]] = Field(default_factory=list)
    optional_orders: list[dict[str, Any]] = Field(default_factory=list)
    state_rubrics: list[str] = Field(default_factory=list)


class Criteria(_Model):
    """What the judge checks: rubrics per expected state, then overall rubrics."""

    expected_states: list[ExpectedState] = Field(default_factory=list)
    overall_rubrics: list[str] = Field(default_factory=list)


class UserScenario(_Model):
    """Who the simulated user is (sent to it as ``str(user_profile)``, the persona)."""

    user_profile: dict[str, Any]


class _TaskSpec(_Model):
    id: str
    domain: str  # informational: the run's domain argument picks the environment
    message_history: list[dict[str, Any]] = Field(default_factory=list)
    user_scenario: UserScenario
    instructions: str  # the user's goal: for the user simulator and the judge, never the agent
    evaluation_criteria: Criteria = Field(default_factory=Criteria)

    @field_validator("message_history")
    @classmethod
    def _empty(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if value:  # every shipped task starts fresh; replaying a history is not implemented
            raise ValueError("tasks with a message_history are not supported")
        return value


class DeliveryTaskSpec(_TaskSpec):
    """One delivery task."""

    environment: DeliveryDb


class InstoreTaskSpec(_TaskSpec):
    """One in-store task."""

    environment: InstoreDb


TaskSpec = DeliveryTaskSpec | InstoreTaskSpec


def check(domain: str, language: str) -> None:
    """A ValueError naming the valid choices unless ``domain`` has data in ``language``."""
    if domain not in DOMAINS:
        raise ValueError(
            f"unknown VitaBench domain {domain!r}; valid domains: {', '.join(DOMAINS)}"
        )
    if language not in LANGUAGES[domain]:
        valid = ", ".join(LANGUAGES[domain])
        raise ValueError(f"VitaBench {domain} has no {language!r} tasks; valid languages: {valid}")


def data_text(*parts: str) -> str:
    """The text of a file under ``data/`` (package data: works from an installed wheel)."""
    root = resources.files("envace_engine.environments.vita").joinpath("data")
    return root.joinpath(*parts).read_text(encoding="utf-8")


@cache
def task_specs(domain: str, language: str) -> tuple[TaskSpec, ...]:
    """Every task of a domain in a language, validated, in file order."""
    check(domain, language)
    model = DeliveryTaskSpec if domain == "delivery" else InstoreTaskSpec
    raw = json.loads(data_text(*_FILES[(domain, language)].split("/")))
    return tuple(model.model_validate(task) for task in raw)


def task_spec(domain: str, language: str, task_id: str) -> TaskSpec:
    """The task with id ``task_id`` (a ValueError if there is none)."""
    for spec in task_specs(domain, language):
        if spec.id == task_id:
            return spec
    raise ValueError(f"VitaBench {domain} ({language}) has no task {task_id!r}")


def agent_db(spec: TaskSpec) -> dict[str, Any]:
    """The task's database as the agent-side code may hold it: plain JSON data, every hidden
    field left out."""
    return spec.environment.model_dump(mode="json")


def rubrics(spec: TaskSpec) -> tuple[str, ...]:
    """The judge's rubrics (spec §6.1): every state's rubrics, then the overall ones, exact
    duplicates skipped."""
    criteria = spec.evaluation_criteria
    ordered = [r for s in criteria.expected_states for r in s.state_rubrics]
    return tuple(dict.fromkeys([*ordered, *criteria.overall_rubrics]))


def required_orders(spec: TaskSpec) -> tuple[dict[str, Any], ...]:
    """The reference orders of every expected state (annotation only: never scored upstream)."""
    return tuple(o for s in spec.evaluation_criteria.expected_states for o in s.required_orders)


@cache
def prompt(name: str, language: str) -> str:
    """One of upstream's prompts (``data/prompts/<name>.yaml``) in a language (zh | en)."""
    loaded = yaml.safe_load(data_text("prompts", f"{name}.yaml"))
    return str(loaded[LANGUAGE_KEYS[language]])


@cache
def tool_descriptions() -> dict[str, Any]:
    """``tool_descriptions.json``: kit → language key → tool name → its description record."""
    loaded: dict[str, Any] = json.loads(data_text("tool_descriptions.json"))
    return loaded


@cache
def holiday_dates(language: str) -> dict[str, dict[str, str]]:
    """``get_holiday_date``'s fixed table: year → holiday name → date, names in ``language``."""
    loaded: dict[str, dict[str, dict[str, str]]] = json.loads(data_text("holiday_dates.json"))
    return loaded[LANGUAGE_KEYS[language]]
