"""shopping: a bundle bought over sessions on WebShop-sized pages (MemoryArena's Bundled Web Shopping shape).

Subtask k buys one product of category k. From the second on it must fit a product bought in an
earlier subtask j: its fit code (every search result's title shows one) must be the code listed under
``compatible_with`` on the product page of j's purchase, which is shown once, in subtask j. Each
subtask searches (a page of ``results`` products), opens one product page (title, price, rating,
options, ``bullets`` feature bullets, a description of ``description_words`` words, specifications)
and buys from that page. SR: every purchase fits.

Defaults: WebShop shows 10 results per search page (``PRODUCT_WINDOW = 10`` in its engine) and item
pages built from Amazon listings, whose "about this item" section has up to 5 bullets; the
description length is our choice, of the order of those listings' descriptions.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from flowstate.eval.suites.pages import code, prose, sentence, words
from flowstate.eval.task import Answer, Call, Decision, Facts, Need, Score, Task, at_most, seeded
from flowstate.tools import Tool, ToolSet

CATEGORIES = ["camera", "lens", "flash", "tripod", "gimbal", "microphone", "monitor", "recorder", "battery", "charger",
              "cage", "filter", "light", "cable", "case", "remote"]
PAGE_FIELDS = ("asin", "title", "price", "rating", "reviews")  # a product page's fields beside its specifications
BRANDS = ["Arlo", "Benro", "Corvo", "Deltra", "Elio", "Fenwick", "Gala", "Helix", "Ivra", "Jolt"]


@dataclass(frozen=True)
class Product:
    asin: str
    category: str
    title: str
    price: float
    rating: float
    fit: str  # the code in its title
    compatible: str  # what fits it, told on its page only
    page: dict[str, Any]


class ShoppingTask(Task):
    suite = "shopping"

    def __init__(self, task_id: str, shelves: list[list[Product]], correct: list[Product], depends: list[int]) -> None:
        first = correct[0]
        queries = [f"Buy the {first.category} with fit code {first.fit}: search, open its product page, buy it there."]
        queries += [
            f"Buy a {correct[k].category} for the {correct[j - 1].category} I bought earlier: its fit code must be "
            f"the code the {correct[j - 1].category}'s product page lists under compatible_with. Search, "
            "open its product "
            "page, buy it there."
            for k, j in enumerate(depends, start=1)
        ]
        super().__init__(task_id, queries)
        self.shelves, self.correct, self.depends = shelves, correct, depends
        self.products = {p.asin: p for shelf in shelves for p in shelf}

    def new_env(self) -> dict[str, Any]:
        return {"day": 1, "open": None, "bought": {}}

    def tools(self, env: dict[str, Any]) -> ToolSet:
        def search(query: str) -> dict[str, Any]:
            """Search the store; returns the first page of results (asin, title, price, rating)."""
            shelf = next((s for s in self.shelves if s[0].category in query.lower()), None)
            if shelf is None:
                raise ValueError(f"no results for {query!r}")
            return {"query": query, "page": 1, "results": [
                {"asin": p.asin, "title": p.title, "price": f"${p.price:.2f}", "rating": p.rating} for p in shelf]}

        def view(asin: str) -> dict[str, Any]:
            """Open a product's page (features, description, specifications); buying happens from this page."""
            if asin not in self.products:
                raise ValueError(f"no product {asin!r}")
            env["open"] = asin
            return self.products[asin].page

        def buy(asin: str) -> dict[str, Any]:
            """Buy the product whose page is open."""
            if env["open"] != asin:
                raise ValueError(f"open the product page of {asin} first")
            env["bought"][env["day"]] = asin
            return {"order": f"ORD-{env['day']}{asin[-4:]}", "asin": asin, "status": "confirmed"}

        return ToolSet([Tool.from_function(search), Tool.from_function(view), Tool.from_function(buy)])

    def distill(self, tool: str, result: Any) -> dict[str, Any]:
        """The facts of a page as read: a search page's every product by the fit code its title shows; a product
        page's fields (its specifications included) under the category its title names."""
        if not isinstance(result, dict):
            return {}
        if tool == "search":
            return {f"offer_{r['title'].split('fit ')[1].split()[0]}": r["asin"] for r in result.get("results", [])}
        if tool == "view":
            category = next((c for c in CATEGORIES if f" {c} fit " in str(result.get("title", ""))), "product")
            fields = {k: v for k, v in result.items() if k in PAGE_FIELDS}
            return {f"{category}_{k}": v for k, v in {**fields, **result.get("specifications", {})}.items()}
        if tool == "buy":
            return {"bought": result.get("asin")}
        return {}

    def durable(self, key: str) -> bool:
        # the product a request opened (it buys and names it) and what a later product must fit; not the rest
        return key.endswith(("_asin", "_compatible_with"))

    def needs(self, k: int) -> tuple[str, ...]:
        return (self._fits(k),) if k > 1 else ()

    def _fits(self, k: int) -> str:
        """The fact subtask k must fit: what the page of the product its query names lists under compatible_with."""
        return f"{self.correct[self.depends[k - 2] - 1].category}_compatible_with"

    def _offer(self, k: int, facts: Facts, code_: str | None) -> Decision:
        mine = facts.get(f"{self.correct[k - 1].category}_asin")  # the product page this request opened
        if mine is not None and facts.get("bought") == mine:
            return Answer(f"Bought {mine}.")
        if mine is not None:
            return Call("buy", {"asin": mine})
        shelf = {p.asin for p in self.shelves[k - 1]}
        # this request's search page (earlier requests' pages, if in view, list other categories)
        offers = {key[len("offer_"):]: v for key, v in facts.items() if key.startswith("offer_") and v in shelf}
        if not shelf & set(offers.values()):
            return Call("search", {"query": self.correct[k - 1].category})
        if code_ is None:  # no memory of what it must fit: the top result
            asin = self.shelves[k - 1][0].asin
        else:
            asin = offers.get(code_, self.shelves[k - 1][0].asin)
        return Call("view", {"asin": asin})

    def solve(self, k: int, facts: Facts) -> Decision:
        if k == 1:
            return self._offer(1, facts, self.correct[0].fit)
        key = self._fits(k)
        offers = self._offer(k, facts, None)
        if not isinstance(offers, Call) or offers.tool != "view":
            return offers  # searching, and buying from the page opened, need nothing from memory
        if key not in facts:
            return Need((key,))
        return self._offer(k, facts, str(facts[key]))

    def guess(self, k: int, facts: Facts) -> Call | Answer:
        decision = self._offer(k, facts, None)
        assert not isinstance(decision, Need)
        return decision

    def check(self, k: int, response: str | None, env: Any) -> Score:
        ok = env["bought"].get(k) == self.correct[k - 1].asin
        return Score(ok, float(ok))

    def success(self, scores: list[Score]) -> bool:
        return bool(scores) and all(s.correct for s in scores)


