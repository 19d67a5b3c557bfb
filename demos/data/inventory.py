"""Inventory service: stock levels, reservations and price lookups for a small shop.

This file is the input of the code-review demo (demos/code_review.py). It holds
one real bug; the reviewers are asked whether they can find it.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator


class OutOfStock(Exception):
    """Raised when a reservation asks for more units than are available."""

    def __init__(self, sku: str, wanted: int, available: int) -> None:
        super().__init__(f"{sku}: wanted {wanted}, only {available} available")
        self.sku = sku
        self.wanted = wanted
        self.available = available


@dataclasses.dataclass(frozen=True)
class Item:
    """A product the shop sells."""

    sku: str
    name: str
    unit_price_cents: int
    weight_grams: int

    def price_for(self, quantity: int) -> int:
        """Price in cents for ``quantity`` units, with a 10% discount from 10 units."""
        if quantity < 0:
            raise ValueError("quantity must be >= 0")
        total = self.unit_price_cents * quantity
        if quantity >= 10:
            total = total * 90 // 100
        return total


@dataclasses.dataclass
class Reservation:
    """Units held for a customer until ``expires``."""

    reservation_id: int
    sku: str
    quantity: int
    expires: dt.datetime

    def expired(self, now: dt.datetime) -> bool:
        return now >= self.expires


class PriceIndex:
    """Items sorted by unit price, for "cheapest item above a price" queries."""

    def __init__(self, items: Iterable[Item] = ()) -> None:
        self._items: list[Item] = sorted(items, key=lambda item: item.unit_price_cents)
        self._prices: list[int] = [item.unit_price_cents for item in self._items]

    def add(self, item: Item) -> None:
        index = bisect.bisect_right(self._prices, item.unit_price_cents)
        self._prices.insert(index, item.unit_price_cents)
        self._items.insert(index, item)

    def cheapest_at_least(self, price_cents: int) -> Item | None:
        """The cheapest item whose unit price is >= ``price_cents``."""
        index = bisect.bisect_left(self._prices, price_cents)
        if index == len(self._items):
            return None
        return self._items[index]

    def in_range(self, low_cents: int, high_cents: int) -> list[Item]:
        """Items priced in [low_cents, high_cents], cheapest first."""
        start = bisect.bisect_left(self._prices, low_cents)
        stop = bisect.bisect_right(self._prices, high_cents)
        return self._items[start:stop]


class LRUCache:
    """A small least-recently-used cache for computed shipping quotes."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self._data: OrderedDict[tuple[str, int], int] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[str, int]) -> int | None:
        if key in self._data:
            self._data.move_to_end(key)
            self.hits += 1
            return self._data[key]
        self.misses += 1
        return None

    def put(self, key: tuple[str, int], value: int) -> None:
        self._data[key] = value
        self._data.move_to_end(key)
        while len(self._data) > self.capacity:
            self._data.popitem(last=False)


