"""svc/smart's local classifier: what it reads, how it routes up, that it is shipped and
loads offline, and that the training and evaluation commands work, through HTTP and the CLI."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from plugins.router_features import RoutingInput, from_messages, split_question
from plugins.router_model import pick, shipped
from tests.test_free_and_smart import smart_config

ROOT = Path(__file__).resolve().parent.parent
LOG = "\n".join(f"2025-03-11T02:14:{i:02d}.118Z INFO api GET /v1/orders/{88000 + i} 200 41ms" for i in range(60))


def unreachable_classifier(fake):
    cfg = smart_config(fake)
    cfg["providers"]["up"]["base_url"] = "http://127.0.0.1:9/v1"       # the llm path cannot answer
    for tier in ("easy", "medium", "hard", "frontier"):
        cfg["router"]["tiers"][tier] = "demo/echo"
    return cfg


def test_the_question_is_kept_apart_from_pasted_text():
    question, context = split_question(LOG + "\n\nHow many requests were logged?")
    assert question == "How many requests were logged?" and context > 3000
    question, context = split_question("Find the root cause of the 503s in this log:\n\n" + LOG)
    assert question.startswith("Find the root cause") and context > 3000
    assert split_question("Who wrote Faust?") == ("Who wrote Faust?", 0)


def test_the_last_user_turn_is_judged_and_tool_results_are_skipped():
    inp = from_messages([("system", "Be brief.", False), ("user", "Prove the prime number theorem.", False),
                         ("assistant", "Here is the proof ...", False), ("user", "thanks!", False),
                         ("tool", '{"ok": true}', True)], tools=2)
    assert inp.last == "thanks!" and "prime number theorem" in inp.history
    assert inp.tools == 2 and inp.tool_results


def test_unsure_means_the_higher_tier():
    # 50% easy, 30% medium, 15% hard, 5% frontier: the likeliest is easy, but the chance that
    # easy is too low is 50%; medium is too low with 20%, within a 25% threshold.
    assert pick((0.5, 0.3, 0.15, 0.05), 0.25) == 1
    assert pick((0.9, 0.06, 0.03, 0.01), 0.25) == 0
    assert pick((0.05, 0.1, 0.25, 0.6), 0.25) == 3
    # One threshold per tier: a 20% chance of needing more than medium is too much when
    # medium's threshold is 10%, even though easy's (40%) would let a 50% chance through.
    assert pick((0.5, 0.3, 0.15, 0.05), (0.6, 0.1, 0.1)) == 2
    assert pick((0.5, 0.45, 0.04, 0.01), (0.6, 0.1, 0.1)) == 0


def test_the_model_is_shipped_small_and_decides_without_numpy():
    model_file = ROOT / "plugins" / "router_model.bin"
    assert model_file.stat().st_size < 4_000_000          # a few MB at most
    code = ("import sys; sys.modules['numpy'] = None; from plugins.router_model import shipped; "
            "from plugins.router_features import RoutingInput; "
            "print(shipped().decide(RoutingInput('Find all functions f with f(x+f(y)) = f(x) + y and prove it.')).tier)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() in ("hard", "frontier")


def test_calibrated_probabilities():
    probs = shipped().probabilities(RoutingInput("hi there!"))
    assert abs(sum(probs) - 1) < 1e-9 and max(probs) == probs[0]


async def test_a_long_paste_does_not_raise_the_tier_of_a_trivial_question(start_gateway, fake_openai):
    cfg = unreachable_classifier(fake_openai)
    gw = await start_gateway(cfg)
    key, _ = await gw.key(1)
    client = gw.openai(key)
    question = "What status code did the first request get?"
    billings = []
    for text in (question, LOG + "\n\n" + question, question + "\n\n" + LOG):
        r = await client.chat.completions.create(model="svc/smart", messages=[{"role": "user", "content": text}])
        billings.append(r.model_extra["billing"])
    alone, *pasted = billings
    tiers = ("easy", "medium", "hard", "frontier")
    for billing in pasted:
        assert (billing["requested_model"], billing["classifier"]) == ("svc/smart", "local")
        assert tiers.index(billing["difficulty"]) <= tiers.index(alone["difficulty"])
        # easy, or easy was the likeliest and it went up only because it was unsure
        assert billing["difficulty"] == "easy" or "routed up from easy" in billing["note"]
    r = await client.chat.completions.create(model="svc/smart", messages=[
        {"role": "user", "content": "Montre que π est transcendant."}])
    assert r.model_extra["billing"]["difficulty"] in ("hard", "frontier")


async def test_a_hard_thread_that_ends_in_thanks_is_easy(start_gateway, fake_openai):
    gw = await start_gateway(unreachable_classifier(fake_openai))
    key, _ = await gw.key(1)
    r = await gw.openai(key).chat.completions.create(model="svc/smart", messages=[
        {"role": "user", "content": "Prove that there are infinitely many primes of the form 4k + 3."},
        {"role": "assistant", "content": "Suppose there were finitely many, p1 ... pk; consider 4 p1 ... pk - 1 ..."},
        {"role": "user", "content": "perfect, thanks a lot!"}])
    assert r.model_extra["billing"]["difficulty"] == "easy"


def test_router_eval_reports_on_the_test_split_only():
    out = subprocess.run([sys.executable, str(ROOT / "gateway.py"), "router-eval", "--config",
                          str(ROOT / "docs/examples/smart-router.yaml")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    test_items = sum(1 for line in (ROOT / "bench/router_set.jsonl").read_text().splitlines()
                     if json.loads(line)["split"] == "test")
    assert f"on the test split of router_set.jsonl: {test_items} requests" in out.stdout
    for heading in ("| label \\ routed to |", "| language |", "| category |", "| hard group |", "| always frontier |",
                    "Decision time"):
        assert heading in out.stdout


def test_route_up_bound_keeps_one_standard_error_below_the_aim():
    from plugins.router_train import under_bound
    # 3,000 validation requests: 5% has a standard error of 0.40 points.
    assert abs(under_bound(0.05, 3000) - 0.04602) < 1e-5
    assert under_bound(0.05, 12000) > under_bound(0.05, 3000)        # more requests, less margin


@pytest.mark.timeout(120)
def test_router_train_writes_a_model_the_gateway_loads(tmp_path):
    rows = []
    for i, (tier, text) in enumerate([("easy", "hi"), ("easy", "what is the capital of Peru"),
                                      ("medium", "write a short email to my landlord about the heater"),
                                      ("hard", "prove by induction that 2^n > n for every n"),
                                      ("frontier", "design a multi-region ledger with RPO 0 and prove it correct")] * 4):
        split = ("train", "train", "validation")[i % 3]
        rows.append({"id": f"t{i}", "split": split, "tier": tier, "messages": [{"role": "user", "content": text}],
                     "tools": []})
    data, out_file = tmp_path / "set.jsonl", tmp_path / "model.bin"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(ROOT / "gateway.py"), "router-train", "--data", str(data),
                          "--out", str(out_file), "--steps", "40"],
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr
    meta = json.loads(out.stdout)
    assert meta["trained_on"] == len(rows)
    # The route-up thresholds keep validation's under-routing a standard error below the aim
    # (this toy validation split is too small to tell: none at all).
    valid = sum(r["split"] == "validation" for r in rows)
    assert meta["route_up_bound"] == max(0, round(0.05 - (0.05 * 0.95 / valid) ** 0.5, 4)) == 0
    assert meta["validation"]["under"] == 0
    from plugins.router_model import LocalClassifier
    assert LocalClassifier.load(out_file).decide(RoutingInput("hi")).tier in ("easy", "medium")



async def test_the_billing_note_says_when_it_routed_up(start_gateway, fake_openai):
    # A request of the set whose likeliest tier is lower than the one the shipped model
    # takes: the chance that the likeliest is too low is above its route-up threshold.
    from plugins.router_train import load_set, routing_input
    model = shipped()
    item, decision = next((item, d) for item in load_set(ROOT / "bench/router_set.jsonl")
                          if item["split"] == "train" and not item["tools"] and len(item["messages"]) == 1
                          for d in [model.decide(routing_input(item))] if d.routed_up)
    gw = await start_gateway(unreachable_classifier(fake_openai))
    key, _ = await gw.key(1)
    r = await gw.openai(key).chat.completions.create(model="svc/smart", messages=item["messages"])
    billing = r.model_extra["billing"]
    assert billing["difficulty"] == decision.tier != decision.likeliest
    assert f"({decision.tier}, by local; routed up from {decision.likeliest} (unsure: p=" in billing["note"]
    r = await gw.openai(key).chat.completions.create(model="svc/smart", messages=[{"role": "user", "content": "hi!"}])
    assert "routed up" not in r.model_extra["billing"]["note"]


def test_the_readme_tables_are_what_router_eval_writes(tmp_path):
    readme = (ROOT / "README.md").read_text()
    copy = tmp_path / "README.md"
    copy.write_text(readme)
    out = subprocess.run([sys.executable, str(ROOT / "gateway.py"), "router-eval", "--config",
                          str(ROOT / "docs/examples/smart-router.yaml"), "--readme", str(copy)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert copy.read_text() == readme, ("the README's svc/smart tables are stale: run gateway router-eval "
                                        "--config docs/examples/smart-router.yaml --readme README.md")


def test_every_disagreement_with_the_second_labelling_pass_is_settled():
    """Where the set's label differs from the blind second pass, settled.jsonl must say how it
    was settled, and every settled label must be the one the set now carries."""
    from plugins.router_model import TIERS
    here = ROOT / "bench" / "router_set"
    labels = {r["id"]: r["tier"] for r in map(json.loads, (ROOT / "bench/router_set.jsonl").read_text().splitlines())}
    second = {r["id"]: r["tier"] for r in map(json.loads, (here / "second_pass.jsonl").read_text().splitlines())}
    settled = {r["id"]: r for r in map(json.loads, (here / "settled.jsonl").read_text().splitlines())}
    assert set(second) == set(labels)
    for item_id, row in settled.items():
        # usually one of the two; another tier only where both were wrong, and the reason says why
        assert row["first"] != row["second"] and row["settled"] in TIERS and row["why"]
        assert labels[item_id] == row["settled"] and second[item_id] == row["second"]
    assert {i for i in labels if labels[i] != second[i]} <= set(settled)


def test_the_gateway_table_gives_the_weights_training_fitted():
    """A decision looks keys up in the model's table instead of hashing them; for requests of
    the set that must give exactly the scores of the trained hashed weights over the known keys."""
    from array import array

    from plugins.router_features import DENSE, FEATURES, keyed_features, slot
    from plugins.router_model import TIERS
    from plugins.router_train import load_set, routing_input
    model = shipped()
    raw = (ROOT / "plugins" / "router_model.bin").read_bytes()
    head, _, rest = raw.partition(b"\n")
    size = json.loads(head)["known_bytes"]
    known = set(rest[:size].decode().split("\n"))
    weights = array("f")
    weights.frombytes(rest[size:])
    n = len(TIERS)
    items = load_set(ROOT / "bench/router_set.jsonl")
    for item in [i for i in items if i["split"] != "test"][:400:7]:
        keys, weight, dense = keyed_features(routing_input(item))
        slots = [slot(key) for key in keys if key in known]
        assert slots, "a request of the set with no known key"
        hashed = [weight * sum(weights[s * n + t] for s in slots)
                  + sum(weights[(FEATURES - len(DENSE) + j) * n + t] * d for j, d in enumerate(dense))
                  for t in range(n)]
        relative = [score - hashed[0] for score in hashed]      # the first column is zero
        assert model.scores(routing_input(item)) == pytest.approx(relative, rel=1e-6, abs=1e-5)  # fixed point
