"""reasoning: a derivation over sessions whose later steps reuse earlier results exactly (MemoryArena's
Formal Reasoning shape).

Subtask 1 computes a mass from a density; each later subtask combines the result of an earlier
subtask j with a constant looked up in a handbook table — one property at one temperature, a page of
``rows`` materials with several columns, a page of its own for each subtask — through the
calculator, and reports the value. An earlier result exists only in the
calculator's answer of its subtask and in that subtask's response.

The page size is our choice: a reference table the size of a printed handbook page; MemoryArena's
reasoning subtasks carry long derivations that play the same part in a full-context prompt.
"""

from __future__ import annotations

from typing import Any

from flowstate.eval.arith import evaluate
from flowstate.eval.suites.pages import words
from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, seeded
from flowstate.tools import Tool, ToolSet

MATERIALS = ["aluminium", "brass", "bronze", "copper", "gold", "granite", "ice", "iron", "lead", "marble", "nickel",
             "oak", "platinum", "quartz", "silver", "steel", "tin", "titanium", "tungsten", "zinc", "glass", "nylon",
             "rubber", "pine", "concrete", "sandstone", "cobalt", "chromium", "magnesium", "silicon", "basalt", "cork",
             "ebony", "graphite", "lithium", "sodium", "teflon", "paraffin", "porcelain", "slate", "beryllium",
             "cadmium", "calcium", "germanium", "hafnium", "indium", "iridium", "manganese", "molybdenum", "niobium",
             "osmium", "palladium", "rhodium", "tantalum", "vanadium", "zirconium", "asphalt", "bamboo", "brick",
             "cement", "diamond", "epoxy", "feldspar", "gypsum", "kevlar", "limestone", "mica", "obsidian", "polyester"]
TOPICS = {  # topic: (column, unit, operation on the earlier result, phrase)
    "density": ("density", "g/cm3", "/", "the volume in cm3 that a block of {m} with the mass from step {j} takes"),
    "specific heat": ("specific_heat", "J/(g K)", "*",
                      "the heat in J that warms the mass from step {j}, made of {m}, by 1 K"),
    "thermal expansion": ("expansion", "1e-6/K", "*",
                          "the product of the result of step {j} and the expansion coefficient of {m}"),
    "speed of sound": ("sound_speed", "m/s", "/",
                       "the time in s that sound takes through {m} over the distance from step {j} in m"),
}
def fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e-3 or abs(x) >= 1e7 else f"{round(x, 4)}"


