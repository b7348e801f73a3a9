"""The hotel case (paper Figure 1) as deterministic tools and three requests.

A user books hotel A for $200 (cancellation fee $80) and plans to switch if B gets cheaper,
then arranges an airport transfer. On Sep 12, B drops to $160: switching would cost
$160 + $80 = $240 against $200, so the right answer is to keep A — which needs the
cancellation terms observed two requests earlier.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Any

from flowstate.tools import ToolSet

QUERIES: tuple[str, ...] = (
    "Today is 2026-09-01. Book me a hotel in Lisbon from 2026-09-20 to 2026-09-22. "
    "Hotel A looks best at $200; if hotel B gets cheaper later I may want to switch.",
    "Also book an airport transfer on 2026-09-20 from Lisbon airport to my hotel.",
    "Today is 2026-09-12 and I saw that hotel B dropped to $160. Should I switch?",
)

_HOTELS = {
    "A": {"name": "Hotel A (Baixa)", "price_usd": 200, "cancellation_fee_usd": 80},
    "B": {"name": "Hotel B (Alfama)", "price_usd": 240, "cancellation_fee_usd": 0},
}
_PRICE_DROP = ("B", "2026-09-12", 160)  # from this date on, B costs 160


def _price(hotel_id: str, as_of: str) -> int:
    hotel, since, price = _PRICE_DROP
    base = _HOTELS[hotel_id]["price_usd"]
    return price if hotel_id == hotel and as_of >= since else int(base)  # type: ignore[call-overload]


def search_hotels(city: str, check_in: str, check_out: str, as_of: str) -> list[dict[str, Any]]:
    """Search hotels in a city for a stay; prices are totals in USD as of the given date (YYYY-MM-DD)."""
    if city.strip().lower() != "lisbon":
        return []
    return [
        {"hotel_id": hid, "name": h["name"], "total_price_usd": _price(hid, as_of), "check_in": check_in,
         "check_out": check_out}
        for hid, h in _HOTELS.items()
    ]


def book_hotel(hotel_id: str, check_in: str, check_out: str) -> dict[str, Any]:
    """Book a hotel for a stay; returns the booking with its cancellation policy."""
    if hotel_id not in _HOTELS:
        raise ValueError(f"no hotel {hotel_id!r}")
    hotel = _HOTELS[hotel_id]
    fee = hotel["cancellation_fee_usd"]
    return {
        "booking_id": f"BK-{hotel_id}-{check_in.replace('-', '')}",
        "hotel_id": hotel_id,
        "total_price_usd": hotel["price_usd"],
        "cancellation_policy": {
            "fee_usd": fee,
            "terms": f"Cancellation at any time before check-in costs ${fee}; the fee is not refundable.",
        },
    }


def cancel_booking(booking_id: str) -> dict[str, Any]:
    """Cancel a hotel booking; returns the fee charged."""
    hotel_id = booking_id.split("-")[1] if booking_id.startswith("BK-") else ""
    if hotel_id not in _HOTELS:
        raise ValueError(f"no booking {booking_id!r}")
    return {"booking_id": booking_id, "cancelled": True, "fee_charged_usd": _HOTELS[hotel_id]["cancellation_fee_usd"]}


def book_transfer(date: str, pickup: str, dropoff: str) -> dict[str, Any]:
    """Book an airport transfer for a date (YYYY-MM-DD)."""
    return {"transfer_id": f"TR-{date.replace('-', '')}", "date": date, "pickup": pickup, "dropoff": dropoff,
            "price_usd": 35}


TOOLS = ToolSet([search_hotels, book_hotel, cancel_booking, book_transfer])

POLICY = (
    "You are a travel assistant. Book only what the user asks for. Before changing a booking, "
    "weigh every cost of the change, including cancellation fees of existing bookings."
)


def script_path() -> Path:
    """The shipped scripted-engine outputs for the three requests."""
    return Path(str(files("flowstate.demo").joinpath("hotel.jsonl")))
