"""Airline tools (τ²-bench behaviour, our own code): 6 read, 6 write, plus the 2 generic ones.

"Now" is 2024-05-15T15:00:00. New ids are fixed, never random (reservations HATHAT, HATHAU,
HATHAV; certificates certificate_3221322..4), so gold and agent replays stay comparable. The
upstream quirks are kept on purpose (docs/tasks.md lists them): ``cancel_reservation`` neither
releases seats nor restores balances and can be repeated; ``search_onestop_flight`` builds the
next day without zero padding; booking removes a used certificate entirely.
"""

from __future__ import annotations

import copy
from typing import Any

from envace_engine.environments.tau2.tools import Db, Tau2Error, find

NOW = "2024-05-15T15:00:00"
RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
CERTIFICATE_IDS = ("certificate_3221322", "certificate_3221323", "certificate_3221324")
AIRPORTS = (
    ("SFO", "San Francisco"),
    ("JFK", "New York"),
    ("LAX", "Los Angeles"),
    ("ORD", "Chicago"),
    ("DFW", "Dallas"),
    ("DEN", "Denver"),
    ("SEA", "Seattle"),
    ("ATL", "Atlanta"),
    ("MIA", "Miami"),
    ("BOS", "Boston"),
    ("PHX", "Phoenix"),
    ("IAH", "Houston"),
    ("LAS", "Las Vegas"),
    ("MCO", "Orlando"),
    ("EWR", "Newark"),
    ("CLT", "Charlotte"),
    ("MSP", "Minneapolis"),
    ("DTW", "Detroit"),
    ("PHL", "Philadelphia"),
    ("LGA", "LaGuardia"),
)


def get_user_details(db: Db, user_id: str) -> dict[str, Any]:
    """The whole user record."""
    return find(db, "users", user_id, "User")


def get_reservation_details(db: Db, reservation_id: str) -> dict[str, Any]:
    """The whole reservation record."""
    return find(db, "reservations", reservation_id, "Reservation")


def list_all_airports(db: Db) -> list[dict[str, str]]:
    """The 20 airports (a constant list of IATA code and city)."""
    return [{"iata": code, "city": city} for code, city in AIRPORTS]


def _available(flight: dict[str, Any], date: str) -> dict[str, Any] | None:
    record = flight["dates"].get(date)
    return record if record is not None and record.get("status") == "available" else None


def _leg(flight: dict[str, Any], record: dict[str, Any], date: str | None) -> dict[str, Any]:
    return {
        "flight_number": flight["flight_number"],
        "origin": flight["origin"],
        "destination": flight["destination"],
        "status": "available",
        "scheduled_departure_time_est": flight["scheduled_departure_time_est"],
        "scheduled_arrival_time_est": flight["scheduled_arrival_time_est"],
        "date": date,
        "available_seats": dict(record["available_seats"]),
        "prices": dict(record["prices"]),
    }


def search_direct_flight(db: Db, origin: str, destination: str, date: str) -> list[dict]:
    """Available direct flights on ``date``, in database order (``date`` is left null)."""
    out = []
    for flight in db["flights"].values():
        if flight["origin"] == origin and flight["destination"] == destination:
            record = _available(flight, date)
            if record is not None:
                out.append(_leg(flight, record, None))
    return out


def _next_day(date: str) -> str:
    # Upstream quirk, kept: no zero padding, so 2024-05-01 + 1 is "2024-05-2" (no such date).
    return f"2024-05-{int(date[-2:]) + 1}"


def search_onestop_flight(db: Db, origin: str, destination: str, date: str) -> list[list]:
    """Pairs [leg1, leg2] through any airport; leg 2 departs (string compare) after leg 1 lands,
    on the next day when leg 1's scheduled arrival carries "+1"."""
    flights = list(db["flights"].values())
    out = []
    for first in flights:
        if first["origin"] != origin:
            continue
        record1 = _available(first, date)
        if record1 is None:
            continue
        arrival = first["scheduled_arrival_time_est"]
        connect = _next_day(date) if "+1" in arrival else date
        for second in flights:
            if second["origin"] != first["destination"] or second["destination"] != destination:
                continue
            record2 = _available(second, connect)
            if record2 is not None and second["scheduled_departure_time_est"] >= arrival:
                out.append([_leg(first, record1, date), _leg(second, record2, connect)])
    return out


