"""The built-in schema as numbered migrations, the same on every engine: names sort into
order and each runs once per database. Money and times are 64-bit integers; the one
difference between engines is how a table gets generated ids (`{id}`), and a step given as
{engine: sql} (PostgreSQL's batch functions) runs on that engine only."""

CORE = """
CREATE TABLE accounts (
    id {id},
    name TEXT,
    balance_micro BIGINT NOT NULL DEFAULT 0 CHECK (balance_micro >= 0),
    created_at BIGINT NOT NULL
);
CREATE TABLE api_keys (
    id {id},
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    hash TEXT NOT NULL UNIQUE,          -- sha256 of the whole key; the key itself is never stored
    prefix TEXT NOT NULL,               -- first characters, for display only
    name TEXT,
    agent_id BIGINT,
    created_at BIGINT NOT NULL,
    revoked_at BIGINT
);
-- Append-only: the balance is the sum of an account's entries (cached in accounts).
CREATE TABLE ledger (
    id {id},
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    amount_micro BIGINT NOT NULL,
    kind TEXT NOT NULL,                 -- grant | purchase | bonus | hold | release
    ref TEXT,                           -- call id, order id, ...
    created_at BIGINT NOT NULL
);
CREATE INDEX ledger_by_account ON ledger(account_id);
CREATE INDEX ledger_by_ref ON ledger(ref);
CREATE TABLE holds (
    call_id TEXT PRIMARY KEY,
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    amount_micro BIGINT NOT NULL,
    charge_micro BIGINT,
    status TEXT NOT NULL,               -- open | settled | released
    created_at BIGINT NOT NULL,
    settled_at BIGINT
);
CREATE INDEX holds_open ON holds(status) WHERE status = 'open';
"""

FREE_ALLOWANCE = """
CREATE TABLE free_usage (
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    day TEXT NOT NULL,                  -- UTC date
    used_micro BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, day)
);
ALTER TABLE holds ADD COLUMN free_micro BIGINT NOT NULL DEFAULT 0;
ALTER TABLE holds ADD COLUMN free_day TEXT;
"""

# Owner and lease: a hold is released by another process only once its lease expired.
# Holds from before this step have no owner and lease 0, so they count as expired.
HOLD_LEASES = """
ALTER TABLE holds ADD COLUMN owner TEXT;
ALTER TABLE holds ADD COLUMN lease_until BIGINT NOT NULL DEFAULT 0;
ALTER TABLE holds ADD COLUMN key_id BIGINT;
ALTER TABLE holds ADD COLUMN agent_id BIGINT;
ALTER TABLE holds ADD COLUMN endpoint TEXT;
ALTER TABLE holds ADD COLUMN requested_model TEXT;
ALTER TABLE holds ADD COLUMN model TEXT;
CREATE INDEX holds_open_by_owner ON holds(owner, lease_until) WHERE status = 'open';
"""

USAGE = """
CREATE TABLE usage (
    id {id},
    call_id TEXT NOT NULL UNIQUE,
    account_id BIGINT,
    key_id BIGINT,
    agent_id BIGINT,
    endpoint TEXT NOT NULL,
    requested_model TEXT,
    model TEXT,
    input_tokens BIGINT NOT NULL DEFAULT 0,
    output_tokens BIGINT NOT NULL DEFAULT 0,
    usd_micro BIGINT NOT NULL DEFAULT 0,
    status INTEGER,
    outcome TEXT,
    latency_ms BIGINT,
    billing TEXT,
    created_at BIGINT NOT NULL
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
    usd_micro BIGINT NOT NULL,        -- what that amount is worth
    ref TEXT NOT NULL,                 -- call id or order id
    status TEXT NOT NULL,              -- claimed | settled | settle_failed | unused
    tx TEXT,
    reason TEXT,
    created_at BIGINT NOT NULL,
    settled_at BIGINT
);
"""

# A call's x402 payment can outlive its process: what settling it needs, the amount owed once
# the call is priced, and an owner with a lease like a hold's (see plugins.x402.recovery).
X402_RECOVERY = """
ALTER TABLE x402_payments ADD COLUMN scheme TEXT NOT NULL DEFAULT 'exact';
ALTER TABLE x402_payments ADD COLUMN settle_with TEXT;
ALTER TABLE x402_payments ADD COLUMN deadline BIGINT;
ALTER TABLE x402_payments ADD COLUMN due TEXT;
ALTER TABLE x402_payments ADD COLUMN owner TEXT;
ALTER TABLE x402_payments ADD COLUMN lease_until BIGINT;
CREATE INDEX x402_payments_unfinished ON x402_payments(status, lease_until) WHERE settle_with IS NOT NULL;
"""

# Per-key restrictions an operator sets (plugins.admin): expiry, a spend limit per day or
# month (checked inside the reserve, so concurrent calls cannot overshoot it), allowed models.
KEY_POLICY = """
ALTER TABLE api_keys ADD COLUMN expires_at BIGINT;
ALTER TABLE api_keys ADD COLUMN spend_limit_micro BIGINT;
ALTER TABLE api_keys ADD COLUMN spend_period TEXT;
ALTER TABLE api_keys ADD COLUMN models TEXT;
CREATE INDEX usage_by_key ON usage(key_id, created_at);
CREATE INDEX holds_open_by_key ON holds(key_id) WHERE status = 'open';
"""

CREDIT_ORDERS = """
CREATE TABLE credit_orders (
    id TEXT PRIMARY KEY,
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    usd_micro BIGINT NOT NULL,
    bonus_micro BIGINT NOT NULL,
    claim_key TEXT NOT NULL UNIQUE,     -- the payment: one order per payment, ever
    tx TEXT,
    created_at BIGINT NOT NULL
);
"""

AGENTS = """
CREATE TABLE agents (
    id {id},
    account_id BIGINT NOT NULL REFERENCES accounts(id),
    name TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (account_id, name)
);
"""

HOLD_UPSTREAM_JOB = """
ALTER TABLE holds ADD COLUMN upstream_job TEXT;   -- a render in flight: how to cancel it (JSON)
"""

# A call paid per request has no hold: its payment row records its render in flight, as
# holds.upstream_job does, so the job of a process that died can be cancelled upstream.
X402_UPSTREAM_JOB = """
ALTER TABLE x402_payments ADD COLUMN upstream_job TEXT;   -- a render in flight: how to cancel it (JSON)
CREATE INDEX x402_payments_by_ref ON x402_payments(ref);
CREATE INDEX x402_payments_rendering ON x402_payments(lease_until) WHERE upstream_job IS NOT NULL;
"""

# What a call's usage row needs, kept with its x402 payment (it has no hold), so that the
# process finishing the payment of a call whose process died writes its `crashed` row.
X402_CALL_USAGE = """
ALTER TABLE x402_payments ADD COLUMN endpoint TEXT;
ALTER TABLE x402_payments ADD COLUMN requested_model TEXT;
ALTER TABLE x402_payments ADD COLUMN model TEXT;
"""

# Fewer index writes per call (each is a page written at every commit). Nothing looks ledger
# entries up by ref. The open holds are few (the calls in flight): their one partial index,
# by key for the spend limit, is also the list that finding expired holds and renewing this
# process's leases scan.
LEANER_INDEXES = """
DROP INDEX ledger_by_ref;
DROP INDEX holds_open;
DROP INDEX holds_open_by_owner;
"""

