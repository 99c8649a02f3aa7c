from django.tasks import task

from orders.models import Order


@task(queue_name="emails")
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(id=order_id)
    # A real shop would send an email here.
    return f"receipt for order {order.id} sent to {order.email}"
