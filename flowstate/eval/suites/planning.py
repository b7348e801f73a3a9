"""planning: a group trip planned over sessions on TravelPlanner-sized tables (MemoryArena's Group
Travel Planning shape).

Each subtask adds a traveller, arriving on a day of their own, and books one thing for them: a
flight, a stay or a dinner, in turn.
The first booking of each kind has its requirement in the query; every later one is relative to an
earlier traveller's booking of that kind (land no later than their flight; the same room type and at
least their review rate; their restaurant's main cuisine), whose details were told once, by the
booking confirmation of that earlier subtask. Each subtask searches a table (what is offered on its
day), books from it and answers.

Tables have TravelPlanner's columns (its Flights, Accommodations and Restaurants databases, which
return every row for a route and date or a city). Row counts — ``flights`` per route and date,
``stays`` and ``restaurants`` per city — are options; the defaults are our choice, of the order those
databases return for one city.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from flowstate.eval.suites.pages import words
from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, at_most, seeded
from flowstate.tools import Tool, ToolSet

NAMES = ["Ana", "Ben", "Chloe", "Dev", "Eva", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Milo", "Nia", "Omar",
         "Pia"]
CITIES = ["Austin", "Boise", "Chicago", "Denver", "El Paso", "Fresno", "Greenville", "Houston", "Irvine", "Jackson",
          "Knoxville", "Lubbock", "Memphis", "Norfolk", "Omaha", "Phoenix", "Raleigh", "Tampa"]
DESTINATIONS = ["Seattle", "Portland", "San Diego", "Savannah"]
ROOMS = ["Entire home/apt", "Private room", "Shared room"]
RULES = ["No parties", "No smoking", "No pets", "No visitors", "No children under 10"]
CUISINES = ["Chinese", "Italian", "Mexican", "Indian", "Thai", "French", "Japanese", "Bakery", "Cafe", "Seafood",
            "BBQ", "Pizza", "Desserts", "Fast Food", "Mediterranean"]
KINDS = ("flight", "stay", "dinner")


def day_of(k: int) -> str:
    """Traveller k arrives on day k of the trip."""
    return f"2022-03-{10 + k:02d}"


def _minutes(hhmm: str) -> int:
    h, m = hhmm.split(":")
    return int(h) * 60 + int(m)


class PlanningTask(Task):
    suite = "planning"

    def __init__(self, task_id: str, city: str, travellers: list[str], origins: list[str], relative: list[int | None],
                 absolute: list[dict[str, Any]], flights: dict[str, list[dict[str, Any]]],
                 stays: dict[int, list[dict[str, Any]]], restaurants: dict[int, list[dict[str, Any]]]) -> None:
        self.city, self.travellers, self.origins, self.relative = city, travellers, origins, relative
        self.absolute, self.flights, self.stays, self.restaurants = absolute, flights, stays, restaurants
        self._correct: dict[int, str] = {}  # each subtask's right choice, computed once (it reads every earlier one)
        queries = [self._query(k) for k in range(1, len(travellers) + 1)]
        super().__init__(task_id, queries)

    def kind(self, k: int) -> str:
        return KINDS[(k - 1) % 3]

    def _query(self, k: int) -> str:
        p, j, a = self.travellers[k - 1], self.relative[k - 1], self.absolute[k - 1]
        q = self.travellers[j - 1] if j else ""
        kind = self.kind(k)
        if kind == "flight":
            base = (f"{p} joins the trip to {self.city} on {day_of(k)}. Book {p} the cheapest flight from "
                    f"{self.origins[k - 1]} that day")
            return base + (f" that lands no later than {q}'s flight, so they share a transfer." if j else ".")
        if kind == "stay":
            if j:
                return (f"{p} joins the trip to {self.city} on {day_of(k)}. Book {p} the cheapest accommodation there "
                        f"that day with the same room type as {q}'s and a review rate at least as high as {q}'s.")
            return (f"{p} joins the trip to {self.city} on {day_of(k)}. Book {p} the cheapest {a['room']} there that "
                    f"day with a review rate of at least {a['review']}.")
        if j:
            return (f"{p} joins the trip to {self.city} on {day_of(k)}. Reserve dinner for {p} that day at the "
                    f"highest-rated restaurant there, other than {q}'s, that serves the main cuisine of {q}'s dinner "
                    "reservation.")
        return (f"{p} joins the trip to {self.city} on {day_of(k)}. Reserve dinner for {p} that day at "
                f"the highest-rated restaurant there that serves {a['cuisine']}.")

    def new_env(self) -> dict[str, Any]:
        return {"day": 1, "booked": {}}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def search_flights(origin: str, destination: str, date: str) -> dict[str, Any]:
            """Every flight from origin to destination on a date (YYYY-MM-DD)."""
            k = self.origins.index(origin) + 1 if origin in self.origins else 0
            if destination != self.city or not k or date != day_of(k):
                return {"flights": [], "note": f"There is no flight from {origin} to {destination} on {date}."}
            return {"origin": origin, "destination": destination, "date": date, "flights": self.flights[origin]}

        def search_accommodations(city: str, date: str) -> dict[str, Any]:
            """Every accommodation in a city with a room free on a date (YYYY-MM-DD)."""
            return {"city": city, "date": date, "accommodations": self._offered(self.stays, city, date)}

        def search_restaurants(city: str, date: str) -> dict[str, Any]:
            """Every restaurant in a city with a table free on a date (YYYY-MM-DD)."""
            return {"city": city, "date": date, "restaurants": self._offered(self.restaurants, city, date)}

        def booked(rows: Any, field: str, value: str, missing: str) -> dict[str, Any]:
            """The row whose ``field`` is ``value``, booked for the day (or why it cannot be)."""
            row: dict[str, Any] | None = next((r for r in rows if r[field] == value), None)
            if row is None:
                raise ValueError(missing)
            env["booked"][env["day"]] = value
            return row

        def book_flight(flight_number: str, traveller: str) -> dict[str, Any]:
            """Book a flight for a traveller; the confirmation gives its times."""
            row = booked((r for rows in self.flights.values() for r in rows), "flight_number", flight_number,
                         f"no flight {flight_number!r}")
            return {"traveller": traveller, "flight_number": flight_number, "departs": row["dep_time"],
                    "arrives": row["arr_time"], "price": row["price"],
                    "confirmation": f"FL-{env['day']:02d}{flight_number[-3:]}"}

        def book_accommodation(name: str, traveller: str) -> dict[str, Any]:
            """Book an accommodation for a traveller; the confirmation gives its room type and review rate."""
            row = booked(self.stays.get(env["day"], []), "name", name,
                         f"no accommodation {name!r} with a room free that day")
            return {"traveller": traveller, "name": name, "room_type": row["room_type"],
                    "review_rate": row["review_rate"], "price": row["price"], "confirmation": f"AC-{env['day']:02d}"}

        def reserve_restaurant(name: str, traveller: str) -> dict[str, Any]:
            """Reserve dinner at a restaurant for a traveller; the confirmation gives its main cuisine."""
            row = booked(self.restaurants.get(env["day"], []), "name", name,
                         f"no restaurant {name!r} with a table free that day")
            return {"traveller": traveller, "restaurant": name, "main_cuisine": row["cuisines"].split(", ")[0],
                    "average_cost": row["average_cost"], "confirmation": f"RS-{env['day']:02d}"}

        return ToolSet([Tool.from_function(f) for f in (search_flights, search_accommodations, search_restaurants,
                                                       book_flight, book_accommodation, reserve_restaurant)])

    def distill(self, tool: str, result: Any) -> dict[str, Any]:
        if not isinstance(result, dict):
            return {}
        who = str(result.get("traveller", "")).lower()
        if tool == "search_flights":
            return {f"flights_{result.get('origin')}": result.get("flights", [])}
        if tool == "search_accommodations":
            return {f"stays_{result.get('date')}": result.get("accommodations", [])}
        if tool == "search_restaurants":
            return {f"restaurants_{result.get('date')}": result.get("restaurants", [])}
        if tool == "book_flight":
            return {f"{who}_flight": result["flight_number"], f"{who}_arrives": result["arrives"]}
        if tool == "book_accommodation":
            return {f"{who}_stay": result["name"], f"{who}_room": result["room_type"],
                    f"{who}_review": result["review_rate"]}
        if tool == "reserve_restaurant":
            return {f"{who}_dinner": result["restaurant"], f"{who}_cuisine": result["main_cuisine"]}
        return {}

    def durable(self, key: str) -> bool:
        return not key.startswith(("flights_", "stays", "restaurants"))

    def _keys(self, j: int) -> tuple[str, ...]:
        q = self.travellers[j - 1].lower()
        return {"flight": (f"{q}_arrives",), "stay": (f"{q}_room", f"{q}_review"),
                "dinner": (f"{q}_dinner", f"{q}_cuisine")}[self.kind(j)]

    def needs(self, k: int) -> tuple[str, ...]:
        j = self.relative[k - 1]
        return self._keys(j) if j else ()

    def choice(self, k: int, facts: Facts) -> str:
        """The row a subtask books, given the facts about the earlier booking it is relative to (if any)."""
        kind, j, a = self.kind(k), self.relative[k - 1], self.absolute[k - 1]
        if kind == "flight":
            rows = self.flights[self.origins[k - 1]]
            if j:
                latest = _minutes(str(facts[self._keys(j)[0]]))
                rows = [r for r in rows if _minutes(r["arr_time"]) <= latest]
            return str(min(rows, key=lambda r: r["price"])["flight_number"])
        if kind == "stay":
            room, review = (facts[self._keys(j)[0]], facts[self._keys(j)[1]]) if j else (a["room"], a["review"])
            rows = [r for r in self.stays[k] if r["room_type"] == room and r["review_rate"] >= float(review)]
            return str(min(rows, key=lambda r: r["price"])["name"])
        if j:
            other, cuisine = facts[self._keys(j)[0]], facts[self._keys(j)[1]]
        else:
            other, cuisine = None, a["cuisine"]
        rows = [r for r in self.restaurants[k] if cuisine in r["cuisines"].split(", ") and r["name"] != other]
        return str(max(rows, key=lambda r: r["aggregate_rating"])["name"])

    def _act(self, k: int, facts: Facts, choice: str | None) -> Decision:
        kind, p = self.kind(k), self.travellers[k - 1]
        booked = facts.get(f"{p.lower()}_{kind}")
        if booked is not None:
            return Answer(f"Booked {booked} for {p}.")
        table = {"flight": f"flights_{self.origins[k - 1]}", "stay": f"stays_{day_of(k)}",
                 "dinner": f"restaurants_{day_of(k)}"}[kind]
        if table not in facts:
            if kind == "flight":
                return Call("search_flights",
                            {"origin": self.origins[k - 1], "destination": self.city, "date": day_of(k)})
            return Call(f"search_{'accommodations' if kind == 'stay' else 'restaurants'}",
                        {"city": self.city, "date": day_of(k)})
        if choice is None:  # no memory of the earlier booking: the best row of the whole table
            rows = facts[table]
            if kind == "dinner":
                choice = str(max(rows, key=lambda r: r["aggregate_rating"])["name"])
            else:
                choice = str(min(rows, key=lambda r: r["price"])["flight_number" if kind == "flight" else "name"])
        tool = {"flight": "book_flight", "stay": "book_accommodation", "dinner": "reserve_restaurant"}[kind]
        arg = "flight_number" if kind == "flight" else "name"
        return Call(tool, {arg: choice, "traveller": p})

    def solve(self, k: int, facts: Facts) -> Decision:
        first = self._act(k, facts, "")
        if not isinstance(first, Call) or first.tool.startswith("search"):
            return first  # searching, and answering once booked, need nothing from memory
        missing = tuple(key for key in self.needs(k) if key not in facts)
        if missing:
            return Need(missing)
        return self._act(k, facts, self.choice(k, facts))

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        decision = self._act(k, facts, None if self.relative[k - 1] else self.choice(k, facts))
        assert not isinstance(decision, Need)
        return decision

    def redrawn(self, k: int) -> None:
        """Subtask k's tables were drawn again (while the task is built): its right choice is computed anew."""
        self._correct.pop(k, None)

    def correct(self, k: int) -> str:
        if k not in self._correct:  # without it, subtask k recomputed every earlier one's: 2^k choices
            self._correct[k] = self.choice(k, self._facts(k - 1))
        return self._correct[k]

    def _facts(self, upto: int) -> dict[str, Any]:
        """What the correct bookings of subtasks 1..upto told (their confirmations' facts)."""
        facts: dict[str, Any] = {}
        for j in range(1, upto + 1):
            p = self.travellers[j - 1].lower()
            chosen = self.correct(j)
            if self.kind(j) == "flight":
                row = next(r for rows in self.flights.values() for r in rows if r["flight_number"] == chosen)
                facts[f"{p}_arrives"] = row["arr_time"]
            elif self.kind(j) == "stay":
                row = next(r for r in self.stays[j] if r["name"] == chosen)
                facts.update({f"{p}_room": row["room_type"], f"{p}_review": row["review_rate"]})
            else:
                row = next(r for r in self.restaurants[j] if r["name"] == chosen)
                facts.update({f"{p}_dinner": chosen, f"{p}_cuisine": row["cuisines"].split(", ")[0]})
        return facts

    def _offered(self, tables: dict[int, list[dict[str, Any]]], city: str, day: str) -> list[dict[str, Any]]:
        k = next((k for k in tables if day_of(k) == day), 0)
        return tables[k] if k and city == self.city else []

    def check(self, k: int, response: str | None, env: Any) -> Score:
        booked = env["booked"].get(k)
        met = self.constraints(k, booked)
        return Score(booked == self.correct(k), sum(met) / len(met))

    def constraints(self, k: int, booked: str | None) -> list[bool]:
        """Whether the booking meets each requirement its query states: the day's table (route or city), the
        requirement on the earlier booking it is relative to (or the query's own), and the cheapest (highest-rated)
        of the rows meeting the rest."""
        kind, j, a = self.kind(k), self.relative[k - 1], self.absolute[k - 1]
        facts = self._facts(j) if j else {}
        tests: list[Callable[[dict[str, Any]], bool]]
        if kind == "flight":
            rows, key = self.flights[self.origins[k - 1]], "flight_number"
            tests = [lambda r: _minutes(r["arr_time"]) <= _minutes(str(facts[self._keys(j)[0]]))] if j else []
        elif kind == "stay":
            rows, key = self.stays[k], "name"
            room, review = (facts[self._keys(j)[0]], facts[self._keys(j)[1]]) if j else (a["room"], a["review"])
            tests = [lambda r: r["room_type"] == room, lambda r: r["review_rate"] >= float(review)]
        else:
            rows, key = self.restaurants[k], "name"
            other, cuisine = (facts[self._keys(j)[0]], facts[self._keys(j)[1]]) if j else (None, a["cuisine"])
            tests = [lambda r: cuisine in r["cuisines"].split(", "), lambda r: r["name"] != other]
        row = next((r for r in rows if r[key] == booked), None)
        if row is None:  # nothing booked, or a row of another day or route: no requirement met
            return [False] * (len(tests) + 2)
        return [True, *(test(row) for test in tests), booked == self.correct(k)]

    def success(self, scores: list[Score]) -> bool:
        return bool(scores) and all(s.correct for s in scores)


