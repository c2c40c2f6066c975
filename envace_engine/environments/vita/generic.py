"""The 8 tools every VitaBench domain has (upstream's generic toolkit), as plain functions.

Each takes the episode's ``World`` first, then the call's arguments. Distances are haversine
metres on a sphere of radius 6,371,000 m, rounded to whole metres (a float, as upstream);
weather and geocoding match the query against the task's own cities and places with fuzzy
partial ratios (``fuzzy``; weather needs 50, geocoding 30 and a plain ratio of 20);
holidays come from the ``holidays`` package's calendar for China, named in the task's language
(upstream names them in whatever language the host's locale picks; a task's own language is the
deterministic choice), and ``get_holiday_date`` reads upstream's fixed 2023–2025 table.
"""

from __future__ import annotations

import math
from datetime import date, datetime

import holidays

from envace_engine.environments.vita import fuzzy, reprs
from envace_engine.environments.vita.dataset import holiday_dates
from envace_engine.environments.vita.world import ToolFailure, World, parses, providers, require

EARTH_RADIUS_M = 6_371_000
DATE_FORMAT = "%Y-%m-%d"
_HOLIDAY_LANGUAGES = {"zh": "zh_CN", "en": "en_US"}


def distance_m(lon1: float, lat1: float, lon2: float, lat2: float) -> float:
    """Great-circle distance in whole metres (haversine)."""
    if lon1 == lon2 and lat1 == lat2:
        return 0.0
    lam1, phi1, lam2, phi2 = map(math.radians, (lon1, lat1, lon2, lat2))
    h = math.sin((phi2 - phi1) / 2) ** 2
    h += math.cos(phi1) * math.cos(phi2) * math.sin((lam2 - lam1) / 2) ** 2
    return float(round(EARTH_RADIUS_M * (2 * math.asin(math.sqrt(h))), 0))


def longitude_latitude_to_distance(
    world: World, longitude1: float, latitude1: float, longitude2: float, latitude2: float
) -> float:
    """The distance between two points, in whole metres."""
    return distance_m(longitude1, latitude1, longitude2, latitude2)


def weather(world: World, address: str, date_start: str, date_end: str) -> str:
    """One line per day from ``date_start`` to ``date_end`` for the best-matching city."""
    require(
        parses(date_start, DATE_FORMAT),
        f"Invalid date_start format. Expected yyyy-mm-dd, got: {date_start}",
    )
    require(
        parses(date_end, DATE_FORMAT),
        f"Invalid date_end format. Expected yyyy-mm-dd, got: {date_end}",
    )
    require(address and address.strip(), "Address cannot be empty")
    days = world.db.get("weather") or []
    match = fuzzy.best(address, {d["city"]: d["city"] for d in days})
    if match is None or match[1] < 50:
        raise ToolFailure(f"Weather information not found for {address}")
    city, start, end = match[0], _day(date_start), _day(date_end)
    chosen = sorted(
        (d for d in days if d["city"] == city and start <= _day(d["datetime"]) <= end),
        key=lambda d: str(d["datetime"]),
    )
    if not chosen:
        return f"No weather information found for {city} between {date_start} and {date_end}"
    return "\n".join(reprs.weather(d) for d in chosen)


def _day(text: str) -> date:
    return datetime.strptime(text, DATE_FORMAT).date()


def geocode(world: World, address: str) -> tuple[float, float]:
    """The coordinates of the best-matching known place (partial ratio ≥ 30, ratio ≥ 20)."""
    match = fuzzy.best(address, {place: place for place in world.places})
    if match is None or match[1] < 30 or fuzzy.ratio(address, match[0]) < 20:
        raise ToolFailure(f"Longitude and latitude not found for address {address}")
    return world.places[match[0]]


def address_to_longitude_latitude(world: World, address: str) -> list[float]:
    """``[longitude, latitude]`` of an address, matched against every place of the task."""
    require(address and address.strip(), "Address cannot be empty")
    return list(geocode(world, address))


def get_date_holiday_info(world: World, date: str) -> str:
    """The name of the Chinese public holiday on ``date``, or that it is not one."""
    require(parses(date, DATE_FORMAT), f"Date format error, should be yyyy-mm-dd, actual: {date}")
    day = _day(date)
    calendar = holidays.country_holidays(
        "CN", years=day.year, language=_HOLIDAY_LANGUAGES[world.language]
    )
    name = calendar.get(day)
    return str(name) if name is not None else f"Date {date} is not a holiday"


def get_holiday_date(world: World, year: str, holiday_name: str) -> str:
    """The date of a named holiday in 2023–2025 (names in the task's language, fuzzy ≥ 80)."""
    table = holiday_dates(world.language)
    if year not in table:
        return f"Holiday data for year {year} not found"
    require(holiday_name and holiday_name.strip(), "Holiday name cannot be empty")
    match = fuzzy.best(holiday_name, {name: name for name in table[year]})
    if match is None or match[1] < 80:
        return f"Holiday named '{holiday_name}' not found in year {year}"
    return table[year][match[0]]


def get_user_historical_behaviors(world: World) -> str:
    """The user's profile and habits, as Python prints the dict."""
    return str(world.db.get("user_historical_behaviors") or {})


def get_user_all_orders(world: World) -> str:
    """The detail of every order of the task, one per line."""
    orders = (world.db.get("orders") or {}).values()
    if not orders:  # upstream answers an empty text here; say so instead
        return "User currently has no order information"
    return "\n".join(reprs.order(o, with_products=True) for o in orders)


def get_nearby(world: World, longitude: float, latitude: float, range: float) -> str:
    """The summary of every store or shop within ``range`` metres of a point."""
    found = []
    for provider in providers(world.db):
        place = provider["location"]
        if distance_m(longitude, latitude, place["longitude"], place["latitude"]) <= range:
            found.append(reprs.store(provider) if "store_id" in provider else reprs.shop(provider))
    return "\n".join(found) if found else "No search results found"
