"""τ³-bench's airline domain: the 14 agent tools over a JSON database, with τ³ v1.0.1's semantics.

Written here from the behaviour of tau2-bench's airline toolkit at v1.0.1 (fc0055d): the same
checks in the same order, the same errors, the same changes to the database — including its
quirks (cancelling does not release seats; a changed itinerary does not take seats; one-stop
searches add a day to the date without zero padding), since the gold actions were written
against them. The database is the ``db.json`` dict itself; every task gets a fresh copy.
"""

from __future__ import annotations

import copy
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flowstate.eval.tau3.domain import toolset
from flowstate.tools import ToolSet

NOW = "2024-05-15T15:00:00"  # the domain's fixed clock
NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_PAYMENT_NUMBERS = (3221322, 3221323, 3221324)
AIRPORTS = [("SFO", "San Francisco"), ("JFK", "New York"), ("LAX", "Los Angeles"), ("ORD", "Chicago"),
            ("DFW", "Dallas"), ("DEN", "Denver"), ("SEA", "Seattle"), ("ATL", "Atlanta"), ("MIA", "Miami"),
            ("BOS", "Boston"), ("PHX", "Phoenix"), ("IAH", "Houston"), ("LAS", "Las Vegas"), ("MCO", "Orlando"),
            ("EWR", "Newark"), ("CLT", "Charlotte"), ("MSP", "Minneapolis"), ("DTW", "Detroit"),
            ("PHL", "Philadelphia"), ("LGA", "LaGuardia")]

Cabin = Literal["business", "economy", "basic_economy"]
READ = frozenset({"get_reservation_details", "get_user_details", "list_all_airports", "search_direct_flight",
                  "search_onestop_flight", "get_flight_status"})
WRITE = frozenset({"book_reservation", "cancel_reservation", "send_certificate", "update_reservation_baggages",
                   "update_reservation_flights", "update_reservation_passengers"})


class FlightInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    flight_number: Annotated[str, Field(description="Flight number, e.g. 'HAT001'.")]
    date: Annotated[str, Field(description="Flight date as YYYY-MM-DD, e.g. '2024-05-01'.")]


class Passenger(BaseModel):
    model_config = ConfigDict(extra="forbid")
    first_name: Annotated[str, Field(description="First name.")]
    last_name: Annotated[str, Field(description="Last name.")]
    dob: Annotated[str, Field(description="Date of birth as YYYY-MM-DD.")]


class PaymentPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    payment_id: Annotated[str, Field(description="A payment method id from the user's profile.")]
    amount: Annotated[int, Field(description="Amount in dollars charged to it.")]


