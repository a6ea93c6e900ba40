"""A small inventory ledger: items, stock movements and reorder reports."""

from dataclasses import dataclass, field
from datetime import date


@dataclass
class Item:
    sku: str
    name: str
    unit_price: float
    reorder_level: int = 10
    quantity: int = 0


@dataclass
class Movement:
    sku: str
    change: int
    day: date
    note: str = ""


@dataclass
class Ledger:
    items: dict = field(default_factory=dict)
    movements: list = field(default_factory=list)

    def add_item(self, item):
        if item.sku in self.items:
            raise ValueError(f"duplicate sku {item.sku}")
        self.items[item.sku] = item

    def receive(self, sku, amount, day, note=""):
        if amount <= 0:
            raise ValueError("amount must be positive")
        item = self.items[sku]
        item.quantity += amount
        self.movements.append(Movement(sku, amount, day, note))

    def ship(self, sku, amount, day, note=""):
        item = self.items[sku]
        if amount > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} in stock")
        item.quantity -= amount
        self.movements.append(Movement(sku, -amount, day, note))

    def stock_value(self):
        total = 0.0
        for item in self.items.values():
            total += item.quantity * item.unit_price
        return round(total, 2)

    def needs_reorder(self):
        return [item for item in self.items.values() if item.quantity <= item.reorder_level]

    def history(self, sku):
        return [m for m in self.movements if m.sku == sku]


def compute_totals(ledger, start, end):
    received = 0
    shipped = 0
    for m in ledger.movements:
        if start <= m.day <= end:
            if m.change > 0:
                received += m.change
            else:
                shipped -= m.change
    return received, shipped


def turnover(ledger, sku, start, end):
    received, shipped = compute_totals(filtered(ledger, sku), start, end)
    item = ledger.items[sku]
    if item.quantity == 0:
        return float(shipped)
    return shipped / item.quantity


def filtered(ledger, sku):
    view = Ledger()
    view.items = {sku: ledger.items[sku]}
    view.movements = ledger.history(sku)
    return view


def reorder_report(ledger):
    lines = ["sku      name                 qty  level"]
    for item in sorted(ledger.needs_reorder(), key=lambda i: i.sku):
        lines.append(f"{item.sku:<8} {item.name:<20} {item.quantity:>4} {item.reorder_level:>6}")
    if len(lines) == 1:
        lines.append("(nothing to reorder)")
    return "\n".join(lines)


def period_report(ledger, start, end):
    received, shipped = compute_totals(ledger, start, end)
    lines = [f"period {start.isoformat()} to {end.isoformat()}"]
    lines.append(f"received: {received}")
    lines.append(f"shipped:  {shipped}")
    lines.append(f"net:      {received - shipped}")
    lines.append(f"value:    {ledger.stock_value():.2f}")
    return "\n".join(lines)


def busiest_items(ledger, start, end, limit=3):
    counts = {}
    for m in ledger.movements:
        if start <= m.day <= end and m.change < 0:
            counts[m.sku] = counts.get(m.sku, 0) - m.change
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ranked[:limit]


def load_items(rows):
    ledger = Ledger()
    for row in rows:
        sku, name, price, level = row
        ledger.add_item(Item(sku, name, float(price), int(level)))
    return ledger


def apply_movements(ledger, rows):
    for sku, kind, amount, day in rows:
        if kind == "in":
            ledger.receive(sku, int(amount), day)
        elif kind == "out":
            ledger.ship(sku, int(amount), day)
        else:
            raise ValueError(f"unknown movement kind {kind}")
    return ledger


def summary(ledger, start, end):
    received, shipped = compute_totals(ledger, start, end)
    busiest = busiest_items(ledger, start, end)
    return {
        "received": received,
        "shipped": shipped,
        "value": ledger.stock_value(),
        "reorder": [item.sku for item in ledger.needs_reorder()],
        "busiest": busiest,
    }


if __name__ == "__main__":
    ledger = load_items([
        ("A100", "bolts", "0.10", "500"),
        ("B200", "nuts", "0.05", "800"),
        ("C300", "washers", "0.02", "1000"),
    ])
    apply_movements(ledger, [
        ("A100", "in", "1200", date(2026, 1, 5)),
        ("B200", "in", "900", date(2026, 1, 6)),
        ("A100", "out", "300", date(2026, 1, 9)),
        ("C300", "in", "400", date(2026, 1, 10)),
    ])
    print(period_report(ledger, date(2026, 1, 1), date(2026, 1, 31)))
    print(reorder_report(ledger))
    print(summary(ledger, date(2026, 1, 1), date(2026, 1, 31)))
