from django.core.management.base import BaseCommand
from django.db import transaction

from orders.models import Order
from orders.tasks import send_receipt


class Command(BaseCommand):
    help = "Place an order and enqueue its receipt, in one transaction."

    def add_arguments(self, parser):
        parser.add_argument("email", nargs="?", default="ada@example.com")

    def handle(self, *args, **options):
        with transaction.atomic():
            order = Order.objects.create(email=options["email"])
            # Committed with the order, or not at all.
            result = send_receipt.enqueue(order.id)
        self.stdout.write(f"order {order.id} placed; receipt task {result.id} enqueued")
