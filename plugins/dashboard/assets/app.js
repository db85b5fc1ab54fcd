// The gateway dashboard: one page, no build step, no third-party code.
// The key lives in sessionStorage (this tab only) and travels as an Authorization header,
// never as a cookie, so no other site can act with it. Every value from the server is
// put on the page as text (textContent), never as HTML.

const KEY = "gateway.key";
const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "on") for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    else if (v !== undefined && v !== null && v !== false) node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : String(c));
  return node;
}

const usd = (n) => (n === null || n === undefined ? "—"
  : (n < 0 ? "-$" : "$") + Math.abs(Number(n)).toFixed(6).replace(/0{1,4}$/, ""));
const when = (t) => (t ? new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19) : "—");

async function api(path, {method = "GET", body} = {}) {
  const headers = {Authorization: "Bearer " + sessionStorage.getItem(KEY)};
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {method, headers, body: body === undefined ? undefined : JSON.stringify(body),
                                  credentials: "omit", cache: "no-store"});
  const data = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const err = new Error((data.error && data.error.message) || `HTTP ${resp.status}`);
    err.status = resp.status;
    throw err;
  }
  return data;
}

// ---- small building blocks -------------------------------------------------------------

function card(title, ...body) {
  return el("section", {class: "card"}, el("h2", {}, title), ...body);
}

function table(columns, rows, testid) {
  const head = el("tr", {}, columns.map(([label]) => el("th", {}, label)));
  const body = rows.length
    ? rows.map((r) => el("tr", {}, columns.map(([, cell]) => el("td", {}, cell(r)))))
    : [el("tr", {}, el("td", {colspan: columns.length, class: "muted"}, "nothing yet"))];
  return el("table", {"data-testid": testid}, el("thead", {}, head), el("tbody", {}, body));
}

function stat(label, value, testid) {
  return el("div", {class: "stat"}, el("span", {class: "muted"}, label), el("strong", {"data-testid": testid}, value));
}

