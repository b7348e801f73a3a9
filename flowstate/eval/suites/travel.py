"""travel: travellers join a group trip over sessions; each needs a hotel feature, told once by
``register``; every subtask chooses the hotel for everyone so far. sPS credits each traveller's
satisfied need; PS counts correct subtasks over all subtasks (as MemoryArena does for travel)."""

from __future__ import annotations

from typing import Any

from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, at_most, seeded
from flowstate.tools import Tool, ToolSet

FEATURES = ["pool", "pets", "quiet", "gym", "view", "parking", "garden", "spa"]
HOTELS = ["Aurora", "Bastion", "Corral", "Delta", "Ember", "Foxglove"]
NAMES = ["Ana", "Ben", "Chloe", "Dev", "Eva", "Femi", "Gus", "Hana", "Ivo", "Jun", "Kai", "Lea", "Milo", "Nia", "Omar",
         "Pia"]


class TravelTask(Task):
    suite = "travel"

    def __init__(self, task_id: str, travellers: list[str], needs: dict[str, str],
                 hotels: dict[str, list[str]]) -> None:
        queries = [
            f"{name} joins the group trip. Register {name} with the register tool, then choose the hotel for the "
            "whole group with the choose tool: it must have every feature that any traveller so far needs."
            for name in travellers
        ]
        super().__init__(task_id, queries)
        self.travellers, self.requirements, self.hotels = travellers, needs, hotels

    def new_env(self) -> dict[str, Any]:
        return {"day": 1, "chosen": {}}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def register(name: str) -> dict[str, str]:
            """Register a traveller; returns the hotel feature they need."""
            if name not in self.requirements:
                raise ValueError(f"no traveller {name!r}")
            return {f"need_{name.lower()}": self.requirements[name]}

        def hotels() -> dict[str, str]:
            """The hotels and their features."""
            return {h: ", ".join(f) for h, f in self.hotels.items()}

        def choose(hotel: str) -> dict[str, str]:
            """Choose the group's hotel."""
            if hotel not in self.hotels:
                raise ValueError(f"no hotel {hotel!r}")
            env["chosen"][env["day"]] = hotel
            return {f"chosen_day{env['day']}": hotel}

        return ToolSet([Tool.from_function(register), Tool.from_function(hotels), Tool.from_function(choose)])

    def _pick(self, k: int, facts: Facts, needed: list[str]) -> Call | Answer:
        if any(h not in facts for h in self.hotels):
            return Call("hotels", {})
        fits = [h for h in sorted(self.hotels) if all(n in str(facts[h]).split(", ") for n in needed)]
        hotel = fits[0] if fits else sorted(self.hotels)[0]
        return Answer(f"Chose {hotel}.") if f"chosen_day{k}" in facts else Call("choose", {"hotel": hotel})

    def solve(self, k: int, facts: Facts) -> Decision:
        name = self.travellers[k - 1]
        if f"need_{name.lower()}" not in facts:
            return Call("register", {"name": name})
        keys = [f"need_{t.lower()}" for t in self.travellers[:k]]
        missing = tuple(key for key in keys if key not in facts)
        if missing:
            return Need(missing)
        return self._pick(k, facts, [str(facts[key]) for key in keys])

    def needs(self, k: int) -> tuple[str, ...]:
        return tuple(f"need_{t.lower()}" for t in self.travellers[: k - 1])

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        keys = [f"need_{t.lower()}" for t in self.travellers[:k]]
        return self._pick(k, facts, [str(facts[key]) for key in keys if key in facts])

    def check(self, k: int, response: str | None, env: Any) -> Score:
        chosen = env["chosen"].get(k)
        features = self.hotels.get(chosen, []) if chosen else []
        needs = [self.requirements[t] for t in self.travellers[:k]]
        met = sum(n in features for n in needs)
        return Score(met == len(needs), met / len(needs))


def generate(tasks: int, depth: int, seed: int) -> list[Task]:
    at_most("travel", depth, len(NAMES))
    out: list[Task] = []
    for i, rng in seeded("travel", seed, tasks):
        travellers = rng.sample(NAMES[:8] if depth <= 8 else NAMES, depth)  # depth ≤ 8: the tasks of old
        target = rng.sample(FEATURES, 4)
        needs = {t: target[j % 4] if j < 4 else rng.choice(target) for j, t in enumerate(travellers)}
        names = rng.sample(HOTELS, 5)
        hotels = {names[0]: sorted(target)}
        for h in names[1:]:  # decoys: each has some travellers' needs but not all
            hotels[h] = sorted(rng.sample(target, 2) + rng.sample([f for f in FEATURES if f not in target], 1))
        out.append(TravelTask(f"travel-{seed}-{i}", travellers, needs, hotels))
    return out
