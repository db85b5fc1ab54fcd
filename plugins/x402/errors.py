"""The refusal a payment check raises (chains and schemes share it)."""


class PaymentRefused(Exception):
    """A payment that does not pay this offer; `reason` is an x402-style reason code."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason
