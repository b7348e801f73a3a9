"""hotel: a booking, then price changes; switch only if the new price plus the cancellation fee of
the booking held beats its price (the paper's Figure 1 family). The fee and price of a booking are
told once, by the ``book`` call that made it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, says, seeded
from flowstate.tools import Tool, ToolSet

HOTELS = ["Alder", "Birch", "Cedar", "Dune", "Elm", "Fjord", "Grove", "Heath"]
CITIES = ["Lisbon", "Porto", "Seville", "Valencia", "Bologna", "Ghent"]


@dataclass(frozen=True)
class Offer:
    hotel: str
    price: int
    switch: bool  # the right decision
    holding: int  # the day whose booking is in force before this subtask


class HotelTask(Task):
    suite = "hotel"

    def __init__(self, task_id: str, city: str, rates: dict[str, tuple[int, int]], first: str,
                 offers: list[Offer]) -> None:
        queries = [f"Book hotel {first} for my stay in {city}."]
        queries += [
            f"Hotel {o.hotel} now offers {o.price} per night. Switching costs that price plus the cancellation "
            f"fee of the booking I hold. If that total is below what my booking costs per night, book {o.hotel} "
            "and answer SWITCH; otherwise answer KEEP."
            for o in offers
        ]
        super().__init__(task_id, queries)
        self.rates, self.first, self.offers = rates, first, offers

    def new_env(self) -> dict[str, Any]:
        return {"day": 1, "booking": None, "booked": {}}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def book(hotel: str) -> dict[str, Any]:
            """Book a hotel (replacing any booking held); returns the price per night and cancellation fee."""
            if hotel not in self.rates:
                raise ValueError(f"no hotel {hotel!r}")
            day = env["day"]
            offer = self.offers[day - 2] if day >= 2 else None
            price = offer.price if offer is not None and offer.hotel == hotel else self.rates[hotel][0]
            env["booking"] = hotel
            env["booked"][day] = hotel
            return {f"hotel_day{day}": hotel, f"price_day{day}": price, f"fee_day{day}": self.rates[hotel][1]}

        return ToolSet([Tool.from_function(book)])

    def solve(self, k: int, facts: Facts) -> Decision:
        if k == 1:
            return Answer(f"Booked {self.first}.") if "hotel_day1" in facts else Call("book", {"hotel": self.first})
        offer = self.offers[k - 2]
        keys = (f"price_day{offer.holding}", f"fee_day{offer.holding}")
        if any(key not in facts for key in keys):
            return Need(keys)
        if offer.price + int(facts[keys[1]]) >= int(facts[keys[0]]):
            return Answer("KEEP")
        if f"hotel_day{k}" in facts:
            return Answer(f"SWITCH: booked {offer.hotel}.")
        return Call("book", {"hotel": offer.hotel})

    def needs(self, k: int) -> tuple[str, ...]:
        if k == 1:
            return ()
        holding = self.offers[k - 2].holding
        return (f"price_day{holding}", f"fee_day{holding}")

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        return Answer("KEEP")

    def check(self, k: int, response: str | None, env: Any) -> Score:
        if k == 1:
            ok = env["booked"].get(1) == self.first
        else:
            offer = self.offers[k - 2]
            word, other = ("SWITCH", "KEEP") if offer.switch else ("KEEP", "SWITCH")
            acted = env["booked"].get(k) == offer.hotel if offer.switch else k not in env["booked"]
            ok = says(response, word) and not says(response, other) and acted
        return Score(ok, float(ok))


def generate(tasks: int, depth: int, seed: int) -> list[Task]:
    out: list[Task] = []
    for i, rng in seeded("hotel", seed, tasks):
        names = rng.sample(HOTELS, 5)
        rates = {h: (rng.randrange(150, 301, 10), rng.randrange(20, 101, 10)) for h in names}
        first = names[0]
        held_hotel, held_price, held_fee, held_day = first, rates[first][0], rates[first][1], 1
        offers = []
        for k in range(2, depth + 1):
            hotel = rng.choice([h for h in names if h != held_hotel])
            switch = rng.random() < 0.5
            margin = rng.randrange(10, 41, 10)
            price = held_price - held_fee - margin if switch else held_price - held_fee + margin
            if price < 40:  # cannot undercut by enough: make it a clear keep
                switch, price = False, held_price - held_fee + margin
            offers.append(Offer(hotel, price, switch, held_day))
            if switch:
                held_hotel, held_price, held_fee, held_day = hotel, price, rates[hotel][1], k
        out.append(HotelTask(f"hotel-{seed}-{i}", rng.choice(CITIES), rates, first, offers))
    return out
