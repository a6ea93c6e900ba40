"""A small reader of the Prometheus text exposition format, for the metrics tests.

Names come from otel/CONTRACT.md through sidecar_support (METRIC, ENGINE_METRIC): these tests
spell no metric name themselves.
"""

from __future__ import annotations

import re
import urllib.error
import urllib.request

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of an exposition: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        labels = dict(_LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, float(m.group(3))))
    return out


class Samples:
    """The samples of one scrape, summed by name and a subset of labels."""

    def __init__(self, text: str):
        self.text = text
        self.samples = parse(text)

    def total(self, name: str, **labels: str) -> float:
        return sum(v for n, l, v in self.samples if n == name and all(l.get(k) == x for k, x in labels.items()))

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.samples)

    def series(self, name: str) -> list[dict[str, str]]:
        return [l for n, l, _ in self.samples if n == name]


def scrape(base: str, key: str | None = None, accept: str | None = None) -> tuple[int, str, str]:
    """GET {base}/metrics: (status, content type, body)."""
    headers = {}
    if key:
        headers["authorization"] = f"Bearer {key}"
    if accept:
        headers["accept"] = accept
    req = urllib.request.Request(base + "/metrics", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.headers.get("content-type", ""), r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("content-type", ""), e.read().decode()
