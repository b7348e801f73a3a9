"""chain: measurements whose later subtasks reuse every earlier reading (a running total), checked exactly.

A sample is consumed by its first measurement, so a reading exists only in the observation of
the subtask that took it.
"""

from __future__ import annotations

from typing import Any

from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, at_most, numbers, seeded
from flowstate.tools import Tool, ToolSet

SAMPLES = ["amber", "basalt", "cobalt", "dolomite", "emerald", "flint", "garnet", "halite", "iolite", "jasper",
           "kyanite", "lapis", "marble", "nacre", "onyx", "pyrite"]


class ChainTask(Task):
    suite = "chain"

    def __init__(self, task_id: str, samples: list[str], readings: list[int]) -> None:
        queries = [f"Measure sample {samples[0]} with the measure tool and tell me its reading."]
        queries += [
            f"Measure sample {s} and tell me the running total: the sum of all readings so far, this one included."
            for s in samples[1:]
        ]
        super().__init__(task_id, queries)
        self.samples, self.readings = samples, readings

    def new_env(self) -> dict[str, Any]:
        return {"measured": set()}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def measure(sample: str) -> dict[str, int]:
            """Measure a sample once (measuring consumes it); returns its reading."""
            if sample not in self.samples:
                raise ValueError(f"no sample {sample!r}")
            if sample in env["measured"]:
                raise ValueError(f"sample {sample} was consumed by its first measurement")
            env["measured"].add(sample)
            i = self.samples.index(sample)
            return {f"reading_{i + 1}": self.readings[i]}

        return ToolSet([Tool.from_function(measure)])

    def solve(self, k: int, facts: Facts) -> Decision:
        if f"reading_{k}" not in facts:
            return Call("measure", {"sample": self.samples[k - 1]})
        missing = tuple(f"reading_{j}" for j in range(1, k) if f"reading_{j}" not in facts)
        if missing:
            return Need(missing)
        total = sum(int(facts[f"reading_{j}"]) for j in range(1, k + 1))
        return Answer(f"Reading: {total}" if k == 1 else f"Running total: {total}")

    def needs(self, k: int) -> tuple[str, ...]:
        return tuple(f"reading_{j}" for j in range(1, k))

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        known = [int(facts[f"reading_{j}"]) for j in range(1, k + 1) if f"reading_{j}" in facts]
        return Answer(f"Running total: {sum(known)}")

    def check(self, k: int, response: str | None, env: Any) -> Score:
        ok = sum(self.readings[:k]) in numbers(response)
        return Score(ok, float(ok))


def generate(tasks: int, depth: int, seed: int) -> list[Task]:
    at_most("chain", depth, len(SAMPLES))
    out: list[Task] = []
    for i, rng in seeded("chain", seed, tasks):
        samples = rng.sample(SAMPLES, depth)
        out.append(ChainTask(f"chain-{seed}-{i}", samples, [rng.randint(11, 97) for _ in samples]))
    return out
