"""A credit purchase across kill -9 at each step of its payment: before the claim, while
the facilitator is settling, and after the transfer but before the gateway heard of it.
After a restart every purchase the facilitator settled is credited exactly once, and
none that it did not settle is credited at all."""
import asyncio
import sqlite3
import time

import httpx
from eth_account import Account
from x402.http.clients.httpx import PaymentError

from tests.conftest import DEMO_MODELS
from tests.fakes.facilitator import FakeFacilitator
from tests.gateway_process import GatewayProcess
from tests.test_x402 import chains, payer_client

STEPS = ["verify", "settle", "settled"]


async def settled_down(db, seconds: float = 15) -> None:
    """Until no payment is left claimed or settling (recovery has finished them)."""
    deadline = time.monotonic() + seconds
    while sqlite3.connect(db).execute("SELECT COUNT(*) FROM x402_payments WHERE status IN ('claimed', 'settling')"
                                      ).fetchone()[0]:
        assert time.monotonic() < deadline, "payments were left unfinished"
        await asyncio.sleep(0.1)


async def test_a_purchase_killed_at_each_step_ends_credited_exactly_once_if_paid(aiohttp_server, tmp_path):
    facilitator = FakeFacilitator()
    fac = await aiohttp_server(facilitator.app)
    db = tmp_path / "gw.db"
    gw = GatewayProcess(tmp_path, {
        "storage": f"sqlite:///{db}?lease_seconds=1",
        "providers": {"demo": {"type": "demo"}}, "models": {"chat": DEMO_MODELS},
        "payments": {"x402": {"facilitator": {"url": str(fac.make_url(""))}, "chains": chains("usdc")}},
        "credits": {"purchase": {"min_usd": 3, "max_usd": 1000, "bonus": {"first_purchase_pct": 10}}}})
    key = gw.cli("keys", "create", "--credits", "0").split()[-1]
    await gw.start()
    try:
        for step in [*STEPS, None]:                  # None: a purchase nobody interrupts
            facilitator.on_step = (lambda name, at=step: gw.kill9() if name == at else None)
            async with payer_client(Account.create()) as http:
                try:
                    await http.post(f"{gw.url}/api/v1/account/credits/purchase", json={"usd": 10},
                                    headers={"Authorization": f"Bearer {key}"})
                except (httpx.HTTPError, PaymentError):
                    pass                              # the process died under the request
            facilitator.on_step = None
            if gw.proc.poll() is not None:
                await gw.start()                      # the restart finishes what was left
            await settled_down(db)
        await asyncio.sleep(1)                        # more recovery rounds change nothing
        conn = sqlite3.connect(db)
        paid = facilitator.exact_settled
        assert len(paid) == 3 and len({nonce for _, nonce, _ in paid}) == 3    # settle, settled, uninterrupted
        orders = conn.execute("SELECT usd_micro, bonus_micro, tx FROM credit_orders ORDER BY created_at").fetchall()
        assert [o[0] for o in orders] == [10_000_000] * 3 and sum(o[1] for o in orders) == 1_000_000
        statuses = sorted(r[0] for r in conn.execute("SELECT status FROM x402_payments"))
        assert statuses == ["settled", "settled", "settled", "unused"] or statuses == ["settled"] * 3
        balance, total = conn.execute("SELECT balance_micro, (SELECT SUM(amount_micro) FROM ledger) FROM accounts"
                                      ).fetchone()
        assert balance == total == 31_000_000        # 3 x $10 and one first-purchase bonus of $1
    finally:
        gw.stop()