def _flights(rng: random.Random, city: str, origin: str, k: int, n: int) -> list[dict[str, Any]]:
    rows = []
    for number in rng.sample(range(1000, 9999), n):
        dep = rng.randrange(5 * 60, 20 * 60, 5)
        span = rng.randrange(90, 330, 5)
        rows.append({"flight_number": f"F{number}", "price": rng.randint(80, 600),
                     "dep_time": f"{dep // 60:02d}:{dep % 60:02d}",
                     "arr_time": f"{(dep + span) // 60:02d}:{(dep + span) % 60:02d}",
                     "actual_elapsed_time": f"{span // 60} hours {span % 60} minutes", "flight_date": day_of(k),
                     "origin_city": origin, "dest_city": city, "distance": rng.randint(300, 2600)})
    return rows


def _places(rng: random.Random, city: str, n: int) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """The city's accommodations and restaurants (each day offers some of them)."""
    places: dict[str, dict[str, Any]] = {}
    while len(places) < n:
        name = f"{words(rng, 3).title()} {rng.choice(['Loft', 'Studio', 'Suite', 'Apartment', 'Cottage', 'Room'])}"
        places[name] = {"name": name, "price": 0, "room_type": rng.choice(ROOMS),
                        "house_rules": " & ".join(rng.sample(RULES, rng.randint(1, 3))),
                        "minimum_nights": rng.randint(1, 5), "maximum_occupancy": rng.randint(1, 8),
                        "review_rate": float(rng.randint(1, 5)), "city": city}
    eateries: dict[str, dict[str, Any]] = {}
    while len(eateries) < n:
        name = f"{words(rng, 2).title()} {rng.choice(['Kitchen', 'Grill', 'House', 'Bistro', 'Diner', 'Eatery'])}"
        eateries[name] = {"name": name, "average_cost": rng.randint(10, 120),
                          "cuisines": ", ".join(rng.sample(CUISINES, rng.randint(1, 4))),
                          "aggregate_rating": round(rng.uniform(2.5, 4.9), 1), "city": city}
    return places, eateries


