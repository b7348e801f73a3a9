"""τ³-bench's retail domain: the agent tools over a JSON database, with τ³ v1.0.1's semantics.

Written here from the behaviour of tau2-bench's retail toolkit at v1.0.1 (fc0055d): the same checks
in the same order, the same errors and the same changes, quirks included (modifying several items
of a pending order gives each the price and options of the *last* new item).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import Field

from flowstate.eval.tau3.domain import toolset
from flowstate.tools import ToolSet

READ = frozenset({"find_user_id_by_name_zip", "find_user_id_by_email", "get_order_details", "get_product_details",
                  "get_item_details", "get_user_details", "list_all_product_types"})
WRITE = frozenset({"cancel_pending_order", "exchange_delivered_order_items", "modify_pending_order_address",
                   "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                   "return_delivered_order_items"})

OrderId = Annotated[str, Field(description="The order id, e.g. '#W0000000' (mind the leading '#').")]
UserId = Annotated[str, Field(description="The user id, e.g. 'sara_doe_496'.")]
ItemIds = Annotated[list[str], Field(description="Item ids, e.g. '1008292230'; a list may repeat an id.")]
NewItemIds = Annotated[list[str], Field(description="The new item ids, each of the same product as the item in the "
                                                    "same position.")]
PaymentId = Annotated[str, Field(description="A payment method id from the user's or the order's details, e.g. "
                                             "'gift_card_0000000' or 'credit_card_0000000'.")]


class RetailTools:
    """The agent's tools, acting on ``db`` (changed in place)."""

    def __init__(self, db: dict[str, Any]) -> None:
        self.db = db

    def _order(self, order_id: str) -> dict[str, Any]:
        if order_id not in self.db["orders"]:
            raise ValueError("Order not found")
        return self.db["orders"][order_id]  # type: ignore[no-any-return]

    def _user(self, user_id: str) -> dict[str, Any]:
        if user_id not in self.db["users"]:
            raise ValueError("User not found")
        return self.db["users"][user_id]  # type: ignore[no-any-return]

    def _product(self, product_id: str) -> dict[str, Any]:
        if product_id not in self.db["products"]:
            raise ValueError("Product not found")
        return self.db["products"][product_id]  # type: ignore[no-any-return]

    def _variant(self, product_id: str, variant_id: str) -> dict[str, Any]:
        product = self._product(product_id)
        if variant_id not in product["variants"]:
            raise ValueError("Variant not found")
        return product["variants"][variant_id]  # type: ignore[no-any-return]

    def _payment_method(self, user_id: str, payment_method_id: str) -> dict[str, Any]:
        user = self._user(user_id)
        if payment_method_id not in user["payment_methods"]:
            raise ValueError("Payment method not found")
        return user["payment_methods"][payment_method_id]  # type: ignore[no-any-return]

    @staticmethod
    def _count_check(order: dict[str, Any], item_ids: list[str], message: str) -> None:
        held = [item["item_id"] for item in order["items"]]
        for item_id in item_ids:
            if item_ids.count(item_id) > held.count(item_id):
                raise ValueError(message.format(item_id=item_id))

    def _price_difference(self, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str],
                          same_rejected: bool) -> tuple[float, list[dict[str, Any]]]:
        total = 0.0
        variants = []
        for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
            if same_rejected and item_id == new_id:
                raise ValueError("The new item id should be different from the old item id")
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None:
                raise ValueError(f"Item {item_id} not found")
            variant = self._variant(item["product_id"], new_id)
            if not variant["available"]:
                raise ValueError(f"New item {new_id} not found or available")
            total += variant["price"] - item["price"]
            variants.append(variant)
        return total, variants

    def cancel_pending_order(
        self, order_id: OrderId,
        reason: Annotated[str, Field(description="'no longer needed' or 'ordered by mistake'.")],
    ) -> dict[str, Any]:
        """Cancel a pending order, after explaining it and getting the user's explicit yes. Gift card payments are
        refunded at once, others in 5-7 business days."""
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be cancelled")
        if reason not in {"no longer needed", "ordered by mistake"}:
            raise ValueError("Invalid reason")
        refunds = []
        for payment in order["payment_history"]:
            refunds.append({"transaction_type": "refund", "amount": payment["amount"],
                            "payment_method_id": payment["payment_method_id"]})
            method = self._payment_method(order["user_id"], payment["payment_method_id"])
            if method["source"] == "gift_card":
                method["balance"] = round(method["balance"] + payment["amount"], 2)
        order["status"] = "cancelled"
        order["cancel_reason"] = reason
        order["payment_history"].extend(refunds)
        return order

    def exchange_delivered_order_items(
        self, order_id: OrderId, item_ids: ItemIds,
        new_item_ids: NewItemIds,
        payment_method_id: PaymentId,
    ) -> dict[str, Any]:
        """Exchange items of a delivered order for items of the same products (once per order), after explaining
        it and getting the user's explicit yes."""
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be exchanged")
        self._count_check(order, item_ids, "Number of {item_id} not found.")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match.")
        difference, _ = self._price_difference(order, item_ids, new_item_ids, same_rejected=False)
        difference = round(difference, 2)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < difference:
            raise ValueError("Insufficient gift card balance to pay for the price difference")
        order["status"] = "exchange requested"
        order["exchange_items"] = sorted(item_ids)
        order["exchange_new_items"] = sorted(new_item_ids)
        order["exchange_payment_method_id"] = payment_method_id
        order["exchange_price_difference"] = difference
        return order

    def find_user_id_by_name_zip(
        self, first_name: Annotated[str, Field(description="First name, e.g. 'John'.")],
        last_name: Annotated[str, Field(description="Last name, e.g. 'Doe'.")],
        zip: Annotated[str, Field(description="Zip code, e.g. '12345'.")],
    ) -> str:
        """Find a user id by first name, last name and zip code (use only when the email does not find the user)."""
        for user_id, user in self.db["users"].items():
            if user["name"]["first_name"].lower() == first_name.lower() and \
                    user["name"]["last_name"].lower() == last_name.lower() and user["address"]["zip"] == zip:
                return str(user_id)
        raise ValueError("User not found")

    def find_user_id_by_email(self, email: Annotated[str, Field(description="E-mail, e.g. 'a@example.com'.")]) -> str:
        """Find a user id by email."""
        for user_id, user in self.db["users"].items():
            if user["email"].lower() == email.lower():
                return str(user_id)
        raise ValueError("User not found")

    def get_order_details(self, order_id: OrderId) -> dict[str, Any]:
        """Get the status and details of an order."""
        return self._order(order_id)

    def get_product_details(
        self, product_id: Annotated[str, Field(description="The product id, e.g. '6086499569' (not an item id).")],
    ) -> dict[str, Any]:
        """Get the inventory details of a product."""
        return self._product(product_id)

    def get_item_details(
        self, item_id: Annotated[str, Field(description="The item id, e.g. '6086499569' (not a product id).")],
    ) -> dict[str, Any]:
        """Get the inventory details of an item."""
        for product in self.db["products"].values():
            if item_id in product["variants"]:
                return product["variants"][item_id]  # type: ignore[no-any-return]
        raise ValueError("Item not found")

    def get_user_details(self, user_id: UserId) -> dict[str, Any]:
        """Get the details of a user, including their orders."""
        return self._user(user_id)

    def list_all_product_types(self) -> str:
        """List the name and product id of every product type (50), as JSON sorted by name."""
        return json.dumps({p["name"]: p["product_id"] for p in self.db["products"].values()}, sort_keys=True)

    def modify_pending_order_address(
        self, order_id: OrderId, address1: str, address2: str, city: str, state: str, country: str, zip: str,
    ) -> dict[str, Any]:
        """Modify the shipping address of a pending order, after explaining it and getting the user's explicit yes."""
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ValueError("Non-pending order cannot be modified")
        order["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                            "country": country, "zip": zip}
        return order

    def modify_pending_order_items(
        self, order_id: OrderId, item_ids: ItemIds,
        new_item_ids: NewItemIds,
        payment_method_id: PaymentId,
    ) -> dict[str, Any]:
        """Modify items of a pending order to items of the same products (once per order), after explaining it and
        getting the user's explicit yes."""
        order = self._order(order_id)
        if order["status"] != "pending":
            raise ValueError("Non-pending order cannot be modified")
        self._count_check(order, item_ids, "{item_id} not found")
        if len(item_ids) != len(new_item_ids):
            raise ValueError("The number of items to be exchanged should match")
        difference, variants = self._price_difference(order, item_ids, new_item_ids, same_rejected=True)
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] == "gift_card" and method["balance"] < difference:
            raise ValueError("Insufficient gift card balance to pay for the new item")
        order["payment_history"].append({"transaction_type": "payment" if difference > 0 else "refund",
                                         "amount": abs(difference), "payment_method_id": payment_method_id})
        if method["source"] == "gift_card":
            method["balance"] = round(method["balance"] - difference, 2)
        last = variants[-1] if variants else None
        for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
            item = next((i for i in order["items"] if i["item_id"] == item_id), None)
            if item is None or last is None:
                raise ValueError(f"Item {item_id} not found")
            item["item_id"] = new_id
            item["price"] = last["price"]  # τ³ gives every modified item the last new item's price and options
            item["options"] = last["options"]
        order["status"] = "pending (item modified)"
        return order

    def modify_pending_order_payment(self, order_id: OrderId, payment_method_id: PaymentId) -> dict[str, Any]:
        """Modify the payment method of a pending order, after explaining it and getting the user's explicit yes."""
        order = self._order(order_id)
        if "pending" not in order["status"]:
            raise ValueError("Non-pending order cannot be modified")
        method = self._payment_method(order["user_id"], payment_method_id)
        history = order["payment_history"]
        if len(history) != 1 or history[0]["transaction_type"] != "payment":
            raise ValueError("There should be exactly one payment for a pending order")
        if history[0]["payment_method_id"] == payment_method_id:
            raise ValueError("The new payment method should be different from the current one")
        amount = history[0]["amount"]
        if method["source"] == "gift_card" and method["balance"] < amount:
            raise ValueError("Insufficient gift card balance to pay for the order")
        history.extend([
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": history[0]["payment_method_id"]},
        ])
        if method["source"] == "gift_card":
            method["balance"] = round(method["balance"] - amount, 2)
        old = self._payment_method(order["user_id"], history[0]["payment_method_id"])
        if old["source"] == "gift_card":
            old["balance"] = round(old["balance"] + amount, 2)
        return order

    def modify_user_address(
        self, user_id: UserId, address1: str, address2: str, city: str, state: str, country: str, zip: str,
    ) -> dict[str, Any]:
        """Modify a user's default address, after explaining it and getting the user's explicit yes."""
        user = self._user(user_id)
        user["address"] = {"address1": address1, "address2": address2, "city": city, "state": state,
                           "country": country, "zip": zip}
        return user

    def return_delivered_order_items(
        self, order_id: OrderId, item_ids: ItemIds, payment_method_id: PaymentId,
    ) -> dict[str, Any]:
        """Return items of a delivered order (refund to the original payment method or a gift card), after
        explaining it and getting the user's explicit yes."""
        order = self._order(order_id)
        if order["status"] != "delivered":
            raise ValueError("Non-delivered order cannot be returned")
        method = self._payment_method(order["user_id"], payment_method_id)
        if method["source"] != "gift_card" and payment_method_id != order["payment_history"][0]["payment_method_id"]:
            raise ValueError("Payment method should be the original payment method")
        self._count_check(order, item_ids, "Some item not found")
        order["status"] = "return requested"
        order["return_items"] = sorted(item_ids)
        order["return_payment_method_id"] = payment_method_id
        return order

    def toolset(self) -> ToolSet:
        names = ["calculate", "cancel_pending_order", "exchange_delivered_order_items", "find_user_id_by_name_zip",
                 "find_user_id_by_email", "get_order_details", "get_product_details", "get_item_details",
                 "get_user_details", "list_all_product_types", "modify_pending_order_address",
                 "modify_pending_order_items", "modify_pending_order_payment", "modify_user_address",
                 "return_delivered_order_items", "transfer_to_human_agents"]
        return toolset(self, names, READ)

