"""Filler for realistic observations: deterministic words, titles, sentences and prose from a seeded rng.

Realistic suites return pages the size of the benchmarks they imitate; the facts a subtask needs sit
among text that no subtask needs, as on a real product page or search table.
"""

from __future__ import annotations

import random

WORDS = (
    "premium compact durable lightweight portable wireless adjustable ergonomic classic modern original "
    "professional heavy duty universal waterproof rechargeable stainless steel aluminum carbon fiber leather "
    "cotton bamboo silicone ceramic glass matte glossy black white silver grey navy olive walnut slim travel "
    "outdoor indoor home office studio kitchen garden daily use quick release anti slip shock resistant "
    "foldable extendable magnetic detachable padded reinforced breathable insulated sealed certified tested "
    "warranty included gift ready easy setup tool free mount clip strap case pouch kit set pack bundle series "
    "edition model version upgraded improved new design quiet efficient fast secure stable smooth precise "
    "reliable versatile flexible sturdy soft large small medium mini pro max plus ultra eco natural"
).split()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def sentence(rng: random.Random, n: int) -> str:
    text = words(rng, n)
    return text[0].upper() + text[1:] + "."


def prose(rng: random.Random, n: int) -> str:
    """About ``n`` words in sentences of 8 to 16."""
    out, left = [], n
    while left > 0:
        k = min(left, rng.randint(8, 16))
        out.append(sentence(rng, k))
        left -= k
    return " ".join(out)


def code(rng: random.Random) -> str:
    """A fit or part code such as QX-27."""
    letters = "ABCDEFGHJKLMNPQRSTUVWXYZ"
    return f"{rng.choice(letters)}{rng.choice(letters)}-{rng.randint(10, 99)}"
