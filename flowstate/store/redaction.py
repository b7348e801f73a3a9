"""Redaction: personal data and secrets found in text and replaced, before anything is stored, by stable placeholders.

Kinds (``KINDS``) and what finds each — maintained detectors where one fits, a candidate pattern with a checksum
where the kind is defined by one:

- ``email``: a candidate pattern, each candidate checked by ``email-validator`` (syntax only, offline);
- ``phone``: ``phonenumbers``' matcher (Google's libphonenumber metadata), numbers that are valid for their region
  (``REGION`` for numbers written without a country code; any region's with one);
- ``card``: 13–19 digits (spaces or dashes between groups) with a valid Luhn checksum (``python-stdnum``) and a
  known issuer prefix;
- ``iban``: a candidate pattern, checked by ``python-stdnum``'s IBAN validation (country length and mod-97 checksum);
- ``secret``: Yelp's ``detect-secrets`` plugins (AWS, GitHub, GitLab, OpenAI, Slack, Stripe, JWTs, private keys,
  basic-auth URLs, ``password = "…"``, and more; never its two high-entropy plugins, which flag ordinary words), a
  private key's whole PEM block, bearer tokens and FlowState's own keys (``fs-…``), and the credential formats its
  last release (1.5.0) lacks, each as its provider documents it (``PROVIDER_FORMATS``: GitHub's fine-grained
  tokens, AWS secret keys written unquoted, the ``sk-…`` keys of OpenAI, Anthropic and others in prose, Google,
  Hugging Face, npm, PyPI and more; docs/results/redaction.md measures each on its own corpus).

A placeholder names its kind and a keyed digest of the value — ``[EMAIL_3f9a2c1b7d4e]`` — so the same value gets
the same placeholder wherever it appears in a tenant's memory (``scope``), and nobody without the key can test a
guess against it. The key is the vault's (``flowstate/store/vault.py``), which also keeps each value encrypted, so a
placeholder the model writes into a tool call's arguments can be restored just before the tool runs.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from engine.distribution import install_hint
from flowstate.errors import FlowStateError

KINDS = ("email", "phone", "card", "iban", "secret")
REGION = "US"  # where a number without a country code is read as local (phonenumbers' region)
PLACEHOLDER = re.compile(r"\[(EMAIL|PHONE|CARD|IBAN|SECRET)_([0-9a-f]{12})\]")
_EMAIL = re.compile(r"(?<![\w.+%'-])[A-Za-z0-9._%+'-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.)+[A-Za-z]{2,24}(?![\w-])")
_CARD = re.compile(r"(?<![\d-])\d(?:[ -]?\d){12,18}(?![\d-])")
_ISSUERS = re.compile(r"4|5[1-5]|2[2-7]|3[47]|3[068]|35|6(?:011|5|4[4-9]|22)")
_IBAN = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2}\d{2}(?: ?[A-Z0-9]){11,30}(?![A-Za-z0-9])")
_PEM = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?-----END [A-Z ]*PRIVATE KEY-----")
_BEARER = re.compile(r"(?i)(?<=bearer )[A-Za-z0-9._~+/=-]{16,}")
_OWN_KEY = re.compile(r"(?<![\w-])fs-[A-Za-z0-9_-]{32,}")
_NOT_SECRETS = ("Base64HighEntropyString", "HexHighEntropyString", "IPPublicDetector")
_AWS_NAME = r"(?i:aws[ _.-]?secret(?:[ _.-]?access)?[ _.-]?key)"
PROVIDER_FORMATS: dict[str, re.Pattern[str]] = {  # the secret is the pattern's group 1 where it has one, else all
    "github fine-grained token": re.compile(r"(?<![\w-])github_pat_[A-Za-z0-9_]{60,255}"),
    "aws secret access key": re.compile(_AWS_NAME + r"[\"']?\s*(?:[:=]|=>|\bis\b)\s*[\"']?"
                                        r"([A-Za-z0-9/+]{40})(?![A-Za-z0-9/+=])"),
    "sk- api key": re.compile(r"(?<![\w-])sk-(?=[A-Za-z0-9_-]*\d)(?=[A-Za-z0-9_-]*[A-Za-z])[A-Za-z0-9_-]{20,}"),
    "google api key": re.compile(r"(?<![\w-])AIza[0-9A-Za-z_-]{35}(?![\w-])"),
    "hugging face token": re.compile(r"(?<![\w-])hf_[A-Za-z0-9]{34,40}(?![\w-])"),
    "npm token": re.compile(r"(?<![\w-])npm_[A-Za-z0-9]{36}(?![\w-])"),
    "pypi token": re.compile(r"(?<![\w-])pypi-AgEIcHlwaS5vcmc[A-Za-z0-9_-]{50,}"),
    "groq api key": re.compile(r"(?<![\w-])gsk_[A-Za-z0-9]{52}(?![\w-])"),
    "xai api key": re.compile(r"(?<![\w-])xai-[A-Za-z0-9]{80}(?![\w-])"),
    "databricks token": re.compile(r"(?<![\w-])dapi[a-f0-9]{32}(?:-\d)?(?![\w-])"),
    "digitalocean token": re.compile(r"(?<![\w-])do[opr]_v1_[a-f0-9]{64}(?![\w-])"),
    "shopify token": re.compile(r"(?<![\w-])shp(?:at|ca|pa|ss)_[a-fA-F0-9]{32}(?![\w-])"),
}
"""Credential formats detect-secrets 1.5.0 has no plugin for, each from its provider's documentation of the format
(a fixed prefix and alphabet; the AWS secret key, which has none, by the name it is assigned to). The ``sk-`` family
(OpenAI's ``sk-``, ``sk-proj-``, ``sk-svcacct-``, Anthropic's ``sk-ant-``, DeepSeek's and others') is one rule: ``sk-``
at a word's start and 20 or more key characters holding a digit and a letter, so "sk-learn" stays."""
_PHONE_CONTEXT = re.compile(r"(?i)\b(?:phone|call|tel|telephone|mobile|cell|fax|text|sms|whatsapp|ring|contact|"
                            r"number|dial|reach)\b")