def _build(rng: random.Random, task_id: str, depth: int, flights: int, stays: int, restaurants: int) -> PlanningTask:
    """A task whose every subtask has one right row, and a wrong one for a guess without memory.

    Each subtask's table is drawn again until that holds, given the earlier subtasks' bookings.
    """
    city = rng.choice(DESTINATIONS)
    travellers = rng.sample(NAMES, depth)
    origins = rng.sample(CITIES, depth)
    places, eateries = _places(rng, city, 3 * max(stays, restaurants))
    relative: list[int | None] = []
    absolute: list[dict[str, Any]] = []
    for k in range(1, depth + 1):
        earlier = [j for j in range(1, k) if KINDS[(j - 1) % 3] == KINDS[(k - 1) % 3]]
        relative.append(rng.choice(earlier) if earlier else None)
        absolute.append({"room": rng.choice(ROOMS[:2]), "review": float(rng.randint(2, 4)),
                         "cuisine": rng.choice(CUISINES)})
    flight_rows: dict[str, list[dict[str, Any]]] = {}
    stay_rows: dict[int, list[dict[str, Any]]] = {}
    food_rows: dict[int, list[dict[str, Any]]] = {}
    task = PlanningTask(task_id, city, travellers, origins, relative, absolute, flight_rows, stay_rows, food_rows)
    for k in range(1, depth + 1):
        for _ in range(500):
            flight_rows[origins[k - 1]] = _flights(rng, city, origins[k - 1], k, flights)
            stay_rows[k] = [{**places[n], "price": rng.randint(40, 900)} for n in rng.sample(sorted(places), stays)]
            food_rows[k] = [dict(eateries[n]) for n in rng.sample(sorted(eateries), restaurants)]
            task.redrawn(k)
            try:
                right = task.correct(k)
            except ValueError:  # a requirement no row meets
                continue
            if not relative[k - 1]:
                break
            seen = {"flights_" + origins[k - 1]: flight_rows[origins[k - 1]], f"stays_{day_of(k)}": stay_rows[k],
                    f"restaurants_{day_of(k)}": food_rows[k]}
            guess = task.guess(k, seen)  # the table's best row, ignoring the earlier booking: must be wrong
            if not isinstance(guess, Call):
                break
            if guess.arguments.get("flight_number", guess.arguments.get("name")) != right:
                break
        else:
            raise ValueError(f"cannot generate planning subtask {k} with {flights} flights, {stays} stays and "
                             f"{restaurants} restaurants per table; use larger tables")
    return task


OPTIONS = {"flights": 12, "stays": 20, "restaurants": 20}
"""Rows of each table a subtask reads (its size options, with their defaults)."""


def generate(tasks: int, depth: int, seed: int, flights: int = OPTIONS["flights"], stays: int = OPTIONS["stays"],
             restaurants: int = OPTIONS["restaurants"]) -> list[Task]:
    at_most("planning", depth, len(NAMES))
    out: list[Task] = []
    for i, rng in seeded("planning", seed, tasks):
        out.append(_build(rng, f"planning-{seed}-{i}", depth, flights, stays, restaurants))
    return out