class ReasoningTask(Task):
    suite = "reasoning"

    def __init__(self, task_id: str, tables: list[list[dict[str, Any]]], steps: list[tuple[str, str, int, int]],
                 side: int) -> None:
        self.tables, self.steps, self.side = tables, steps, side
        m0, t0 = steps[0][1], steps[0][3]
        queries = [f"Step 1: look up the density of {m0} at {t0} K in the handbook and compute with the calculator "
                   f"the mass in g of a cube of {m0} with {side} cm sides. Report the value."]
        for k, (topic, m, j, temp) in enumerate(steps[1:], start=2):
            phrase = TOPICS[topic][3].format(m=m, j=j)
            queries.append(f"Step {k}: look up the {topic} of {m} at {temp} K in the handbook and compute with the "
                           f"calculator {phrase}. Report the value.")
        super().__init__(task_id, queries)
        self.expected = [self.expression(k, {f"result{j}": v for j, v in enumerate(self._results(k - 1), 1)})
                         for k in range(1, len(steps) + 1)]

    def constant(self, k: int) -> float:
        topic, material = self.steps[k - 1][:2]
        return float(next(r[TOPICS[topic][0]] for r in self.tables[k - 1] if r["material"] == material))

    def expression(self, k: int, facts: Facts) -> str:
        topic, _, j, _ = self.steps[k - 1]
        c = fmt(self.constant(k))
        if k == 1:
            return f"{c} * {self.side} * {self.side} * {self.side}"
        return f"{facts[f'result{j}']} {TOPICS[topic][2]} {c}"

    def _results(self, n: int) -> list[str]:
        out: list[str] = []
        for k in range(1, n + 1):
            out.append(fmt(evaluate(self.expression(k, {f"result{j}": v for j, v in enumerate(out, 1)}))))
        return out

    def new_env(self) -> dict[str, Any]:
        return {"day": 1}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def handbook(topic: str, temperature_k: int) -> dict[str, Any]:
            """A handbook table: one property of many materials at one temperature, with notes."""
            k = next((k for k, s in enumerate(self.steps, 1) if (s[0], s[3]) == (topic, temperature_k)), 0)
            if not k:
                raise ValueError(f"no table of {topic!r} at {temperature_k} K")
            column, unit, _, _ = TOPICS[topic]
            return {"table": f"{topic} at {temperature_k} K", "column": column, "unit": unit,
                    "rows": self.tables[k - 1]}

        def calculate(expression: str) -> dict[str, Any]:
            """Evaluate an arithmetic expression (numbers, + - * /, parentheses)."""
            return {"expression": expression, "value": fmt(evaluate(expression))}

        return ToolSet([Tool.from_function(handbook), Tool.from_function(calculate)])

    def distill(self, tool: str, result: Any) -> dict[str, Any]:
        if not isinstance(result, dict):
            return {}
        if tool == "handbook":
            return {f"table_{result.get('table')}": result.get("rows", [])}
        if tool == "calculate":
            expr = result.get("expression")
            if expr in self.expected:
                return {f"result{self.expected.index(expr) + 1}": result["value"]}
            return {"calculated": result["value"], "expression": expr}
        return {}

    def durable(self, key: str) -> bool:
        return key.startswith("result")

    def needs(self, k: int) -> tuple[str, ...]:
        return (f"result{self.steps[k - 1][2]}",) if k > 1 else ()

    def _act(self, k: int, facts: Facts, expression: str | None) -> Decision:
        if f"result{k}" in facts:
            return Answer(f"Step {k}: {facts[f'result{k}']}")
        if expression is not None and facts.get("expression") == expression:
            return Answer(f"Step {k}: {facts['calculated']}")
        topic, _, _, temp = self.steps[k - 1]
        if f"table_{topic} at {temp} K" not in facts:
            return Call("handbook", {"topic": topic, "temperature_k": temp})
        if expression is None:
            return Need(self.needs(k))
        return Call("calculate", {"expression": expression})

    def solve(self, k: int, facts: Facts) -> Decision:
        known = k == 1 or f"result{self.steps[k - 1][2]}" in facts
        return self._act(k, facts, self.expression(k, facts) if known else None)

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        known = {f"result{self.steps[k - 1][2]}": "1"}  # no memory of the earlier result
        decision = self._act(k, facts, self.expression(k, known))
        assert not isinstance(decision, Need)
        return decision

    def check(self, k: int, response: str | None, env: Any) -> Score:
        want = float(self._results(k)[-1])
        got = [float(x) for x in _decimals(response)]
        ok = any(abs(g - want) <= 1e-9 + 1e-6 * abs(want) for g in got)
        return Score(ok, float(ok))


def _decimals(text: str | None) -> list[str]:
    import re

    return re.findall(r"-?\d+(?:\.\d+)?(?:e[-+]?\d+)?", text or "")


OPTIONS = {"rows": 30}
"""Rows of each table (its size option, with its default)."""


def generate(tasks: int, depth: int, seed: int, rows: int = OPTIONS["rows"]) -> list[Task]:
    if rows < 2 or rows > len(MATERIALS):
        raise ValueError(f"reasoning tables have 2 to {len(MATERIALS)} rows")
    out: list[Task] = []
    for i, rng in seeded("reasoning", seed, tasks):
        temps = rng.sample(range(250, 900, 5), depth)
        steps = [("density", "", 0, temps[0])]
        steps += [(rng.choice(list(TOPICS)), "", rng.randint(1, k - 1), temps[k - 1]) for k in range(2, depth + 1)]
        tables: list[list[dict[str, Any]]] = []
        for k, (topic, _, j, temp) in enumerate(steps, start=1):
            column, unit, _, _ = TOPICS[topic]
            listed = rng.sample(MATERIALS, rows)
            tables.append([{"material": m, column: round(rng.uniform(0.5, 20.0) if topic != "speed of sound"
                                                           else rng.uniform(300, 6000), 3),
                            "unit": unit, "temperature_K": temp, "uncertainty": f"±{rng.randint(1, 9)}%",
                            "note": words(rng, 8)} for m in listed])
            steps[k - 1] = (topic, rng.choice(listed), j, temp)
        out.append(ReasoningTask(f"reasoning-{seed}-{i}", tables, steps, rng.randint(2, 9)))
    return out
