"""The order-fulfillment demo of the article: shop, mail service, faults, report."""
