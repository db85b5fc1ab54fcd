"""The plugin system: loading from YAML and --plugins-dir, the example provider plugin
end to end, async hooks awaited in order with real short-circuits, and start-up checks
that refuse wrappers on async hooks and misspelled hook names."""
import contextlib
import inspect
from pathlib import Path

import pluggy
import pytest

import plugins
from config import ConfigError
from plugins import acall_all, first_for, get_plugin_manager, hookimpl, hookspecs
from plugins.formats.base import ClientFormat, Fields
from providers.types import ChatRequest, Message, TextPart
from tests.conftest import DEMO_MODELS, MICRO
from tests.fakes import Reply

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "groq_provider.py"
HI = [{"role": "user", "content": "hi"}]


def groq_config(fake, plugins_entry=None):
    cfg = {"providers": {"groq": {"type": "groq", "base_url": str(fake.server.make_url("/v1")),
                                  "api_key": "sk-test-upstream"}},
           "models": {"chat": DEMO_MODELS + [{"id": "groq/llama", "provider": "groq", "upstream": "llama-3.3-70b",
                                              "list_input_usd_per_mtok": 2, "list_output_usd_per_mtok": 8}]}}
    if plugins_entry:
        cfg["plugins"] = plugins_entry
    return cfg


async def test_example_provider_plugin_from_yaml(start_gateway, fake_openai):
    gw = await start_gateway(groq_config(fake_openai, [str(EXAMPLE)]))
    key, account = await gw.key(1)
    fake_openai.enqueue(Reply(text="from groq", output_tokens=3))
    resp = await gw.openai(key).chat.completions.create(model="groq/llama", messages=HI, logprobs=True)
    assert resp.choices[0].message.content == "from groq"
    sent = fake_openai.requests[-1]
    assert sent.rejected is None and sent.body["model"] == "llama-3.3-70b" and "logprobs" not in sent.body
    assert await gw.balance(account) == MICRO - resp.model_extra["billing"]["usd"] * MICRO


async def test_example_provider_plugin_from_plugins_dir(start_gateway, fake_openai):
    gw = await start_gateway(groq_config(fake_openai), plugins_dir=str(EXAMPLE.parent))
    key, _ = await gw.key(1)
    resp = await gw.openai(key).chat.completions.create(model="groq/llama", messages=HI)
    assert resp.choices[0].message.content == Reply().text


def test_yaml_plugin_paths_are_relative_to_the_config(tmp_path):
    import config
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "gw.yaml").write_text("plugins: [my_plugin.py, some.module]\n")
    (tmp_path / "sub" / "my_plugin.py").write_text("")
    cfg = config.load(tmp_path / "sub" / "gw.yaml", env={})
    assert cfg.plugins == [str(tmp_path / "sub" / "my_plugin.py"), "some.module"]


class Recorder:
    """A third-party plugin that wraps every call and sees every stage."""

    def __init__(self):
        self.seen: list[str] = []

    @hookimpl
    def gateway_request_wrapper(self, ctx):
        seen = self.seen

        @contextlib.asynccontextmanager
        async def wrap():
            seen.append("enter")
            yield
            seen.append(f"exit:{ctx.outcome}")
        return wrap()

    @hookimpl
    async def gateway_moderate(self, ctx):
        self.seen.append(f"moderate:{ctx.chat.model}")

    @hookimpl
    async def gateway_record_usage(self, ctx):
        self.seen.append(f"usage:{ctx.charge_micro > 0}")


async def test_pipeline_hooks_and_wrappers_run_in_order(start_gateway):
    pm = get_plugin_manager()
    recorder = Recorder()
    pm.register(recorder, "recorder")
    gw = await start_gateway(pm=pm)
    key, _ = await gw.key(1)
    await gw.openai(key).chat.completions.create(model="demo/echo", messages=HI)
    assert recorder.seen == ["enter", "moderate:demo/echo", "usage:True", "exit:ok"]