_PRICE = re.compile(r"\d+\.\d{2}")
_TOKEN = re.compile(r"[A-Za-z0-9._~+/=-]*")  # what a secret's token may continue with (a JWT's signature, say)
# words that make a bare run of digits an identifier rather than a phone number
_NOT_A_PHONE = re.compile(r"(?i)(?:#|\b(?:order|ref|reference|reservation|booking|confirmation|invoice|account|"
                          r"acct|id|ticket|tracking|case|item|sku|po)\b[^\d\n]{0,12})$")


def parse_kinds(text: str) -> tuple[str, ...]:
    """``email,card`` as kinds; a kind that is none of ``KINDS`` is a ValueError that lists them."""
    kinds = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown redaction kind(s) {', '.join(unknown) or '(none given)'}: the kinds are "
                         f"{', '.join(KINDS)}")
    return kinds


class RedactionUnavailable(FlowStateError):
    """A detecting library is missing (the ``redact`` extra)."""


@dataclass(frozen=True)
class Found:
    """A value found in a text: its kind and where it is."""

    kind: str
    start: int
    end: int


class Detector:
    """Finds values of ``kinds`` in text; the detecting libraries are loaded on first use (the ``redact`` extra)."""

    def __init__(self, kinds: Iterable[str] = KINDS, region: str = REGION) -> None:
        self.kinds = tuple(kinds)
        unknown = sorted(set(self.kinds) - set(KINDS))
        if unknown:
            raise ValueError(f"unknown redaction kind(s) {', '.join(unknown)}: {', '.join(KINDS)}")
        self.region = region
        _ = self._libs  # a missing library is an error now, not at the first text

    @cached_property
    def _libs(self) -> dict[str, Any]:
        try:
            import email_validator
            import phonenumbers
            from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class
            from stdnum import iban, luhn
        except ImportError as exc:
            raise RedactionUnavailable(f"redaction needs {exc.name}: {install_hint('redact')}") from exc
        found: dict[str, Any] = get_mapping_from_secret_type_to_class()
        plugins = [cls() for cls in found.values() if cls.__name__ not in _NOT_SECRETS]
        return {"email": email_validator, "phonenumbers": phonenumbers, "luhn": luhn, "iban": iban, "plugins": plugins}

    def find(self, text: str) -> list[Found]:
        """The values in ``text``, in order, none overlapping (where two detectors claim overlapping spans, a secret
        wins, else the longer span)."""
        if not text or len(text) < 6:
            return []
        spans: list[Found] = []
        for kind in self.kinds:
            spans += [Found(kind, a, b) for a, b in getattr(self, f"_{kind}")(text)]
        done = [m.span() for m in PLACEHOLDER.finditer(text)]  # already redacted: never redacted again
        spans = [f for f in spans if not any(f.start < b and a < f.end for a, b in done)]
        spans.sort(key=lambda f: (f.start, -(f.end - f.start)))
        out: list[Found] = []
        for f in spans:
            if out and f.start < out[-1].end:
                if (f.kind == "secret", f.end - f.start) > (out[-1].kind == "secret", out[-1].end - out[-1].start):
                    out[-1] = f
                continue
            out.append(f)
        return out

    def _email(self, text: str) -> Iterable[tuple[int, int]]:
        if "@" not in text:
            return
        check = self._libs["email"]
        for m in _EMAIL.finditer(text):
            try:
                check.validate_email(m.group(), check_deliverability=False)
            except check.EmailNotValidError:
                continue
            yield m.span()

    def _phone(self, text: str) -> Iterable[tuple[int, int]]:
        if sum(c.isdigit() for c in text) < 7:
            return
        pn = self._libs["phonenumbers"]
        for m in pn.PhoneNumberMatcher(text, self.region, leniency=pn.Leniency.VALID):
            before = text[max(0, m.start - 24):m.start]
            if before[-1:].isalnum() or before[-1:] == "_":
                continue  # inside a word: "gift_card_3106220"
            if not m.raw_string.startswith(("+", "(")) and _NOT_A_PHONE.search(before):
                continue  # "order #4155552671", "invoice 2024-000123": an identifier, not a number to call
            if m.raw_string.isdigit() and not _PHONE_CONTEXT.search(before):
                continue  # a bare run of digits is an id ("item_id": "6469567736") unless something says phone
            if any(_PRICE.fullmatch(token) for token in re.split(r"[^\d.]+", m.raw_string)):
                continue  # amounts: "1126.04 1497.65", "256.67 - 226.49" (a number with one dot and two decimals)
            yield m.start, m.end

    def _card(self, text: str) -> Iterable[tuple[int, int]]:
        for m in _CARD.finditer(text):
            digits = re.sub(r"\D", "", m.group())
            if 13 <= len(digits) <= 19 and _ISSUERS.match(digits) and self._libs["luhn"].is_valid(digits):
                yield m.span()

    def _iban(self, text: str) -> Iterable[tuple[int, int]]:
        for m in _IBAN.finditer(text):
            if self._libs["iban"].is_valid(m.group()):
                yield m.span()

    def _secret(self, text: str) -> Iterable[tuple[int, int]]:
        yield from (m.span() for pattern in (_PEM, _BEARER, _OWN_KEY) for m in pattern.finditer(text))
        yield from (m.span(1 if pattern.groups else 0) for pattern in PROVIDER_FORMATS.values()
                    for m in pattern.finditer(text))
        values = {v for plugin in self._libs["plugins"] for v in _secrets(plugin, text) if len(v) >= 6}
        for value in values:  # each occurrence, taken on to the end of its token (a plugin may match a prefix)
            yield from ((m.start(), _TOKEN.match(text, m.end()).end())  # type: ignore[union-attr]
                        for m in re.finditer(re.escape(value), text))


