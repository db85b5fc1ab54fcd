"""Built-in provider types. A third-party provider registers its class the same way
through `gateway_register_providers` (see README, "Writing a provider plugin")."""
from plugins import hookimpl

from .anthropic import AnthropicProvider
from .demo import DemoProvider
from .fal import FalProvider
from .gemini import GeminiProvider
from .openai import OpenAIProvider
from .openai_responses import OpenAIResponsesProvider
from .replicate import ReplicateProvider


@hookimpl(trylast=True)
def gateway_register_providers(register):
    for cls in (OpenAIProvider, OpenAIResponsesProvider, AnthropicProvider, GeminiProvider,
                FalProvider, ReplicateProvider, DemoProvider):
        register(cls)
