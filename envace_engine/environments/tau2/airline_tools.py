"""The airline domain's tool table: our own descriptions and JSON schemas for the 14 tools."""

from __future__ import annotations

from envace_engine.environments.tau2 import airline as a
from envace_engine.environments.tau2.tools import (
    GENERIC,
    Tool,
    array,
    integer,
    number,
    params,
    record,
    string,
)

_CABIN = string("The cabin class.", ["basic_economy", "economy", "business"])
_USER = string("The user id, such as 'sara_doe_496'.")
_RES = string("The reservation id, such as '8JX2WO'.")
_DATE = string("The date in the format 'YYYY-MM-DD', such as '2024-05-01'.")
_AIRPORT = "IATA code of the {} airport, such as '{}'."
_FLIGHTS = array(
    "The flights, each a flight number and a date.",
    record(
        {
            "flight_number": string("The flight number, such as 'HAT001'."),
            "date": _DATE,
        }
    ),
)
_PASSENGERS = array(
    "The passengers, each with first name, last name and date of birth.",
    record(
        {
            "first_name": string("First name."),
            "last_name": string("Last name."),
            "dob": string("Date of birth, 'YYYY-MM-DD'."),
        }
    ),
)
_PAYMENT_ID = string("The payment method id, such as 'credit_card_7815826'.")

TOOLS: tuple[Tool, ...] = (
    Tool(
        "get_user_details",
        a.get_user_details,
        "Get the details of a user, including their reservations.",
        params({"user_id": _USER}),
    ),
    Tool(
        "get_reservation_details",
        a.get_reservation_details,
        "Get the details of a reservation.",
        params({"reservation_id": _RES}),
    ),
    Tool("list_all_airports", a.list_all_airports, "List all airports and their cities.", params()),
    Tool(
        "search_direct_flight",
        a.search_direct_flight,
        "Search for direct flights between two cities on a date.",
        params(
            {
                "origin": string(_AIRPORT.format("origin", "JFK")),
                "destination": string(_AIRPORT.format("destination", "LAX")),
                "date": _DATE,
            }
        ),
    ),
    Tool(
        "search_onestop_flight",
        a.search_onestop_flight,
        "Search for one-stop flights between two cities on a date.",
        params(
            {
                "origin": string(_AIRPORT.format("origin", "JFK")),
                "destination": string(_AIRPORT.format("destination", "LAX")),
                "date": _DATE,
            }
        ),
    ),
    Tool(
        "get_flight_status",
        a.get_flight_status,
        "Get the status of a flight on a date.",
        params({"flight_number": string("The flight number, such as 'HAT001'."), "date": _DATE}),
    ),
    Tool(
        "book_reservation",
        a.book_reservation,
        "Book a reservation.",
        params(
            {
                "user_id": _USER,
                "origin": string(_AIRPORT.format("origin", "SFO")),
                "destination": string(_AIRPORT.format("destination", "JFK")),
                "flight_type": string("The type of the trip.", ["one_way", "round_trip"]),
                "cabin": _CABIN,
                "flights": _FLIGHTS,
                "passengers": _PASSENGERS,
                "payment_methods": array(
                    "The payment methods and the amount (whole dollars) paid with each.",
                    record({"payment_id": _PAYMENT_ID, "amount": integer("Amount in dollars.")}),
                ),
                "total_baggages": integer("The total number of bags."),
                "nonfree_baggages": integer("The number of bags that are not free."),
                "insurance": string("Whether travel insurance is bought.", ["yes", "no"]),
            }
        ),
        writes=True,
    ),
    Tool(
        "cancel_reservation",
        a.cancel_reservation,
        "Cancel the whole reservation.",
        params({"reservation_id": _RES}),
        writes=True,
    ),
    Tool(
        "update_reservation_baggages",
        a.update_reservation_baggages,
        "Update the baggage information of a reservation.",
        params(
            {
                "reservation_id": _RES,
                "total_baggages": integer("The updated total number of bags."),
                "nonfree_baggages": integer("The updated number of bags that are not free."),
                "payment_id": _PAYMENT_ID,
            }
        ),
        writes=True,
    ),
    Tool(
        "update_reservation_flights",
        a.update_reservation_flights,
        "Update the flights of a reservation. Give every flight of the new itinerary, "
        "including the ones that do not change.",
        params(
            {
                "reservation_id": _RES,
                "cabin": _CABIN,
                "flights": _FLIGHTS,
                "payment_id": _PAYMENT_ID,
            }
        ),
        writes=True,
    ),
    Tool(
        "update_reservation_passengers",
        a.update_reservation_passengers,
        "Update the passenger information of a reservation.",
        params({"reservation_id": _RES, "passengers": _PASSENGERS}),
        writes=True,
    ),
    Tool(
        "send_certificate",
        a.send_certificate,
        "Send a travel certificate to a user (compensation).",
        params({"user_id": _USER, "amount": number("The amount of the certificate.")}),
        writes=True,
    ),
    *GENERIC,
)