def get_flight_status(db: Db, flight_number: str, date: str) -> str:
    """The status string of one flight on one date."""
    flight = find(db, "flights", flight_number, "Flight")
    record = flight["dates"].get(date)
    if record is None:
        raise Tau2Error(f"Flight {flight_number} not found on date {date}")
    return str(record["status"])


def _priced_segment(db: Db, number: str, date: str, cabin: str, n: int) -> dict[str, Any]:
    """A new segment at the cabin's current price; refused unless available with n seats."""
    flight = find(db, "flights", number, "Flight")
    record = flight["dates"].get(date)
    if record is None:
        raise Tau2Error(f"Flight {number} not found on date {date}")
    if record.get("status") != "available":
        raise Tau2Error(f"Flight {number} not available on date {date}")
    if record["available_seats"][cabin] < n:
        raise Tau2Error(f"Not enough seats on flight {number}")
    return {
        "origin": flight["origin"],
        "destination": flight["destination"],
        "flight_number": number,
        "date": date,
        "price": record["prices"][cabin],
    }


def _method(user: dict[str, Any], payment_id: str) -> dict[str, Any]:
    method = user["payment_methods"].get(payment_id)
    if method is None:
        raise Tau2Error(f"Payment method {payment_id} not found")
    return dict(method)


def book_reservation(
    db: Db,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: str,
    cabin: str,
    flights: list[dict[str, Any]],
    passengers: list[dict[str, Any]],
    payment_methods: list[dict[str, Any]],
    total_baggages: int,
    nonfree_baggages: int,
    insurance: str,
) -> dict[str, Any]:
    """Book a reservation: price it, check the payments add up, then charge and save it."""
    user = find(db, "users", user_id, "User")
    new_id = next((r for r in RESERVATION_IDS if r not in db["reservations"]), None)
    if new_id is None:
        raise Tau2Error("No reservation id is free")
    n = len(passengers)
    segments = [_priced_segment(db, f["flight_number"], f["date"], cabin, n) for f in flights]
    total = sum(s["price"] * n for s in segments) + 50 * nonfree_baggages
    total += 30 * n if insurance == "yes" else 0
    for payment in payment_methods:
        method = _method(user, payment["payment_id"])
        prepaid = method["source"] in ("gift_card", "certificate")
        if prepaid and method["amount"] < payment["amount"]:
            raise Tau2Error(f"Not enough balance in payment method {payment['payment_id']}")
    paid = sum(p["amount"] for p in payment_methods)
    if paid != total:
        raise Tau2Error(f"Payment amount does not add up, total price is {total}, but paid {paid}")
    # Every check passed: only now does anything change.
    history = [{"payment_id": p["payment_id"], "amount": p["amount"]} for p in payment_methods]
    for payment in history:
        method = user["payment_methods"].get(payment["payment_id"])
        if method is not None and method["source"] == "gift_card":
            method["amount"] = method["amount"] - payment["amount"]
        elif method is not None and method["source"] == "certificate":
            del user["payment_methods"][payment["payment_id"]]
    for segment in segments:
        record = db["flights"][segment["flight_number"]]["dates"][segment["date"]]
        record["available_seats"][cabin] -= n
    reservation = {
        "reservation_id": new_id,
        "user_id": user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": segments,
        "passengers": [_passenger(p) for p in passengers],
        "payment_history": history,
        "created_at": NOW,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
    }
    db["reservations"][new_id] = reservation
    user["reservations"].append(new_id)
    return reservation