# PostgreSQL's group commit (plugins/storage/pg_batch.py): the fast reserves, or settles, of
# one turn of a process's event loop in one round trip and one transaction, each element
# exactly as the single statement (postgresql.FAST_RESERVE, FAST_SETTLE) would do it, in
# order, and its result at its place. Lock order: the holds (a settle batch's, in its order),
# then the accounts in ascending id, as every other money transaction.
PG_BATCHES = """
CREATE FUNCTION reserve_batch(call_ids TEXT[], account_ids BIGINT[], amounts BIGINT[], created BIGINT[],
                              owner_ TEXT, leases BIGINT[], key_ids BIGINT[], agent_ids BIGINT[], endpoints TEXT[],
                              requested_models TEXT[], models TEXT[]) RETURNS BOOLEAN[] LANGUAGE plpgsql AS $$
DECLARE
    made BOOLEAN[] := array_fill(false, ARRAY[cardinality(call_ids)]);
    account BIGINT;
    have BIGINT;
    left_ BIGINT;
    i INT;
BEGIN
    -- One account at a time, ascending: lock it, take each of its debits that the balance
    -- left covers (in the batch's order, as the conditional UPDATEs would), write it once.
    FOR account IN SELECT DISTINCT a FROM unnest(account_ids) AS a ORDER BY a LOOP
        SELECT balance_micro INTO have FROM accounts WHERE id = account FOR UPDATE;
        CONTINUE WHEN NOT FOUND;
        left_ := have;
        FOR i IN SELECT n FROM unnest(account_ids) WITH ORDINALITY AS t(a, n) WHERE a = account ORDER BY n LOOP
            IF left_ >= amounts[i] THEN
                left_ := left_ - amounts[i];
                made[i] := true;
            END IF;
        END LOOP;
        IF left_ <> have THEN
            UPDATE accounts SET balance_micro = left_ WHERE id = account;
        END IF;
    END LOOP;
    INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at)
        SELECT account_ids[n], -amounts[n], 'hold', call_ids[n], created[n]
        FROM generate_subscripts(call_ids, 1) AS n WHERE made[n] AND amounts[n] > 0 ORDER BY n;
    INSERT INTO holds (call_id, account_id, amount_micro, free_micro, free_day, status, created_at, owner,
                       lease_until, key_id, agent_id, endpoint, requested_model, model)
        SELECT call_ids[n], account_ids[n], amounts[n], 0, NULL, 'open', created[n], owner_, leases[n], key_ids[n],
               agent_ids[n], endpoints[n], requested_models[n], models[n]
        FROM generate_subscripts(call_ids, 1) AS n WHERE made[n] ORDER BY n;
    RETURN made;
END
$$;

CREATE FUNCTION settle_batch(charges BIGINT[], frees BIGINT[], settled BIGINT[], call_ids TEXT[], refunds BIGINT[],
                             u_call_ids TEXT[], u_account_ids BIGINT[], u_key_ids BIGINT[], u_agent_ids BIGINT[],
                             u_endpoints TEXT[], u_requested_models TEXT[], u_models TEXT[], u_input BIGINT[],
                             u_output BIGINT[], u_usd BIGINT[], u_status BIGINT[], u_outcomes TEXT[],
                             u_latency BIGINT[], u_billing TEXT[], u_created BIGINT[])
                             RETURNS BOOLEAN[] LANGUAGE plpgsql AS $$
DECLARE
    closed BOOLEAN[] := array_fill(false, ARRAY[cardinality(call_ids)]);
    owners BIGINT[] := array_fill(NULL::BIGINT, ARRAY[cardinality(call_ids)]);
    account BIGINT;
    back BIGINT;
    i INT;
BEGIN
    -- The holds first, in the batch's order (a second settle of one hold finds it closed).
    FOR i IN 1 .. cardinality(call_ids) LOOP
        UPDATE holds SET status = 'settled', charge_micro = charges[i], free_micro = frees[i], settled_at = settled[i]
            WHERE call_id = call_ids[i] AND status = 'open' RETURNING account_id INTO account;
        IF FOUND THEN
            closed[i] := true;
            owners[i] := account;
        END IF;
    END LOOP;
    -- Then the refunds, one UPDATE per account in ascending id.
    FOR account, back IN SELECT owners[n], sum(refunds[n]) FROM generate_subscripts(call_ids, 1) AS n
                         WHERE closed[n] AND refunds[n] > 0 GROUP BY owners[n] ORDER BY owners[n] LOOP
        UPDATE accounts SET balance_micro = balance_micro + back WHERE id = account;
    END LOOP;
    INSERT INTO ledger (account_id, amount_micro, kind, ref, created_at)
        SELECT owners[n], refunds[n], 'release', call_ids[n], settled[n]
        FROM generate_subscripts(call_ids, 1) AS n WHERE closed[n] AND refunds[n] > 0 ORDER BY n;
    INSERT INTO usage (call_id, account_id, key_id, agent_id, endpoint, requested_model, model, input_tokens,
                       output_tokens, usd_micro, status, outcome, latency_ms, billing, created_at)
        SELECT u_call_ids[n], u_account_ids[n], u_key_ids[n], u_agent_ids[n], u_endpoints[n], u_requested_models[n],
               u_models[n], u_input[n], u_output[n], u_usd[n], u_status[n], u_outcomes[n], u_latency[n],
               u_billing[n], u_created[n]
        FROM generate_subscripts(call_ids, 1) AS n WHERE closed[n] AND u_call_ids[n] IS NOT NULL ORDER BY n
        ON CONFLICT (call_id) DO NOTHING;
    RETURN closed;
END
$$;
"""

ID = {"sqlite": "INTEGER PRIMARY KEY",          # an alias of the rowid
      "postgresql": "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY"}

STEPS = [
    ("0001_core", CORE),
    ("0002_free_allowance", FREE_ALLOWANCE),
    ("0003_hold_leases", HOLD_LEASES),
    ("0100_usage", USAGE),
    ("0200_x402_payments", X402_PAYMENTS),
    ("0210_credit_orders", CREDIT_ORDERS),
    ("0220_agents", AGENTS),
    ("0230_x402_recovery", X402_RECOVERY),
    ("0240_key_policy", KEY_POLICY),
    ("0250_hold_upstream_job", HOLD_UPSTREAM_JOB),
    ("0260_x402_upstream_job", X402_UPSTREAM_JOB),
    ("0270_x402_call_usage", X402_CALL_USAGE),
    ("0280_leaner_indexes", LEANER_INDEXES),
    ("0290_pg_batches", {"postgresql": PG_BATCHES}),
]


def migrations(engine: str) -> list[tuple[str, str]]:
    return [(name, sql.replace("{id}", ID[engine])) for name, step in STEPS
            if (sql := step.get(engine) if isinstance(step, dict) else step) is not None]