async def test_a_plugin_can_authenticate_before_the_builtin(start_gateway):
    from plugins.context import Principal

    class HeaderAuth:
        @hookimpl
        async def gateway_authenticate(self, ctx):
            if ctx.header("X-Test-Account"):
                return Principal(account_id=int(ctx.header("X-Test-Account")), key_id=0, key_prefix="test")

    pm = get_plugin_manager()
    pm.register(HeaderAuth(), "header-auth")
    gw = await start_gateway(pm=pm)
    _, account = await gw.key(1)
    client = gw.openai("unused", default_headers={"X-Test-Account": str(account), "Authorization": ""})
    await client.chat.completions.create(model="demo/echo", messages=HI)
    assert await gw.balance(account) < MICRO


async def test_first_for_short_circuits_and_acall_all_collects():
    pm = pluggy.PluginManager("gateway")
    pm.add_hookspecs(hookspecs)
    calls = []

    class First:
        @hookimpl(tryfirst=True)
        async def gateway_select_route(self, ctx):
            calls.append("first")
            return "route-a"

    class Second:
        @hookimpl
        def gateway_select_route(self, ctx):
            calls.append("second")
            return "route-b"

    pm.register(Second())
    pm.register(First())
    assert await first_for(pm.hook.gateway_select_route, None) == "route-a"
    assert calls == ["first"]                       # the second impl never ran: no stray coroutine
    assert await acall_all(pm.hook.gateway_select_route, ctx=None) == ["route-a", "route-b"]


def test_wrappers_on_async_hooks_are_refused():
    class Wrapper:
        @hookimpl(wrapper=True)
        def gateway_reserve(self, ctx):
            return (yield)

    pm = get_plugin_manager()
    pm.register(Wrapper())
    with pytest.raises(pluggy.PluginValidationError, match="wrappers cannot await"):
        plugins.check_async_safe(pm)


def test_misspelled_hooks_are_refused():
    class Typo:
        @hookimpl
        def gateway_reserv(self, ctx):
            pass

    pm = get_plugin_manager()
    pm.register(Typo())
    with pytest.raises(pluggy.PluginValidationError):
        plugins.check_async_safe(pm)


class PlainFormat(ClientFormat):
    """A client wire format in a dozen lines: {model, prompt} in, {text, usd} out."""
    name, path, endpoint = "plain", "/api/v1/plain", "plain"

    def parse(self, body):
        f = Fields(body)
        return ChatRequest(model=f.string("model", required=True), max_tokens=64,
                           messages=[Message("user", [TextPart(f.string("prompt", required=True))])])

    def render(self, resp, ctx):
        return {"text": resp.text(), "usd": ctx.billing["usd"]}

    def error_body(self, err):
        return {"problem": err.message}


class EveryExtensionPoint:
    """A third-party plugin that uses each extension point the core offers."""

    def __init__(self):
        self.started = False
        self.settled: list[str] = []

    @hookimpl
    def gateway_register_routes(self, register, config):
        from plugins.formats.base import json_response

        async def hello(request):
            return json_response({self.greeting: len(config.chat_models)})
        register("GET", "/api/v1/hello", hello)

    @hookimpl
    def gateway_register_migrations(self, register):
        register("5000_example_notes", "CREATE TABLE example_notes (call_id TEXT)")

    @hookimpl
    def gateway_register_settings(self, register):
        from config.schema import Section

        class EverySettings(Section):
            greeting: str = "hello"
        register("every", EverySettings)

    @hookimpl
    def gateway_configure(self, app, config):
        self.greeting = config.settings("every").greeting

    @hookimpl
    async def gateway_startup(self, app):
        self.started = True

    @hookimpl
    def gateway_admit(self, ctx):
        from plugins.errors import GatewayError
        if ctx.header("X-Block"):
            raise GatewayError(429, "blocked by the example plugin", headers={"Retry-After": "3"})

    @hookimpl(tryfirst=True)
    def gateway_select_route(self, ctx):
        from plugins.routing import route_to
        if ctx.chat.model == "fast":
            return route_to(ctx, "demo/echo", requested="fast")

    @hookimpl
    async def gateway_reserve(self, ctx):
        return None                                  # leaves payment to the built-ins

    @hookimpl
    async def gateway_settle(self, ctx):
        self.settled.append(ctx.outcome)

    @hookimpl
    async def gateway_account_info(self, app, principal):
        return {"plan": "example"}

    @hookimpl
    def gateway_register_formats(self, register):
        register(PlainFormat())

    @hookimpl
    def gateway_register_commands(self, subparsers):
        subparsers.add_parser("example-hello").set_defaults(func=lambda args: print("hello") or 0)


