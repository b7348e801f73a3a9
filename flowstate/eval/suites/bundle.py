"""bundle: purchases across sessions that must fit what was bought before.

Each item plugs in through an input connector (listed by ``options``) and offers an output
connector that only its ``buy`` confirmation tells; the item bought in subtask k must take the
connector of the item bought in subtask k−1. SR: the whole bundle fits.
"""

from __future__ import annotations

from typing import Any

from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, at_most, seeded
from flowstate.tools import Tool, ToolSet

CATEGORIES = ["camera", "lens", "adapter", "filter", "flash", "grip", "monitor", "recorder", "microphone", "cage",
              "tripod", "gimbal", "battery", "charger", "cable", "case"]
CONNECTORS = ["K1", "K2", "K3", "K4", "K5", "K6", "K7", "K8", "K9"]


class BundleTask(Task):
    suite = "bundle"

    def __init__(self, task_id: str, first: str, options: list[dict[str, str]], outputs: dict[str, str],
                 correct: list[str]) -> None:
        queries = [f"Buy the {CATEGORIES[0]} {first}."]
        queries += [
            f"Buy a {CATEGORIES[k]} that fits the {CATEGORIES[k - 1]} I bought last time; the options tool lists "
            f"each {CATEGORIES[k]} with the connector it needs."
            for k in range(1, len(correct))
        ]
        super().__init__(task_id, queries)
        self.first, self.options, self.outputs, self.correct = first, options, outputs, correct

    def new_env(self) -> dict[str, Any]:
        return {"day": 1, "bought": {}}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def options(category: str) -> dict[str, str]:
            """The items of a category, each with the connector it needs."""
            if category not in CATEGORIES[1 : len(self.correct)]:
                raise ValueError(f"no options for category {category!r}")
            return dict(self.options[CATEGORIES.index(category)])

        def buy(item: str) -> dict[str, str]:
            """Buy an item; the confirmation tells the connector it offers."""
            if item not in self.outputs:
                raise ValueError(f"no item {item!r}")
            day = env["day"]
            env["bought"][day] = item
            return {f"item_day{day}": item, f"connector_day{day}": self.outputs[item]}

        return ToolSet([Tool.from_function(options), Tool.from_function(buy)])

    def solve(self, k: int, facts: Facts) -> Decision:
        if k == 1:
            return Answer(f"Bought {self.first}.") if "item_day1" in facts else Call("buy", {"item": self.first})
        listed = self.options[k - 1]
        if any(item not in facts for item in listed):
            return Call("options", {"category": CATEGORIES[k - 1]})
        need = f"connector_day{k - 1}"
        if need not in facts:
            return Need((need,))
        fits = [item for item in listed if facts[item] == facts[need]]
        item = fits[0] if fits else sorted(listed)[0]
        return Answer(f"Bought {item}.") if f"item_day{k}" in facts else Call("buy", {"item": item})

    def needs(self, k: int) -> tuple[str, ...]:
        return (f"connector_day{k - 1}",) if k > 1 else ()

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        listed = self.options[k - 1]
        if any(item not in facts for item in listed):
            return Call("options", {"category": CATEGORIES[k - 1]})
        item = sorted(listed)[0]
        return Answer(f"Bought {item}.") if f"item_day{k}" in facts else Call("buy", {"item": item})

    def check(self, k: int, response: str | None, env: Any) -> Score:
        ok = env["bought"].get(k) == self.correct[k - 1]
        return Score(ok, float(ok))

    def success(self, scores: list[Score]) -> bool:
        return bool(scores) and all(s.correct for s in scores)


def generate(tasks: int, depth: int, seed: int) -> list[Task]:
    at_most("bundle", depth, len(CATEGORIES))
    out: list[Task] = []
    for i, rng in seeded("bundle", seed, tasks):
        first = f"{CATEGORIES[0]}-{rng.randint(100, 999)}"
        outputs = {first: rng.choice(CONNECTORS)}
        options: list[dict[str, str]] = [{}]
        correct = [first]
        for k in range(1, depth):
            ids = [f"{CATEGORIES[k]}-{n}" for n in rng.sample(range(100, 1000), 3)]
            needed = outputs[correct[-1]]
            others = rng.sample([c for c in CONNECTORS if c != needed], 2)
            right = rng.choice(ids)
            listed = {item: (needed if item == right else others.pop()) for item in ids}
            options.append(listed)
            outputs.update({item: rng.choice(CONNECTORS) for item in ids})
            correct.append(right)
        out.append(BundleTask(f"bundle-{seed}-{i}", first, options, outputs, correct))
    return out