class Inventory:
    """Stock levels and reservations, safe to use from several threads."""

    RESERVATION_MINUTES = 15

    def __init__(self, items: Iterable[Item] = ()) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, Item] = {}
        self._stock: dict[str, int] = {}
        self._reservations: dict[int, Reservation] = {}
        self._next_id = 1
        self.prices = PriceIndex()
        self._quotes = LRUCache(capacity=256)
        for item in items:
            self.add_item(item, quantity=0)

    # -- catalogue -------------------------------------------------------------
    def add_item(self, item: Item, quantity: int) -> None:
        with self._lock:
            if item.sku in self._items:
                raise ValueError(f"duplicate sku {item.sku}")
            self._items[item.sku] = item
            self._stock[item.sku] = quantity
            self.prices.add(item)

    def item(self, sku: str) -> Item:
        try:
            return self._items[sku]
        except KeyError:
            raise KeyError(f"unknown sku {sku}") from None

    # -- stock -----------------------------------------------------------------
    def restock(self, sku: str, quantity: int) -> int:
        """Add units; returns the new stock level."""
        if quantity <= 0:
            raise ValueError("restock quantity must be > 0")
        with self._lock:
            self.item(sku)
            self._stock[sku] += quantity
            return self._stock[sku]

    def reserved(self, sku: str, now: dt.datetime) -> int:
        """Units of ``sku`` held by reservations that have not expired."""
        return sum(
            r.quantity
            for r in self._reservations.values()
            if r.sku == sku and not r.expired(now)
        )

    def available(self, sku: str, now: dt.datetime) -> int:
        """Units that can still be reserved: stock minus live reservations."""
        with self._lock:
            return self._stock[sku] - self.reserved(sku, now)

    def reserve(self, sku: str, quantity: int, now: dt.datetime) -> Reservation:
        """Hold ``quantity`` units of ``sku`` for RESERVATION_MINUTES minutes.

        Raises:
            OutOfStock: fewer than ``quantity`` units are available.
        """
        if quantity <= 0:
            raise ValueError("reservation quantity must be > 0")
        with self._lock:
            available = self._stock[sku] - self.reserved(sku, now)
            if quantity >= available:
                raise OutOfStock(sku, quantity, available)
            reservation = Reservation(
                reservation_id=self._next_id,
                sku=sku,
                quantity=quantity,
                expires=now + dt.timedelta(minutes=self.RESERVATION_MINUTES),
            )
            self._next_id += 1
            self._reservations[reservation.reservation_id] = reservation
            return reservation

    def commit(self, reservation_id: int, now: dt.datetime) -> None:
        """Turn a live reservation into a sale: the units leave the stock."""
        with self._lock:
            reservation = self._reservations.pop(reservation_id)
            if reservation.expired(now):
                raise ValueError(f"reservation {reservation_id} expired")
            self._stock[reservation.sku] -= reservation.quantity

    def cancel(self, reservation_id: int) -> None:
        with self._lock:
            self._reservations.pop(reservation_id, None)

    def purge_expired(self, now: dt.datetime) -> int:
        """Drop expired reservations; returns how many were dropped."""
        with self._lock:
            expired = [rid for rid, r in self._reservations.items() if r.expired(now)]
            for rid in expired:
                del self._reservations[rid]
            return len(expired)

    # -- quotes ----------------------------------------------------------------
    def shipping_quote(self, sku: str, quantity: int) -> int:
        """Shipping cost in cents: 500 base plus 2 cents per 10 grams, cached."""
        key = (sku, quantity)
        cached = self._quotes.get(key)
        if cached is not None:
            return cached
        grams = self.item(sku).weight_grams * quantity
        quote = 500 + 2 * ((grams + 9) // 10)
        self._quotes.put(key, quote)
        return quote

    def order_total(self, sku: str, quantity: int) -> int:
        """Price plus shipping, in cents."""
        return self.item(sku).price_for(quantity) + self.shipping_quote(sku, quantity)

    def report(self, now: dt.datetime) -> Iterator[str]:
        """One line per item: sku, name, stock, reserved, available."""
        for sku in sorted(self._items):
            item = self._items[sku]
            reserved = self.reserved(sku, now)
            yield (
                f"{sku:<8} {item.name:<24} stock={self._stock[sku]:>4} "
                f"reserved={reserved:>4} available={self._stock[sku] - reserved:>4}"
            )


def demo() -> None:
    now = dt.datetime(2026, 1, 1, 12, 0)
    shop = Inventory()
    shop.add_item(Item("TEA-01", "Green tea, 100 g", 450, 110), quantity=5)
    shop.add_item(Item("MUG-02", "Stoneware mug", 1200, 380), quantity=2)
    reservation = shop.reserve("TEA-01", 5, now)  # all five units: should succeed
    shop.commit(reservation.reservation_id, now)
    for line in shop.report(now):
        print(line)


if __name__ == "__main__":
    demo()
