"""The built-in schema on SQLite, as numbered migrations (the PostgreSQL backend has the
same names). Names sort into order; each runs once per database."""

CORE = """
CREATE TABLE accounts (
    id INTEGER PRIMARY KEY,
    name TEXT,
    balance_micro INTEGER NOT NULL DEFAULT 0 CHECK (balance_micro >= 0),
    created_at INTEGER NOT NULL
);
CREATE TABLE api_keys (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    hash TEXT NOT NULL UNIQUE,          -- sha256 of the whole key; the key itself is never stored
    prefix TEXT NOT NULL,               -- first characters, for display only
    name TEXT,
    agent_id INTEGER,
    created_at INTEGER NOT NULL,
    revoked_at INTEGER
);
-- Append-only: the balance is the sum of an account's entries (cached in accounts).
CREATE TABLE ledger (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    amount_micro INTEGER NOT NULL,
    kind TEXT NOT NULL,                 -- grant | purchase | bonus | hold | release
    ref TEXT,                           -- call id, order id, ...
    created_at INTEGER NOT NULL
);
CREATE INDEX ledger_by_account ON ledger(account_id);
CREATE INDEX ledger_by_ref ON ledger(ref);
CREATE TABLE holds (
    call_id TEXT PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    amount_micro INTEGER NOT NULL,
    charge_micro INTEGER,
    status TEXT NOT NULL,               -- open | settled | released
    created_at INTEGER NOT NULL,
    settled_at INTEGER
);
CREATE INDEX holds_open ON holds(status) WHERE status = 'open';
"""

FREE_ALLOWANCE = """
CREATE TABLE free_usage (
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    day TEXT NOT NULL,                  -- UTC date
    used_micro INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day)
);
ALTER TABLE holds ADD COLUMN free_micro INTEGER NOT NULL DEFAULT 0;
ALTER TABLE holds ADD COLUMN free_day TEXT;
"""

# Owner and lease: a hold is released by another process only once its lease expired.
# Holds from before this step have no owner and lease 0, so they count as expired.
HOLD_LEASES = """
ALTER TABLE holds ADD COLUMN owner TEXT;
ALTER TABLE holds ADD COLUMN lease_until INTEGER NOT NULL DEFAULT 0;
ALTER TABLE holds ADD COLUMN key_id INTEGER;
ALTER TABLE holds ADD COLUMN agent_id INTEGER;
ALTER TABLE holds ADD COLUMN endpoint TEXT;
ALTER TABLE holds ADD COLUMN requested_model TEXT;
ALTER TABLE holds ADD COLUMN model TEXT;
CREATE INDEX holds_open_by_owner ON holds(owner, lease_until) WHERE status = 'open';
"""

USAGE = """
CREATE TABLE usage (
    id INTEGER PRIMARY KEY,
    call_id TEXT NOT NULL UNIQUE,
    account_id INTEGER,
    key_id INTEGER,
    agent_id INTEGER,
    endpoint TEXT NOT NULL,
    requested_model TEXT,
    model TEXT,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    usd_micro INTEGER NOT NULL DEFAULT 0,
    status INTEGER,
    outcome TEXT,
    latency_ms INTEGER,
    billing TEXT,
    created_at INTEGER NOT NULL
);
CREATE INDEX usage_by_account ON usage(account_id, id);
"""

X402_PAYMENTS = """
CREATE TABLE x402_payments (
    claim_key TEXT PRIMARY KEY,        -- one-time key: (network, asset, payer, nonce) or tx hash
    network TEXT NOT NULL,
    asset TEXT NOT NULL,
    payer TEXT,
    amount TEXT NOT NULL,              -- atomic units, as paid
    usd_micro INTEGER NOT NULL,        -- what that amount is worth
    ref TEXT NOT NULL,                 -- call id or order id
    status TEXT NOT NULL,              -- claimed | settled | settle_failed | unused
    tx TEXT,
    reason TEXT,
    created_at INTEGER NOT NULL,
    settled_at INTEGER
);
"""

# A call's x402 payment can outlive its process: what settling it needs, the amount owed once
# the call is priced, and an owner with a lease like a hold's (see plugins.x402.recovery).
X402_RECOVERY = """
ALTER TABLE x402_payments ADD COLUMN scheme TEXT NOT NULL DEFAULT 'exact';
ALTER TABLE x402_payments ADD COLUMN settle_with TEXT;
ALTER TABLE x402_payments ADD COLUMN deadline INTEGER;
ALTER TABLE x402_payments ADD COLUMN due TEXT;
ALTER TABLE x402_payments ADD COLUMN owner TEXT;
ALTER TABLE x402_payments ADD COLUMN lease_until INTEGER;
CREATE INDEX x402_payments_unfinished ON x402_payments(status, lease_until) WHERE settle_with IS NOT NULL;
"""

CREDIT_ORDERS = """
CREATE TABLE credit_orders (
    id TEXT PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    usd_micro INTEGER NOT NULL,
    bonus_micro INTEGER NOT NULL,
    claim_key TEXT NOT NULL UNIQUE,     -- the payment: one order per payment, ever
    tx TEXT,
    created_at INTEGER NOT NULL
);
"""

AGENTS = """
CREATE TABLE agents (
    id INTEGER PRIMARY KEY,
    account_id INTEGER NOT NULL REFERENCES accounts(id),
    name TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (account_id, name)
);
"""

MIGRATIONS = [
    ("0001_core", CORE),
    ("0002_free_allowance", FREE_ALLOWANCE),
    ("0003_hold_leases", HOLD_LEASES),
    ("0100_usage", USAGE),
    ("0200_x402_payments", X402_PAYMENTS),
    ("0210_credit_orders", CREDIT_ORDERS),
    ("0220_agents", AGENTS),
    ("0230_x402_recovery", X402_RECOVERY),
]