function barChart(points, testid) {
  // points: [{label, value}] -> an SVG bar chart, drawn without any library.
  const ns = "http://www.w3.org/2000/svg";
  const w = 600, h = 160, pad = 24;
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${w} ${h + pad}`);
  svg.setAttribute("data-testid", testid);
  svg.setAttribute("role", "img");
  const max = Math.max(...points.map((p) => p.value), 0);
  points = max ? points : [];
  const step = points.length ? (w - pad) / points.length : 0;
  points.forEach((p, i) => {
    if (p.value > 0) {                       // a bar for each day with spend
      const bh = Math.max(1, (p.value / max) * (h - pad));
      const bar = document.createElementNS(ns, "rect");
      Object.entries({x: pad + i * step + 2, y: h - bh, width: Math.max(2, step - 4), height: bh, class: "bar"})
        .forEach(([k, v]) => bar.setAttribute(k, v));
      const tip = document.createElementNS(ns, "title");
      tip.textContent = `${p.label}: ${usd(p.value)}`;
      bar.append(tip);
      svg.append(bar);
    }
    if (points.length <= 14 || i % Math.ceil(points.length / 14) === 0) {
      const label = document.createElementNS(ns, "text");
      Object.entries({x: pad + i * step + step / 2, y: h + 16, class: "axis"}).forEach(([k, v]) => label.setAttribute(k, v));
      label.textContent = p.label.slice(5);
      svg.append(label);
    }
  });
  if (!points.length) {
    const empty = document.createElementNS(ns, "text");
    Object.entries({x: w / 2, y: h / 2, class: "axis"}).forEach(([k, v]) => empty.setAttribute(k, v));
    empty.textContent = "no calls yet";
    svg.append(empty);
  }
  return svg;
}

function lastDays(byDay, days = 14) {
  // The last `days` UTC days, with 0 for days without calls, so one busy day is one bar, not the chart.
  const spend = new Map(byDay.map((d) => [d.day, d.usd]));
  const today = Date.UTC(new Date().getUTCFullYear(), new Date().getUTCMonth(), new Date().getUTCDate());
  return Array.from({length: days}, (_, i) => {
    const day = new Date(today - (days - 1 - i) * 86400000).toISOString().slice(0, 10);
    return {label: day, value: spend.get(day) || 0};
  });
}

function shownOnce(key) {
  const node = $("#shown-once").content.firstElementChild.cloneNode(true);
  node.querySelector(".secret").textContent = key;
  node.querySelector(".secret").setAttribute("data-testid", "new-key");
  return node;
}

function form(fields, submitLabel, onSubmit, testid) {
  const error = el("p", {class: "error", role: "alert"});
  const f = el("form", {"data-testid": testid}, fields, el("button", {type: "submit"}, submitLabel), error);
  f.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    error.textContent = "";
    try {
      await onSubmit(new FormData(f));
      f.reset();
    } catch (e) {
      error.textContent = e.message;
    }
  });
  return f;
}

const input = (name, label, attrs = {}) => el("label", {}, label, el("input", {name, ...attrs}));

function usageColumns(withAccount) {
  return [
    ["When", (u) => when(u.created_at ?? u.created)],
    ...(withAccount ? [["Account", (u) => u.account_id ?? "—"]] : []),
    ["Endpoint", (u) => u.endpoint],
    ["Model", (u) => u.model ?? "—"],
    ["Tokens in / out", (u) => `${u.input_tokens ?? u.input_tokens_billed} / ${u.output_tokens ?? u.output_tokens_billed}`],
    ["Charge", (u) => usd(u.usd)],
    ["Outcome", (u) => `${u.outcome ?? ""} ${u.status ?? ""}`],
    ["Billing", (u) => (u.billing && u.billing.note) || ""],
  ];
}

function keysTable(keys, revoke) {
  return table([
    ["Prefix", (k) => el("code", {}, k.prefix)],
    ["Name", (k) => k.name ?? ""],
    ["Created", (k) => when(k.created_at)],
    ["Last used", (k) => when(k.last_used_at)],
    ["Spend", (k) => usd(k.spend_usd)],
    ["Limits", (k) => [k.spend_limit ? `${usd(k.spend_limit.usd)}/${k.spend_limit.period}` : "",
                       k.models ? `models: ${k.models.join(", ")}` : "",
                       k.expires_at ? `expires ${when(k.expires_at)}` : ""].filter(Boolean).join("; ")],
    ["", (k) => (k.revoked_at ? el("span", {class: "muted"}, "revoked " + when(k.revoked_at))
      : el("button", {class: "danger", "data-testid": "revoke-" + k.prefix,
                      on: {click: () => revoke(k)}}, "Revoke"))],
  ], keys, "keys");
}

// ---- the account view ------------------------------------------------------------------

let current = null;          // re-draws the view on screen (the Refresh button)

async function accountView(root) {
  current = () => accountView(root);
  const [me, usage, summary, keys, agents] = await Promise.all([
    api("/api/v1/account"), api("/api/v1/account/usage?limit=20"), api("/api/v1/account/usage/summary"),
    api("/api/v1/account/keys"), api("/api/v1/account/agents")]);
  $("#who").textContent = `account ${me.account_id} · key ${me.key.prefix}…`;
  const fresh = el("div");
  const reload = () => accountView(root);
  root.replaceChildren(
    el("div", {class: "stats"},
       stat("Balance", usd(me.balance_usd), "balance"),
       stat("Free allowance left today", usd(me.free_allowance_left_usd), "allowance")),
    card("Spend by day", barChart(lastDays(summary.by_day), "usage-chart")),
    card("Recent calls", table(usageColumns(false), usage.data, "calls")),
    card("Keys", fresh, keysTable(keys.data, async (k) => {
      if (!confirm(`Revoke ${k.prefix}…? Calls with it will be refused.`)) return;
      await api(`/api/v1/account/keys/${k.id}`, {method: "DELETE"});
      await reload();
    }), form([input("name", "Name", {maxlength: 60})], "Create key", async (data) => {
      const made = await api("/api/v1/account/keys", {method: "POST", body: {name: data.get("name") || null}});
      await reload();
      root.querySelector("[data-testid=keys]").before(shownOnce(made.key));
    }, "create-key")),
    card("Agents", table([["Name", (a) => a.name], ["Id", (a) => a.id], ["Keys", (a) => a.keys ?? ""]],
                         agents.data, "agents")));
}

// ---- the operator view -----------------------------------------------------------------

async function operatorView(root, {q = "", offset = 0, account = null} = {}) {
  $("#who").textContent = "operator";
  if (account !== null) return accountDetail(root, account, () => operatorView(root, {q, offset}));
  current = () => operatorView(root, {q, offset});
  const limit = 20;
  const [accounts, summary, usage, ledger] = await Promise.all([
    api(`/api/v1/admin/accounts?limit=${limit}&offset=${offset}&q=${encodeURIComponent(q)}`),
    api("/api/v1/admin/usage/summary"), api("/api/v1/admin/usage?limit=20"), api("/api/v1/admin/ledger?limit=20")]);
  const search = el("input", {type: "search", placeholder: "search by name or id", value: q, "data-testid": "search"});
  search.addEventListener("change", () => operatorView(root, {q: search.value}));
  const pager = el("div", {class: "pager"},
    el("button", {disabled: offset === 0, on: {click: () => operatorView(root, {q, offset: Math.max(0, offset - limit)})}}, "‹ Previous"),
    el("span", {class: "muted"}, `${accounts.total ? offset + 1 : 0}–${offset + accounts.data.length} of ${accounts.total}`),
    el("button", {disabled: offset + limit >= accounts.total, on: {click: () => operatorView(root, {q, offset: offset + limit})}}, "Next ›"));
  const fresh = el("div");
  root.replaceChildren(
    card("Accounts", search, table([
      ["Id", (a) => a.id],
      ["Name", (a) => el("a", {href: "#", "data-testid": "account-" + a.id,
                               on: {click: (ev) => { ev.preventDefault(); operatorView(root, {q, offset, account: a.id}); }}},
                          a.name ?? "(unnamed)")],
      ["Balance", (a) => usd(a.balance_usd)], ["Keys", (a) => a.keys], ["Created", (a) => when(a.created_at)],
    ], accounts.data, "accounts"), pager, fresh,
      form([input("name", "Name", {required: true, maxlength: 80}),
            input("credits_usd", "Starting credits (USD)", {inputmode: "decimal", value: "0"})],
           "Create account", async (data) => {
             const made = await api("/api/v1/admin/accounts", {method: "POST",
                                    body: {name: data.get("name"), credits_usd: data.get("credits_usd") || "0"}});
             await operatorView(root, {account: made.account.id});
           }, "create-account")),
    card("Spend by day", barChart(lastDays(summary.by_day), "usage-chart")),
    el("div", {class: "columns"},
       card("Spend by model", table([["Model", (r) => r.model ?? "—"], ["Calls", (r) => r.calls], ["Spend", (r) => usd(r.usd)]],
                                    summary.by_model, "by-model")),
       card("Spend by endpoint", table([["Endpoint", (r) => r.endpoint], ["Calls", (r) => r.calls], ["Spend", (r) => usd(r.usd)]],
                                       summary.by_endpoint, "by-endpoint"))),
    card("Recent calls", table(usageColumns(true), usage.data, "calls")),
    card("Ledger", table(ledgerColumns(true), ledger.data, "ledger")));
}

function ledgerColumns(withAccount) {
  return [["When", (e) => when(e.created_at)], ...(withAccount ? [["Account", (e) => e.account_id]] : []),
          ["Kind", (e) => e.kind], ["Amount", (e) => usd(e.usd)], ["Reference", (e) => e.ref ?? ""]];
}

async function accountDetail(root, id, back) {
  current = () => accountDetail(root, id, back);
  const [a, usage, ledger] = await Promise.all([
    api(`/api/v1/admin/accounts/${id}`), api(`/api/v1/admin/usage?account=${id}&limit=20`),
    api(`/api/v1/admin/ledger?account=${id}&limit=20`)]);
  const reload = () => accountDetail(root, id, back);
  const fresh = el("div");
  root.replaceChildren(
    el("button", {class: "link", on: {click: back}}, "‹ All accounts"),
    el("h2", {"data-testid": "account-name"}, `${a.name ?? "(unnamed)"} · account ${a.id}`),
    el("div", {class: "stats"},
       stat("Balance", usd(a.balance_usd), "balance"),
       stat("Free allowance left today", usd(a.free_allowance_left_usd), "allowance"),
       stat("Spend today", usd(a.spend_today_usd), "spend-today"),
       stat("Spend this month", usd(a.spend_month_usd), "spend-month")),
    card("Adjust credits", form([input("usd", "Amount (USD, negative to take back)", {required: true, inputmode: "decimal"}),
                                 input("reason", "Reason", {required: true, maxlength: 200})],
      "Record adjustment", async (data) => {
        await api(`/api/v1/admin/accounts/${id}/credits`, {method: "POST", body: {usd: data.get("usd"), reason: data.get("reason")}});
        await reload();
      }, "adjust-credits")),
    card("Keys", fresh, keysTable(a.keys, async (k) => {
      if (!confirm(`Revoke ${k.prefix}…? Calls with it will be refused.`)) return;
      await api(`/api/v1/admin/keys/${k.id}/revoke`, {method: "POST"});
      await reload();
    }), form([input("name", "Name", {maxlength: 60}),
              input("limit_usd", "Spend limit (USD, optional)", {inputmode: "decimal"}),
              el("label", {}, "per", el("select", {name: "period"}, el("option", {value: "day"}, "day"), el("option", {value: "month"}, "month"))),
              input("models", "Allowed models (comma-separated, optional)")],
      "Create key", async (data) => {
        const body = {name: data.get("name") || null};
        if (data.get("limit_usd")) body.spend_limit = {usd: data.get("limit_usd"), period: data.get("period")};
        if (data.get("models")) body.models = data.get("models").split(",").map((m) => m.trim()).filter(Boolean);
        const made = await api(`/api/v1/admin/accounts/${id}/keys`, {method: "POST", body});
        await reload();
        root.querySelector("[data-testid=keys]").before(shownOnce(made.key));
      }, "create-key")),
    card("Agents", table([["Name", (g) => g.name], ["Id", (g) => g.id]], a.agents, "agents")),
    card("Recent calls", table(usageColumns(false), usage.data, "calls")),
    card("Ledger", table(ledgerColumns(false), ledger.data, "ledger")));
}

// ---- signing in ------------------------------------------------------------------------

async function show() {
  const key = sessionStorage.getItem(KEY);
  $("#sign-in").hidden = !!key;
  $("#sign-out").hidden = !key;
  $("#refresh").hidden = !key;
  const root = $("#view");
  if (!key) {
    root.replaceChildren();
    $("#who").textContent = "";
    return;
  }
  try {
    if (key.startsWith("chk_")) await accountView(root);
    else await operatorView(root);
  } catch (e) {
    sessionStorage.removeItem(KEY);
    await show();
    $("#sign-in-error").textContent = e.status === 401 || e.status === 403 || e.status === 404
      ? "That key was not accepted." : e.message;
  }
}

$("#sign-in-form").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  $("#sign-in-error").textContent = "";
  sessionStorage.setItem(KEY, $("#sign-in-key").value.trim());
  $("#sign-in-key").value = "";
  await show();
});
$("#refresh").addEventListener("click", () => current && current());
$("#sign-out").addEventListener("click", async () => {
  sessionStorage.removeItem(KEY);
  await show();
});
show();