class AirlineTools:
    """The agent's tools, acting on ``db`` (changed in place)."""

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db

    # -- lookups (each raises the error the agent sees)

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.db["users"]:
            raise ValueError(f"User {user_id} not found")
        return self.db["users"][user_id]  # type: ignore[no-any-return]

    @staticmethod
    def _shown(reservation: dict[str, Any]) -> dict[str, Any]:
        """A reservation as τ³'s tools return it: its model dumped, so ``status`` (None unless cancelled) is there
        even where the database's record leaves it out (found by comparing with tau2's own tools over MCP)."""
        return reservation if "status" in reservation else {**reservation, "status": None}

    def _reservation(self, reservation_id: str) -> dict[str, Any]:
        if reservation_id not in self.db["reservations"]:
            raise ValueError(f"Reservation {reservation_id} not found")
        return self.db["reservations"][reservation_id]  # type: ignore[no-any-return]

    def _flight(self, flight_number: str) -> dict[str, Any]:
        if flight_number not in self.db["flights"]:
            raise ValueError(f"Flight {flight_number} not found")
        return self.db["flights"][flight_number]  # type: ignore[no-any-return]

    def _instance(self, flight_number: str, date: str) -> dict[str, Any]:
        flight = self._flight(flight_number)
        if date not in flight["dates"]:
            raise ValueError(f"Flight {flight_number} not found on date {date}")
        return flight["dates"][date]  # type: ignore[no-any-return]

    def _direct(self, date: str, origin: str | None, destination: str | None,
                leave_after: str | None = None) -> list[dict[str, Any]]:
        out = []
        for f in self.db["flights"].values():
            day = f["dates"].get(date)
            if (origin is None or f["origin"] == origin) and (destination is None or f["destination"] == destination) \
                    and day is not None and day["status"] == "available" \
                    and (leave_after is None or f["scheduled_departure_time_est"] >= leave_after):
                out.append({
                    "flight_number": f["flight_number"], "origin": f["origin"], "destination": f["destination"],
                    "status": "available", "scheduled_departure_time_est": f["scheduled_departure_time_est"],
                    "scheduled_arrival_time_est": f["scheduled_arrival_time_est"],
                    "available_seats": dict(day["available_seats"]), "prices": dict(day["prices"]), "date": None,
                })
        return out

    def _pay_for_update(self, user: dict[str, Any], payment_id: str, total: int) -> dict[str, Any] | None:
        if payment_id not in user["payment_methods"]:
            raise ValueError("Payment method not found")
        method = user["payment_methods"][payment_id]
        if method["source"] == "certificate":
            raise ValueError("Certificate cannot be used to update reservation")
        if method["source"] == "gift_card" and method["amount"] < total:
            raise ValueError("Gift card balance is not enough")
        if method["source"] == "gift_card":
            method["amount"] -= total
        return {"payment_id": payment_id, "amount": total} if total != 0 else None

    # -- the tools

    @staticmethod
    def _pay(user: dict[str, Any], paid: list[dict[str, Any]], total: int) -> None:
        """A booking's payment, as tau2's ``book_reservation`` takes it: every method the user's, gift cards and
        certificates covering their part, the parts adding up to the total; then gift cards are drawn down and
        certificates used up."""
        for part in paid:
            if part["payment_id"] not in user["payment_methods"]:
                raise ValueError(f"Payment method {part['payment_id']} not found")
            method = user["payment_methods"][part["payment_id"]]
            if method["source"] in ("gift_card", "certificate") and method["amount"] < part["amount"]:
                raise ValueError(f"Not enough balance in payment method {part['payment_id']}")
        if sum(p["amount"] for p in paid) != total:
            raise ValueError(f"Payment amount does not add up, total price is {total}, but paid "
                             f"{sum(p['amount'] for p in paid)}")
        for part in paid:
            method = user["payment_methods"][part["payment_id"]]
            if method["source"] == "gift_card":
                method["amount"] -= part["amount"]
            elif method["source"] == "certificate":
                user["payment_methods"].pop(part["payment_id"])

    def book_reservation(
        self,
        user_id: Annotated[str, Field(description="The user's id, e.g. 'sara_doe_496'.")],
        origin: Annotated[str, Field(description="IATA code of the origin, e.g. 'SFO'.")],
        destination: Annotated[str, Field(description="IATA code of the destination, e.g. 'JFK'.")],
        flight_type: Literal["round_trip", "one_way"],
        cabin: Cabin,
        flights: Annotated[list[FlightInfo], Field(description="Every flight segment of the reservation.")],
        passengers: Annotated[list[Passenger], Field(description="Every passenger.")],
        payment_methods: Annotated[list[PaymentPart], Field(description="How the total is paid.")],
        total_baggages: Annotated[int, Field(description="Total checked bags.")],
        nonfree_baggages: Annotated[int, Field(description="Checked bags that are paid for.")],
        insurance: Literal["yes", "no"],
    ) -> dict[str, Any]:
        """Book a reservation."""
        user = self._user(user_id)
        reservation_id = next((r for r in NEW_RESERVATION_IDS if r not in self.db["reservations"]), None)
        if reservation_id is None:
            raise ValueError("Too many reservations")
        people = [p.model_dump() for p in passengers]
        paid = [p.model_dump() for p in payment_methods]
        reservation: dict[str, Any] = {
            "reservation_id": reservation_id, "user_id": user_id, "origin": origin, "destination": destination,
            "flight_type": flight_type, "cabin": cabin, "flights": [], "passengers": copy.deepcopy(people),
            "payment_history": copy.deepcopy(paid), "created_at": NOW, "total_baggages": total_baggages,
            "nonfree_baggages": nonfree_baggages, "insurance": insurance,
        }
        total = 0
        instances = []
        for info in flights:
            flight = self._flight(info.flight_number)
            day = self._instance(info.flight_number, info.date)
            if day["status"] != "available":
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if day["available_seats"][cabin] < len(people):
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            price = day["prices"][cabin]
            reservation["flights"].append({"origin": flight["origin"], "destination": flight["destination"],
                                           "flight_number": info.flight_number, "date": info.date, "price": price})
            instances.append(day)
            total += price * len(people)
        if insurance == "yes":
            total += 30 * len(people)
        total += 50 * nonfree_baggages
        self._pay(user, paid, total)
        for day in instances:
            day["available_seats"][cabin] -= len(people)
        self.db["reservations"][reservation_id] = reservation
        user["reservations"].append(reservation_id)
        return self._shown(reservation)

    def cancel_reservation(
        self, reservation_id: Annotated[str, Field(description="The reservation id, e.g. 'ZFA04Y'.")],
    ) -> dict[str, Any]:
        """Cancel the whole reservation."""
        reservation = self._reservation(reservation_id)
        refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]]
        reservation["payment_history"].extend(refunds)
        reservation["status"] = "cancelled"
        return reservation  # seats are not released (as in τ³)

    def get_reservation_details(
        self, reservation_id: Annotated[str, Field(description="The reservation id, e.g. '8JX2WO'.")],
    ) -> dict[str, Any]:
        """Get the details of a reservation."""
        return self._shown(self._reservation(reservation_id))

    def get_user_details(
        self, user_id: Annotated[str, Field(description="The user id, e.g. 'sara_doe_496'.")],
    ) -> dict[str, Any]:
        """Get the details of a user, including their reservations."""
        return self._user(user_id)

    def list_all_airports(self) -> list[dict[str, str]]:
        """List every airport served: IATA code and city."""
        return [{"iata": code, "city": city} for code, city in AIRPORTS]

    def search_direct_flight(
        self,
        origin: Annotated[str, Field(description="IATA code of the origin, e.g. 'JFK'.")],
        destination: Annotated[str, Field(description="IATA code of the destination, e.g. 'LAX'.")],
        date: Annotated[str, Field(description="Date as YYYY-MM-DD, e.g. '2024-01-01'.")],
    ) -> list[dict[str, Any]]:
        """Search direct flights between two airports on a date."""
        return self._direct(date, origin, destination)

    def search_onestop_flight(
        self,
        origin: Annotated[str, Field(description="IATA code of the origin, e.g. 'JFK'.")],
        destination: Annotated[str, Field(description="IATA code of the destination, e.g. 'LAX'.")],
        date: Annotated[str, Field(description="Date as YYYY-MM-DD, e.g. '2024-05-01'.")],
    ) -> list[list[dict[str, Any]]]:
        """Search one-stop flights between two airports on a date: pairs of connecting flights."""
        out = []
        for first in self._direct(date, origin, None):
            first["date"] = date
            # τ³ adds a day without zero padding when the first leg lands after midnight
            second_date = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
            for second in self._direct(second_date, first["destination"], destination,
                                       leave_after=first["scheduled_arrival_time_est"]):
                second["date"] = second_date
                out.append([first, second])
        return out

    def send_certificate(
        self,
        user_id: Annotated[str, Field(description="The user id, e.g. 'sara_doe_496'.")],
        amount: Annotated[int, Field(description="The certificate's amount in dollars.")],
    ) -> str:
        """Send a certificate to a user. Be careful!"""
        user = self._user(user_id)
        for number in NEW_PAYMENT_NUMBERS:
            payment_id = f"certificate_{number}"
            if payment_id not in user["payment_methods"]:
                user["payment_methods"][payment_id] = {"id": payment_id, "amount": amount, "source": "certificate"}
                return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
        raise ValueError("Too many certificates")

    def update_reservation_baggages(
        self,
        reservation_id: Annotated[str, Field(description="The reservation id, e.g. 'ZFA04Y'.")],
        total_baggages: Annotated[int, Field(description="The new total of checked bags.")],
        nonfree_baggages: Annotated[int, Field(description="The new number of paid checked bags.")],
        payment_id: Annotated[str, Field(description="A payment method id from the user's profile.")],
    ) -> dict[str, Any]:
        """Update the baggage of a reservation."""
        reservation = self._reservation(reservation_id)
        user = self._user(reservation["user_id"])
        total = 50 * max(0, nonfree_baggages - reservation["nonfree_baggages"])
        payment = self._pay_for_update(user, payment_id, total)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["total_baggages"] = total_baggages
        reservation["nonfree_baggages"] = nonfree_baggages
        return self._shown(reservation)

    def update_reservation_flights(
        self,
        reservation_id: Annotated[str, Field(description="The reservation id, e.g. 'ZFA04Y'.")],
        cabin: Cabin,
        flights: Annotated[list[FlightInfo], Field(
            description="Every flight segment of the whole new reservation, unchanged segments included.")],
        payment_id: Annotated[str, Field(description="A payment method id from the user's profile.")],
    ) -> dict[str, Any]:
        """Update the flights of a reservation."""
        reservation = self._reservation(reservation_id)
        user = self._user(reservation["user_id"])
        people = len(reservation["passengers"])
        total = 0
        segments = []
        for info in flights:
            kept = next((f for f in reservation["flights"] if f["flight_number"] == info.flight_number
                         and f["date"] == info.date and cabin == reservation["cabin"]), None)
            if kept is not None:
                total += kept["price"] * people
                segments.append(kept)
                continue
            flight = self._flight(info.flight_number)
            day = self._instance(info.flight_number, info.date)
            if day["status"] != "available":
                raise ValueError(f"Flight {info.flight_number} not available on date {info.date}")
            if day["available_seats"][cabin] < people:
                raise ValueError(f"Not enough seats on flight {info.flight_number}")
            segment = {"flight_number": info.flight_number, "date": info.date, "price": day["prices"][cabin],
                       "origin": flight["origin"], "destination": flight["destination"]}
            total += segment["price"] * people
            segments.append(segment)
        total -= sum(f["price"] for f in reservation["flights"]) * people
        payment = self._pay_for_update(user, payment_id, total)
        if payment is not None:
            reservation["payment_history"].append(payment)
        reservation["flights"] = segments
        reservation["cabin"] = cabin
        return self._shown(reservation)  # seats are not taken (as in τ³)

    def update_reservation_passengers(
        self,
        reservation_id: Annotated[str, Field(description="The reservation id, e.g. 'ZFA04Y'.")],
        passengers: Annotated[list[Passenger], Field(description="Every passenger, in the reservation's order.")],
    ) -> dict[str, Any]:
        """Update the passengers of a reservation (their number cannot change)."""
        reservation = self._reservation(reservation_id)
        if len(passengers) != len(reservation["passengers"]):
            raise ValueError("Number of passengers does not match")
        reservation["passengers"] = [p.model_dump() for p in passengers]
        return self._shown(reservation)

    def get_flight_status(
        self,
        flight_number: Annotated[str, Field(description="The flight number.")],
        date: Annotated[str, Field(description="The flight date as YYYY-MM-DD.")],
    ) -> str:
        """Get the status of a flight on a date."""
        return str(self._instance(flight_number, date)["status"])

    def toolset(self) -> ToolSet:
        names = ["book_reservation", "calculate", "cancel_reservation", "get_reservation_details", "get_user_details",
                 "list_all_airports", "search_direct_flight", "search_onestop_flight", "send_certificate",
                 "transfer_to_human_agents", "update_reservation_baggages", "update_reservation_flights",
                 "update_reservation_passengers", "get_flight_status"]
        return toolset(self, names, READ)