def _secrets(plugin: Any, text: str) -> Iterable[str]:
    """The secret values a detect-secrets plugin finds: a pattern plugin's longest group (the secret within its
    context), or the whole match where the groups only name a prefix (``(ghp|gho)_…``: its own ``analyze_string``
    would give "ghp"); another plugin's own values."""
    patterns = getattr(plugin, "denylist", None)
    if patterns is None:
        yield from plugin.analyze_string(text)
        return
    for pattern in patterns:
        for m in pattern.finditer(text):
            longest = max((g for g in m.groups() if g), key=len, default="")
            yield longest if len(longest) >= 6 else m.group()


@dataclass
class Redacted:
    """What redaction replaced: counts per kind, and each value by its placeholder (for the vault)."""

    counts: Counter[str] = field(default_factory=Counter)
    values: dict[str, tuple[str, str]] = field(default_factory=dict)  # placeholder -> (kind, value)

    def add(self, other: Redacted) -> None:
        self.counts.update(other.counts)
        self.values.update(other.values)


class Redactor:
    """Placeholders for what ``detector`` finds, keyed by ``key`` (the vault's) within a scope (a tenant)."""

    def __init__(self, detector: Detector, key: bytes) -> None:
        self.detector, self._key = detector, key

    def placeholder(self, scope: str, kind: str, value: str) -> str:
        digest = hmac.new(self._key, f"{scope}\x00{value}".encode("utf-8", "surrogatepass"), hashlib.sha256)
        return f"[{kind.upper()}_{digest.hexdigest()[:12]}]"

    def text(self, scope: str, text: str, into: Redacted | None = None) -> str:
        """``text`` with every value found replaced by its placeholder; what was replaced goes ``into``."""
        found = self.detector.find(text)
        if not found:
            return text
        out, last = [], 0
        for f in found:
            value = text[f.start:f.end]
            ph = self.placeholder(scope, f.kind, value)
            if into is not None:
                into.counts[f.kind] += 1
                into.values[ph] = (f.kind, value)
            out += [text[last:f.start], ph]
            last = f.end
        return "".join(out) + text[last:]

    def deep(self, scope: str, value: Any, into: Redacted | None = None) -> Any:
        """Every string in a JSON value redacted (keys kept as they are)."""
        return walk(value, lambda s: self.text(scope, s, into))


def walk(value: Any, fn: Callable[[str], str]) -> Any:
    """A JSON value with ``fn`` applied to every string in it (not to keys)."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, Mapping):
        return {k: walk(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [walk(v, fn) for v in value]
    return value


def placeholders(value: Any) -> set[str]:
    """The placeholders in a JSON value."""
    found: set[str] = set()
    walk(value, lambda s: found.update(m.group() for m in PLACEHOLDER.finditer(s)) or s)  # type: ignore[func-returns-value]
    return found


def restore(value: Any, known: Mapping[str, str]) -> Any:
    """A JSON value with every placeholder in ``known`` replaced by its value (others left as they are)."""
    return walk(value, lambda s: PLACEHOLDER.sub(lambda m: known.get(m.group(), m.group()), s) if "[" in s else s)
