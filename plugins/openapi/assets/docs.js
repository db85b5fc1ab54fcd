// The docs page: reads /api/v1/openapi.json and renders it, routes grouped by tag, with
// their parameters, request and response schemas and examples. Every value from the
// document is put on the page as text, never as HTML. Schemas unfold on demand, so the
// providers' large (and recursive) schemas cost nothing until opened.

const METHODS = ["get", "post", "put", "patch", "delete", "head"];
const LOCAL = "#/components/";

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value);
  }
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) {
      node.append(typeof child === "string" ? document.createTextNode(child) : child);
    }
  }
  return node;
}

// Descriptions are short Markdown: paragraphs and `code` are shown as such, the rest as text.
function prose(text) {
  if (!text) return null;
  const box = el("div", { class: "text" });
  for (const para of String(text).trim().split(/\n\s*\n/)) {
    const p = el("p");
    String(para).split(/(`[^`]+`)/).forEach((part) => {
      p.append(part.startsWith("`") && part.endsWith("`") && part.length > 1
        ? el("code", { text: part.slice(1, -1) }) : document.createTextNode(part));
    });
    box.append(p);
  }
  return box;
}

function makeResolver(doc) {
  return function resolve(node) {
    let name = null;
    for (let hops = 0; node && node.$ref && hops < 20; hops++) {
      if (!node.$ref.startsWith(LOCAL)) break;
      name = node.$ref.slice(LOCAL.length).split("/").pop();
      node = node.$ref.slice(2).split("/").reduce((at, key) => (at ? at[key.replace(/~1/g, "/").replace(/~0/g, "~")] : undefined), doc);
    }
    return { node: node || {}, name };
  };
}

function typeLabel(schema) {
  if ("const" in schema) return JSON.stringify(schema.const);
  if (schema.enum) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  let type = Array.isArray(schema.type) ? schema.type.join(" | ") : schema.type;
  if (!type) {
    if (schema.properties) type = "object";
    else if (schema.allOf) type = "all of";
    else if (schema.anyOf) type = "any of";
    else if (schema.oneOf) type = "one of";
  }
  if (type === "array" && schema.items) type = "array";
  return [type, schema.format].filter(Boolean).join(", ") || "any";
}

// A schema as a tree: its type and description, and a <details> that renders its parts
// (properties, items, branches) only when opened.
function schemaView(resolve, raw, depth = 0) {
  const { node, name } = resolve(raw);
  const head = el("span", {}, el("span", { class: "type", text: typeLabel(node) }),
    name ? el("span", { class: "ref", text: ` ${name}` }) : null);
  const hasParts = node.properties || node.items || node.allOf || node.anyOf || node.oneOf
    || (node.additionalProperties && typeof node.additionalProperties === "object");
  const body = el("div", { class: "schema" }, prose(raw.description || node.description));
  if (!hasParts) return el("div", {}, head, body);
  const details = el("details", { "data-testid": "schema" }, el("summary", {}, head), body);
  let drawn = false;
  const draw = () => {
    if (drawn) return;
    drawn = true;
    const required = new Set(node.required || []);
    for (const [prop, sub] of Object.entries(node.properties || {})) {
      body.append(el("div", { class: "prop" }, el("span", { class: "name", text: prop }),
        required.has(prop) ? el("span", { class: "req", text: "required" }) : null,
        schemaView(resolve, sub, depth + 1)));
    }
    if (node.items) body.append(el("div", { class: "prop" }, el("span", { class: "name", text: "items" }), schemaView(resolve, node.items, depth + 1)));
    if (node.additionalProperties && typeof node.additionalProperties === "object") {
      body.append(el("div", { class: "prop" }, el("span", { class: "name", text: "other keys" }),
        schemaView(resolve, node.additionalProperties, depth + 1)));
    }
    for (const key of ["allOf", "anyOf", "oneOf"]) {
      (node[key] || []).forEach((branch, i) => body.append(el("div", { class: "prop" },
        el("span", { class: "name", text: `${key}[${i}]` }), schemaView(resolve, branch, depth + 1))));
    }
  };
  details.addEventListener("toggle", draw);
  if (depth === 0) { details.open = true; draw(); }
  return details;
}

function examplesView(media) {
  const out = [];
  if (media.example !== undefined) out.push(el("pre", { text: JSON.stringify(media.example, null, 2) }));
  for (const [name, ex] of Object.entries(media.examples || {})) {
    out.push(el("div", { class: "muted", text: `example: ${name}` }), el("pre", { text: JSON.stringify(ex.value, null, 2) }));
  }
  return out;
}

function contentView(resolve, content) {
  return Object.entries(content || {}).map(([type, media]) => el("div", {},
    el("div", {}, el("code", { text: type })),
    media.schema ? schemaView(resolve, media.schema) : null,
    media["x-sse-data"] ? el("div", {}, el("div", { class: "muted", text: "each data: line of the stream" }),
      schemaView(resolve, media["x-sse-data"])) : null,
    media["x-sse-done"] ? el("div", { class: "muted" }, "ends with ", el("code", { text: `data: ${media["x-sse-done"]}` })) : null,
    examplesView(media)));
}

function parametersView(resolve, params) {
  if (!params.length) return null;
  const rows = params.map((raw) => {
    const p = resolve(raw).node;
    return el("tr", {}, el("td", {}, el("code", { text: p.name })), el("td", { text: p.in }),
      el("td", { text: p.required ? "yes" : "" }), el("td", {}, el("span", { class: "type", text: typeLabel(resolve(p.schema || {}).node) })),
      el("td", {}, prose(p.description)));
  });
  return [el("h4", { text: "Parameters" }), el("table", {},
    el("thead", {}, el("tr", {}, ["name", "in", "required", "type", "description"].map((h) => el("th", { text: h })))),
    el("tbody", {}, rows))];
}

function responsesView(resolve, responses) {
  return [el("h4", { text: "Responses" }), ...Object.entries(responses || {}).map(([status, raw]) => {
    const r = resolve(raw).node;
    const headers = Object.entries(r.headers || {}).map(([name, h]) => el("div", { class: "muted" },
      "header ", el("code", { text: name }), " ", prose(resolve(h).node.description)));
    return el("div", { class: "response", "data-testid": "response" },
      el("span", { class: `status ${status.startsWith("2") ? "ok" : "bad"}`, text: status }), " ",
      prose(r.description), headers, contentView(resolve, r.content));
  })];
}

function securityView(doc, op) {
  const security = op.security || doc.security || [];
  if (!security.length) return el("div", { class: "security muted", text: "No key needed." });
  const ways = security.map((req) => Object.keys(req).join(" + "));
  return el("div", { class: "security" }, "Authorization: ", ways.join(", or "));
}

function operations(doc, resolve) {
  const ops = [];
  for (const [path, raw] of Object.entries(doc.paths || {})) {
    const item = resolve(raw).node;
    for (const method of METHODS) {
      if (item[method]) ops.push({ path, method, op: item[method], params: [...(item.parameters || []), ...(item[method].parameters || [])] });
    }
  }
  return ops;
}

function operationView(doc, resolve, { path, method, op, params }) {
  const id = `op-${method}${path.replace(/[^A-Za-z0-9]+/g, "-")}`;
  const body = op.requestBody ? resolve(op.requestBody).node : null;
  return el("section", { class: "op", id, "data-testid": "operation", "data-method": method, "data-path": path },
    el("h3", {}, el("span", { class: `method ${method}`, text: method }), el("span", { class: "path", text: path }),
      el("span", { class: "muted", text: op.summary || "" })),
    prose(op.description), securityView(doc, op), parametersView(resolve, params),
    body ? [el("h4", { text: body.required ? "Request body (required)" : "Request body" }), prose(body.description),
      contentView(resolve, body.content)] : null,
    responsesView(resolve, op.responses));
}

function render(doc) {
  const resolve = makeResolver(doc);
  document.title = doc.info.title;
  document.getElementById("title").textContent = doc.info.title;
  document.getElementById("version").textContent = `v${doc.info.version} · OpenAPI ${doc.openapi}`;
  const content = document.getElementById("content");
  const toc = document.getElementById("toc");
  content.replaceChildren(el("section", { class: "intro" }, el("p", {}, doc.info.summary || ""), prose(doc.info.description),
    (doc.servers || []).map((s) => el("p", {}, "Server: ", el("code", { text: s.url })))));
  const ops = operations(doc, resolve);
  const tags = [...(doc.tags || []).map((t) => t.name)];
  for (const o of ops) for (const t of o.op.tags || ["Other"]) if (!tags.includes(t)) tags.push(t);
  for (const tag of tags) {
    const mine = ops.filter((o) => (o.op.tags || ["Other"]).includes(tag));
    if (!mine.length) continue;
    const info = (doc.tags || []).find((t) => t.name === tag) || {};
    const views = mine.map((o) => operationView(doc, resolve, o));
    content.append(el("section", { class: "tag", "data-testid": "tag" }, el("h2", { text: tag }), prose(info.description), views));
    toc.append(el("h3", { text: tag }), ...mine.map((o, i) => el("a", { href: `#${views[i].id}`, "data-testid": "toc-entry" },
      el("span", { class: `method ${o.method}`, text: o.method }), " ", o.path)));
  }
  document.getElementById("filter").addEventListener("input", (event) => {
    const words = event.target.value.toLowerCase().split(/\s+/).filter(Boolean);
    for (const section of content.querySelectorAll("[data-testid=operation]")) {
      const text = `${section.dataset.method} ${section.dataset.path} ${section.querySelector("h3").textContent}`.toLowerCase();
      section.hidden = !words.every((w) => text.includes(w));
    }
  });
}

async function main() {
  const status = document.getElementById("status");
  try {
    const answer = await fetch("/api/v1/openapi.json");
    if (!answer.ok) throw new Error(`HTTP ${answer.status}`);
    render(await answer.json());
  } catch (err) {
    status.textContent = `The API document could not be loaded: ${err.message}`;
  }
}

main();
