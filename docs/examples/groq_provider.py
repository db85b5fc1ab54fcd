"""An example provider plugin: Groq, an OpenAI-compatible host.

Load it with `plugins: [groq_provider.py]` in your YAML (a path relative to that file),
or `gateway run --plugins-dir docs/examples`, then configure:

    providers:
      groq: {type: groq, api_key: "${GROQ_API_KEY:-}"}
    models:
      chat:
        - {id: groq/llama-3.3-70b, provider: groq, upstream: llama-3.3-70b-versatile,
           list_input_usd_per_mtok: 0.59, list_output_usd_per_mtok: 0.79, tools: true}

A host that speaks OpenAI chat completions needs only a type name and a default URL.
One that differs overrides the pure translators of providers.base.HTTPProvider:
`build_request`, `parse_response`, `parse_stream`, `headers`, `url`, `error_message`.
"""
from plugins import hookimpl
from providers.openai import OpenAIProvider


class GroqProvider(OpenAIProvider):
    type_name = "groq"
    default_base_url = "https://api.groq.com/openai/v1"

    def build_request(self, req, upstream):
        body = super().build_request(req, upstream)
        body.pop("logit_bias", None)     # Groq refuses these OpenAI parameters
        body.pop("logprobs", None)
        return body


@hookimpl
def gateway_register_providers(register):
    register(GroqProvider)