def _product(rng: random.Random, category: str, fit: str, compatible: str, bullets: int, description: int) -> Product:
    asin = "B0" + "".join(rng.choice("0123456789ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(8))
    brand = rng.choice(BRANDS)
    title = f"{brand} {words(rng, 5)} {category} fit {fit} {words(rng, 6)}"
    price, rating = round(rng.uniform(15, 400), 2), round(rng.uniform(3.2, 4.9), 1)
    page = {
        "asin": asin, "title": title, "price": f"${price:.2f}", "rating": rating,
        "reviews": rng.randint(12, 4800),
        "options": {"color": [words(rng, 1) for _ in range(3)], "size": ["S", "M", "L"][: rng.randint(1, 3)]},
        "about": [sentence(rng, rng.randint(14, 24)) for _ in range(bullets)],
        "description": prose(rng, description),
        "specifications": {
            "brand": brand, "model": f"{brand[:3].upper()}-{rng.randint(100, 999)}", "fit": fit,
            "compatible_with": compatible, "weight": f"{rng.randint(80, 2400)} g",
            "dimensions": f"{rng.randint(4, 40)} x {rng.randint(4, 40)} x {rng.randint(2, 20)} cm",
            "warranty": f"{rng.choice([1, 2, 3])} years",
        },
    }
    return Product(asin, category, title, price, rating, fit, compatible, page)


OPTIONS = {"results": 10, "bullets": 5, "description_words": 150}
"""Search results per page, bullets and description words per product page (its size options, with defaults)."""


def generate(tasks: int, depth: int, seed: int, results: int = OPTIONS["results"], bullets: int = OPTIONS["bullets"],
             description_words: int = OPTIONS["description_words"]) -> list[Task]:
    at_most("shopping", depth, len(CATEGORIES))
    if results < 2:
        raise ValueError("shopping needs at least 2 results per page (one fits, the rest do not)")
    out: list[Task] = []
    for i, rng in seeded("shopping", seed, tasks):
        correct: list[Product] = []
        shelves: list[list[Product]] = []
        depends: list[int] = []
        for k in range(1, depth + 1):
            category = CATEGORIES[k - 1]
            if k == 1:
                fit = code(rng)
            else:
                j = rng.randint(1, k - 1)
                depends.append(j)
                fit = correct[j - 1].compatible
            right = _product(rng, category, fit, code(rng), bullets, description_words)
            decoy_fits: set[str] = set()
            while len(decoy_fits) < results - 1:
                c = code(rng)
                if c != fit:
                    decoy_fits.add(c)
            shelf = [right] + [_product(rng, category, c, code(rng), bullets, description_words)
                               for c in sorted(decoy_fits)]
            rng.shuffle(shelf)
            if shelf[0] is right:  # the top result never fits by chance: a guess must fail
                shelf[0], shelf[1] = shelf[1], shelf[0]
            correct.append(right)
            shelves.append(shelf)
        out.append(ShoppingTask(f"shopping-{seed}-{i}", shelves, correct, depends))
    return out
