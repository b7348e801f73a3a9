"""``flowstate bench redaction``: how well redaction's detectors find what they should and leave what they should
not, on a fixed corpus: positives of every kind written as people and programs write them, and look-alikes an agent's
memory is full of (order and booking numbers, dates, prices, hashes, ids, versions, tracking numbers, checksum-invalid
cards and IBANs). Per kind: true positives, false positives, misses, precision and recall — and the time per text.

A found value counts as a true positive when its span is exactly an expected value's; a span found where none was
expected (or of another kind) is a false positive; an expected value not found exactly, a miss."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from flowstate.bench.table import table
from flowstate.store.redaction import KINDS, Detector

# (text, [(kind, value), ...]): every value the text holds; look-alikes hold none
POSITIVES: list[tuple[str, list[tuple[str, str]]]] = [
    ("Reach me at alice.smith@example.com tomorrow.", [("email", "alice.smith@example.com")]),
    ("Send it to BOB+travel@Mail.Example.co.uk please", [("email", "BOB+travel@Mail.Example.co.uk")]),
    ("mailto:support@airline-help.org", [("email", "support@airline-help.org")]),
    ("(email: mia.li_3668@gmail.com)", [("email", "mia.li_3668@gmail.com")]),
    ("cc: o'brien@dublin.ie, x.y@sub.domain.example",
     [("email", "o'brien@dublin.ie"), ("email", "x.y@sub.domain.example")]),
    ("My e-mail is noah.muller@posteo.de.", [("email", "noah.muller@posteo.de")]),
    ("Call me at (415) 555-2671.", [("phone", "(415) 555-2671")]),
    ("phone: 415-555-2671", [("phone", "415-555-2671")]),
    ("my number is +1 415 555 2671", [("phone", "+1 415 555 2671")]),
    ("London office +44 20 7946 0958", [("phone", "+44 20 7946 0958")]),
    ("Berlin: +49 30 901820", [("phone", "+49 30 901820")]),
    ("Paris +33 1 42 68 53 00 ext", [("phone", "+33 1 42 68 53 00")]),
    ("Mobile +91 98765 43210", [("phone", "+91 98765 43210")]),
    ("text 212.555.0199 when you land", [("phone", "212.555.0199")]),
    ("ring 6502530000 after 5", [("phone", "6502530000")]),
    ("Card: 4111 1111 1111 1111", [("card", "4111 1111 1111 1111")]),
    ("pay with 4012888888881881 today", [("card", "4012888888881881")]),
    ("MC 5555-5555-5555-4444 exp 12/27", [("card", "5555-5555-5555-4444")]),
    ("card 5105105105105100", [("card", "5105105105105100")]),
    ("Amex 3782 822463 10005", [("card", "3782 822463 10005")]),
    ("amex 371449635398431 cvv 1234", [("card", "371449635398431")]),
    ("Discover 6011 1111 1111 1117", [("card", "6011 1111 1111 1117")]),
    ("JCB 3530111333300000", [("card", "3530111333300000")]),
    ("Diners 30569309025904", [("card", "30569309025904")]),
    ("IBAN DE89 3704 0044 0532 0130 00", [("iban", "DE89 3704 0044 0532 0130 00")]),
    ("to GB82WEST12345698765432 by Friday", [("iban", "GB82WEST12345698765432")]),
    ("FR1420041010050500013M02606", [("iban", "FR1420041010050500013M02606")]),
    ("account ES91 2100 0418 4502 0005 1332", [("iban", "ES91 2100 0418 4502 0005 1332")]),
    ("IT60X0542811101000000123456 (Milano)", [("iban", "IT60X0542811101000000123456")]),
    ("NL91ABNA0417164300", [("iban", "NL91ABNA0417164300")]),
    ("iban: CH9300762011623852957", [("iban", "CH9300762011623852957")]),
    ("PL61 1090 1014 0000 0712 1981 2874", [("iban", "PL61 1090 1014 0000 0712 1981 2874")]),
    ("aws key AKIAIOSFODNN7EXAMPLE in the config", [("secret", "AKIAIOSFODNN7EXAMPLE")]),
    ("token ghp_123456789012345678901234567890abcdef", [("secret", "ghp_123456789012345678901234567890abcdef")]),
    ("glpat-abcdefghij0123456789 for CI", [("secret", "glpat-abcdefghij0123456789")]),
    ("slack xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
     [("secret", "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx")]),
    ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", [("secret", "sk_live_4eC39HqLyjWDarjtT1zdp7dc")]),
    ("Authorization: Bearer sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD",
     [("secret", "sk-proj-abcdefghijklmnopqrstuvwxyz0123456789ABCD")]),
    ("jwt eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
     [("secret",
       "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U")]),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7V\n-----END RSA PRIVATE KEY-----",
     [("secret", "-----BEGIN RSA PRIVATE KEY-----\nMIIEpAIBAAKCAQEA7V\n-----END RSA PRIVATE KEY-----")]),
    ('db_password = "hunter2secret"', [("secret", "hunter2secret")]),
    ("postgres://admin:s3cr3tpass@db.example.com/app", [("secret", "s3cr3tpass")]),
    ("FlowState key fs-Q2xhdWRlIHdhcyBoZXJlIGFuZCBsZWZ0IGEga2V5IGJlaGluZA",
     [("secret", "fs-Q2xhdWRlIHdhcyBoZXJlIGFuZCBsZWZ0IGEga2V5IGJlaGluZA")]),
    ("Book for Mia Li, mia.li@example.com, +1 (212) 555-0199, card 4111111111111111",
     [("email", "mia.li@example.com"), ("phone", "+1 (212) 555-0199"), ("card", "4111111111111111")]),
]
LOOK_ALIKES: list[str] = [
    "Order #4155552671 shipped on 2024-05-15.",
    "order no. 4155552671 is delayed",
    "Reservation 8GF4XK, flight HAT170 from JFK to LAX.",
    "user_id mia_li_3668, payment_id credit_card_4421486",
    "It costs $1,234.56 (EUR 1.099,00) incl. tax.",
    "Dates: 15/05/2024, 05-15-2024, 2024.05.15, 12:30:45",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "md5 d41d8cd98f00b204e9800998ecf8427e, commit 3f9a2c1",
    "uuid 123e4567-e89b-12d3-a456-426614174000",
    "UPS tracking 1Z999AA10123456784",
    "ISBN 978-3-16-148410-0, version v1.2.3-rc.4",
    "card 1234 5678 9012 3456 is not valid",
    "IBAN DE89 3704 0044 0532 0130 01 has a bad checksum",
    "write to user@localhost or @alice on twitter",
    "10.0.0.1 and 192.168.1.254 are private",
    "ticket 5551234 was closed",
    "coordinates 37.7749, -122.4194",
    "total 1,000,000 passengers in 2023",
    "Please reset your password and keep your token of appreciation.",
    "SKU 123-456-7890-12, batch 20240515",
    "the weather is nice today and the sky is blue",
    "invoice 2024-000123 for 3 nights at $189/night",
    "Flight UA 1234 departs 06:45, gate B22, seat 14C",
    "confirmation number 7018332146",
    "case id 4155552671 escalated",
    "ref: 9780306406157 (book)",
    "Done. 1126.04 1497.65",  # τ³ retail's gold answers and calculator calls (found by its gold replay: see the page)
    'calculate({"expression": "256.67 - 226.49"})',
]

# Written after the detectors' rules were set and run once as they are (not tuned on): the results page reports them
HELD_OUT_POSITIVES: list[tuple[str, list[tuple[str, str]]]] = [
    ("Please email jean-luc.picard@starfleet.example.org about it",
     [("email", "jean-luc.picard@starfleet.example.org")]),
    ("contact: Sales@ACME-Corp.io", [("email", "Sales@ACME-Corp.io")]),
    ("Tel. +61 2 9374 4000 (Sydney)", [("phone", "+61 2 9374 4000")]),
    ("my cell is 020 7946 0018", [("phone", "020 7946 0018")]),  # a UK number without +44: read as a US one
    ("call 1-800-555-0199 for help", [("phone", "1-800-555-0199")]),
    ("Visa ending 4242 4242 4242 4242", [("card", "4242 4242 4242 4242")]),
    ("card no 6011-0009-9013-9424", [("card", "6011-0009-9013-9424")]),
    ("Überweisung an AT61 1904 3002 3457 3201", [("iban", "AT61 1904 3002 3457 3201")]),
    ("BE71 0961 2345 6769 is my account", [("iban", "BE71 0961 2345 6769")]),
    ("export OPENAI_API_KEY=sk-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst",
     [("secret", "sk-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst")]),
    ("token: xoxp-2222222222-3333333333-4444444444-abcdefabcdefabcdefabcdefabcdefab",
     [("secret", "xoxp-2222222222-3333333333-4444444444-abcdefabcdefabcdefabcdefabcdefab")]),
    ("AWS_SECRET_ACCESS_KEY='wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY'",
     [("secret", "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY")]),
]
HELD_OUT_LOOK_ALIKES: list[str] = [
    "Room 4521, floor 12, building 7", "Call at 10:30 on 2025-01-04", "Price: 1299.99 USD, qty 3",
    "Tracking: 9400111899223197428490", "PNR ZX9QWE, e-ticket 0162345678901",
    "git sha 4b825dc642cb6eb9a060e54bf8d69288fbee4904", "customer id 88213377, loyalty 5521-8876",
    "version 2024.10.1 build 18873", "phone home when you can", "The password policy requires 12 characters",
    "SSN format is XXX-XX-XXXX", "ISBN-13 9781861972712",
]

_PAT = "github_pat_11AB4CDEF0aBcDeFgHiJkLmN_" + "q1W2e3R4t5Y6u7I8o9P0aSdFgHjKlZxCvBnMqWeRtYuIoPaSdFgHjKlZxCvBnM1"
_AWS = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
_SK = "sk-proj-Xy7kP2mQ9vR4tL8wN3bZ6cF1hJ5dG0sA_qE7rT2yU9iO4pK8lM3nB6vC1xZ5-TbLf0GqW2eR4tY6uI8oP0aS2dF4gH"
_ANT = ("sk-ant-api03-Zx8cV7bN6mQ5wE4rT3yU2iO1pA0sD9fG8hJ7kL6zX5cV4bN3mQ2wE1rT0yU9iO8pA7sD6fG5hJ4kL3zX2cV1bN0mQ9wE8r"
        "T7y-AbCdEfAA")
# per credential format: (texts each holding one secret, and the value), and look-alikes of that format that must stay
SECRET_FORMATS: dict[str, tuple[list[tuple[str, str]], list[str]]] = {
    "github fine-grained token": (
        [(f"token {_PAT}", _PAT), (f"GITHUB_TOKEN={_PAT}", _PAT), (f'{{"auth": "{_PAT}"}}', _PAT),
         (f"use {_PAT}.", _PAT)],
        ["set github_pat_ to your token", "the github_pat_placeholder variable", "GITHUB_TOKEN=${{ secrets.PAT }}"]),
    "github classic token": (
        [("token ghp_123456789012345678901234567890abcdef", "ghp_123456789012345678901234567890abcdef"),
         ("gho_16C7e42F292c6912E7710c838347Ae178B4a in the log", "gho_16C7e42F292c6912E7710c838347Ae178B4a")],
        ["ghp_ tokens start with ghp_", "commit 4b825dc642cb6eb9a060e54bf8d69288fbee4904"]),
    "aws access key id": (
        [("aws key AKIAIOSFODNN7EXAMPLE in the config", "AKIAIOSFODNN7EXAMPLE"),
         ("aws_access_key_id = AKIAI44QH8DHBEXAMPLE", "AKIAI44QH8DHBEXAMPLE")],
        ["AKIA is the prefix of an access key id", "order AKIA-2024-0515"]),
    "aws secret access key": (
        [(f"AWS_SECRET_ACCESS_KEY={_AWS}", _AWS), (f"aws_secret_access_key = {_AWS}", _AWS),
         (f"AWS_SECRET_ACCESS_KEY='{_AWS}'", _AWS), (f'{{"aws_secret_access_key": "{_AWS}"}}', _AWS),
         (f"my aws secret key is {_AWS}", _AWS), (f"export AWS_SECRET_KEY: {_AWS}", _AWS)],
        ["AWS_SECRET_ACCESS_KEY=${AWS_SECRET_ACCESS_KEY}", "aws_secret_access_key = <your secret key>",
         "the aws secret access key is 40 characters long",
         "sha1 " + "da39a3ee5e6b4b0d3255bfef95601890afd80709", "path s3://bucket/2024/05/15/reports/q2/summary.csv"]),
    "sk- api key (OpenAI, Anthropic, others)": (
        [(f"my key {_SK} please", _SK),
         ("OPENAI_API_KEY=sk-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst",
          "sk-abcdefghijklmnopqrstT3BlbkFJabcdefghijklmnopqrst"),
         (f"the key {_ANT} works", _ANT),
         ("deepseek sk-3f9a2c1b7d4e4f6a8b0c2d4e6f8a0b1c", "sk-3f9a2c1b7d4e4f6a8b0c2d4e6f8a0b1c")],
        ["a sk-learn-compatible-estimator-wrapper", "desk-2024-05-15", "task-4155552671-retry",
         "sk-12 is a size", "sku sk-0042 in stock"]),
    "google api key": (
        [("key=AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY&q=paris", "AIzaSyD-9tSrke72PouQMnMX-a7eZSW0jkFMBWY")],
        ["AIza is how Google API keys start", "Aizawa, Kenji"]),
    "hugging face token": (
        [("HF_TOKEN=hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh", "hf_AbCdEfGhIjKlMnOpQrStUvWxYzAbCdEfGh")],
        ["from huggingface_hub import hf_hub_download", "hf_transfer_enabled_by_default_for_big_files"]),
    "npm token": (
        [("//registry.npmjs.org/:_authToken=npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789",
          "npm_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789")],
        ["npm_config_cache=/tmp/npm-cache", "npm_package_version=1.2.3"]),
    "slack token": (
        [("slack xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx",
          "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx")],
        ["xoxb- is a bot token's prefix"]),
    "stripe key": (
        [("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "sk_live_4eC39HqLyjWDarjtT1zdp7dc")],
        ["use sk_live_ keys only in production"]),
    "private key": (
        [("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----",
          "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----")],
        ["-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----"]),
}
FORMAT_LOOK_ALIKES = [  # what an agent's memory is full of, for every format at once
    "Order #4155552671 shipped on 2024-05-15T12:30:45Z.", "uuid 123e4567-e89b-12d3-a456-426614174000",
    "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "md5 d41d8cd98f00b204e9800998ecf8427e",
    "Reservation 8GF4XK, flight HAT170", "timestamp 1715776245123, build 2024.10.1+18873",
    "image sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "tracking 1Z999AA10123456784, PNR ZX9QWE", "base64 aGVsbG8gd29ybGQsIHRoaXMgaXMgbm90IGEga2V5IGF0IGFsbA==",
]


def formats(detector: Detector | None = None) -> list[dict[str, Any]]:
    """Per credential format: its texts' secrets found exactly or missed, and anything found in its look-alikes (and,
    as a row of its own, in the look-alikes common to all)."""
    detector = detector or Detector(kinds=("secret",))
    out = []
    cases = {**SECRET_FORMATS, "(look-alikes of every format)": ([], FORMAT_LOOK_ALIKES)}
    for name, (positives, alikes) in cases.items():
        found = sum(any(text[f.start:f.end] == value for f in detector.find(text)) for text, value in positives)
        wrong = sum(sum(text[f.start:f.end] != value for f in detector.find(text)) for text, value in positives)
        wrong += sum(len(detector.find(text)) for text in alikes)
        out.append({"format": name, "texts": len(positives), "found": found, "missed": len(positives) - found,
                    "look_alikes": len(alikes), "false_positives": wrong,
                    "precision": round(found / (found + wrong), 3) if found + wrong else None,
                    "recall": round(found / len(positives), 3) if positives else None})
    return out


def run(detector: Detector | None = None, held_out: bool = False) -> dict[str, Any]:
    """Counts per kind over the corpus (``held_out``: the held-out one), and the time per text."""
    detector = detector or Detector()
    tp, fp, fn = Counter[str](), Counter[str](), Counter[str]()
    positives, alikes = (HELD_OUT_POSITIVES, HELD_OUT_LOOK_ALIKES) if held_out else (POSITIVES, LOOK_ALIKES)
    texts = [(t, v) for t, v in positives] + [(t, []) for t in alikes]
    started = time.perf_counter()
    found_all = [detector.find(text) for text, _ in texts]
    seconds = time.perf_counter() - started
    for (text, expected), found in zip(texts, found_all):
        want = Counter(expected)
        for f in found:
            got = (f.kind, text[f.start:f.end])
            if want[got] > 0:
                want[got] -= 1
                tp[f.kind] += 1
            else:
                fp[f.kind] += 1
        for (kind, _), n in want.items():
            fn[kind] += n
    return {"tp": tp, "fp": fp, "fn": fn, "texts": len(texts), "ms_per_text": 1000 * seconds / len(texts)}


def tau3(detector: Detector | None = None) -> list[dict[str, Any]]:
    """Records nobody wrote for this bench: τ³'s retail and airline databases (every user record holds one e-mail
    address; ids, prices, addresses, dates and payment-method ids everywhere else) and its tasks' user scenarios.
    Per table: records, e-mails found, anything else found (each a false positive here: these files hold no phone
    number, card, IBAN or secret). Empty without τ³'s data (the ``tau3`` extra)."""
    import json

    from flowstate.eval.tau3.domain import load

    detector = detector or Detector()
    out = []
    for domain in ("retail", "airline"):
        try:
            data = load(domain)
        except ValueError:
            return []
        db = json.loads(data.db_bytes)
        sources = {name: list(db[name].values()) for name in db} | {
            "tasks": [t.get("user_scenario", t) for t in data.tasks]}
        for name, records in sources.items():
            kinds = Counter(f.kind for r in records for f in detector.find(json.dumps(r, ensure_ascii=False)))
            out.append({"source": f"{domain} {name}", "records": len(records), "emails": kinds.pop("email", 0),
                        "emails_expected": len(records) if name == "users" else None,
                        "other_found": sum(kinds.values())})
    return out


def rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for kind in (*KINDS, "all"):
        tp, fp, fn = (sum(result[k].values()) if kind == "all" else result[k][kind] for k in ("tp", "fp", "fn"))
        out.append({"kind": kind, "found": tp, "false_positives": fp, "missed": fn,
                    "precision": round(tp / (tp + fp), 3) if tp + fp else None,
                    "recall": round(tp / (tp + fn), 3) if tp + fn else None})
    return out


def render_table(result: dict[str, Any], held_out: list[dict[str, Any]] | None = None,
                 fresh: dict[str, Any] | None = None) -> str:
    head = ["kind", "found", "false_positives", "missed", "precision", "recall"]
    out = (f"The corpus: {len(POSITIVES)} texts with values, {len(LOOK_ALIKES)} look-alikes; "
           f"{result['ms_per_text']:.2f} ms per text\n\n" + table(head, rows(result)))
    if fresh is not None:
        out += (f"\n\nThe held-out corpus: {len(HELD_OUT_POSITIVES)} texts with values, {len(HELD_OUT_LOOK_ALIKES)} "
                "look-alikes\n\n" + table(head, rows(fresh)))
    if held_out:
        out += "\n\nτ³'s data:\n\n" + table(["source", "records", "emails", "emails_expected", "other_found"], held_out)
    per = formats()
    out += ("\n\nSecrets per credential format (each format's texts and look-alikes):\n\n"
            + table(["format", "texts", "found", "missed", "look_alikes", "false_positives", "precision", "recall"],
                    per))
    return out
