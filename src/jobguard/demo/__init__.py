"""The order-fulfillment demo of the article (R9): shop, mail service, faults, report."""