def _passenger(p: dict[str, Any]) -> dict[str, Any]:
    return {"first_name": p["first_name"], "last_name": p["last_name"], "dob": p["dob"]}


def cancel_reservation(db: Db, reservation_id: str) -> dict[str, Any]:
    """Append a refund for every payment entry and mark the reservation cancelled (nothing else:
    seats and balances stay as they are; a second cancel refunds again, as upstream)."""
    reservation = find(db, "reservations", reservation_id, "Reservation")
    refunds = [
        {"payment_id": p["payment_id"], "amount": -p["amount"]}
        for p in reservation["payment_history"]
    ]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return reservation


def _charge(user: dict[str, Any], payment_id: str, amount: int | float) -> dict | None:
    """Check a payment for an update; return the method to debit (refund if negative)."""
    method = user["payment_methods"].get(payment_id)
    if method is None:
        raise Tau2Error("Payment method not found")
    if method["source"] == "certificate":
        raise Tau2Error("Certificate cannot be used to update reservation")
    if method["source"] == "gift_card" and method["amount"] < amount:
        raise Tau2Error("Gift card balance is not enough")
    return method if method["source"] == "gift_card" else None


def _pay(reservation: dict, gift: dict | None, payment_id: str, amount: int | float) -> None:
    if gift is not None:
        gift["amount"] = gift["amount"] - amount
    if amount != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": amount})


def update_reservation_baggages(
    db: Db, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str
) -> dict[str, Any]:
    """Set the bag counts; 50 per added non-free bag is charged (removing bags is free)."""
    reservation = find(db, "reservations", reservation_id, "Reservation")
    user = find(db, "users", reservation["user_id"], "User")
    amount = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    gift = _charge(user, payment_id, amount)
    _pay(reservation, gift, payment_id, amount)
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    return reservation


def update_reservation_flights(
    db: Db, reservation_id: str, cabin: str, flights: list[dict[str, Any]], payment_id: str
) -> dict[str, Any]:
    """Replace the itinerary: unchanged segments keep their price, others are re-priced; the
    difference (possibly negative) is charged to ``payment_id``. Seats are not updated."""
    reservation = find(db, "reservations", reservation_id, "Reservation")
    user = find(db, "users", reservation["user_id"], "User")
    n = len(reservation["passengers"])
    segments = []
    for f in flights:
        kept = next(
            (
                s
                for s in reservation["flights"]
                if s["flight_number"] == f["flight_number"]
                and s["date"] == f["date"]
                and cabin == reservation["cabin"]
            ),
            None,
        )
        if kept is not None:
            segments.append(copy.deepcopy(kept))
        else:
            segments.append(_priced_segment(db, f["flight_number"], f["date"], cabin, n))
    old = sum(s["price"] for s in reservation["flights"]) * n
    amount = sum(s["price"] for s in segments) * n - old
    gift = _charge(user, payment_id, amount)
    _pay(reservation, gift, payment_id, amount)
    reservation["flights"] = segments
    reservation["cabin"] = cabin
    return reservation


def update_reservation_passengers(
    db: Db, reservation_id: str, passengers: list[dict[str, Any]]
) -> dict[str, Any]:
    """Replace the passengers (the count must stay the same)."""
    reservation = find(db, "reservations", reservation_id, "Reservation")
    if len(passengers) != len(reservation["passengers"]):
        raise Tau2Error("Number of passengers does not match")
    reservation["passengers"] = [_passenger(p) for p in passengers]
    return reservation


def send_certificate(db: Db, user_id: str, amount: int | float) -> str:
    """Add a travel certificate to the user's payment methods (first free fixed id)."""
    user = find(db, "users", user_id, "User")
    free = next((c for c in CERTIFICATE_IDS if c not in user["payment_methods"]), None)
    if free is None:
        raise Tau2Error("Too many certificates")
    user["payment_methods"][free] = {"source": "certificate", "id": free, "amount": float(amount)}
    return f"Certificate {free} added to user {user_id} with amount {amount}."