async def test_a_plugin_can_use_every_extension_point(start_gateway, capsys):
    import openai

    import gateway
    pm = get_plugin_manager()
    plugin = EveryExtensionPoint()
    pm.register(plugin, "every")
    with pytest.raises(ConfigError) as info:          # a plugin's section is typed like the core's
        await start_gateway({"every": {"greting": "hi"}}, pm=pm)
    assert info.value.problems[0].endswith("every.greting: unknown key (did you mean 'greeting'?)")
    gw = await start_gateway({"every": {"greeting": "hi"}}, pm=pm)
    assert plugin.started
    key, _ = await gw.key(1)
    client = gw.openai(key)
    resp = await client.chat.completions.create(model="fast", messages=HI)
    assert resp.model == "demo/echo" and resp.model_extra["billing"]["requested_model"] == "fast"
    assert plugin.settled == ["ok"]
    with pytest.raises(openai.RateLimitError) as info:
        await client.chat.completions.create(model="fast", messages=HI, extra_headers={"X-Block": "1"})
    assert info.value.response.headers["Retry-After"] == "3"
    account = await client.get("/account", cast_to=dict)
    assert account["plan"] == "example"
    assert (await client.get("/hello", cast_to=dict)) == {"hi": 1}
    assert tuple(await gw.store.fetchone("SELECT COUNT(*) FROM example_notes")) == (0,)
    assert gateway.build_parser(pm).parse_args(["example-hello"]).func(None) == 0
    assert "hello" in capsys.readouterr().out
    plain = await client.post("/plain", body={"model": "demo/echo", "prompt": "plain words"}, cast_to=dict)
    assert "You said: plain words" in plain["text"] and plain["usd"] > 0
    with pytest.raises(openai.BadRequestError) as info:
        await client.post("/plain", body={"model": "demo/echo"}, cast_to=dict)
    assert info.value.body == {"problem": "prompt: is required"}


def test_every_hook_is_exercised_by_a_test():
    """datasette's rule: a hook that no test names is a hook that can silently break."""
    text = "".join(p.read_text() for p in [*Path(__file__).parent.glob("test_*.py"), EXAMPLE])
    for name, _ in inspect.getmembers(hookspecs, inspect.isfunction):
        if name.startswith("gateway_"):
            assert f"def {name}(" in text, f"no test implements {name}"


def test_installed_plugins_load_from_the_entry_point_group(tmp_path, monkeypatch):
    """A plugin shipped as a package declares `[gateway] name = module`; installing it is enough."""
    (tmp_path / "acme_gateway_plugin.py").write_text(
        "from plugins import hookimpl\n"
        "from providers.openai import OpenAIProvider\n"
        "class Acme(OpenAIProvider):\n    type_name = 'acme'\n"
        "@hookimpl\ndef gateway_register_providers(register):\n    register(Acme)\n")
    dist = tmp_path / "acme_gateway_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-gateway-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[gateway]\nacme = acme_gateway_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    types = []
    pm = get_plugin_manager(load_entrypoints=True)
    pm.hook.gateway_register_providers(register=lambda cls: types.append(cls.type_name))
    assert "acme" in types
    monkeypatch.setenv("GATEWAY_LOAD_PLUGINS", "something-else")     # an allow-list leaves it out
    types.clear()
    get_plugin_manager(load_entrypoints=True).hook.gateway_register_providers(
        register=lambda cls: types.append(cls.type_name))
    assert "acme" not in types and "openai" in types
