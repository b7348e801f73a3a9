// The console's pages for an admin key: the tenants with their usage, one tenant's keys, quota and retention (the
// admin routes' own actions, so the audit trail records them as it records curl's), and the audit trail. A key's
// secret is shown once, in the page that made it, and kept nowhere: not in storage, not in the address.
"use strict";
(() => {
  const { h, s, api, show, when, badge, json, number, of, pages, tenantNames, SignInNeeded } = window.FlowStateConsole;
  const PAGE = 50;  // tenants and audit entries a page
  const GRACES = [[0, "ends now"], [600, "works 10 more minutes"], [3600, "works 1 more hour"],
    [86400, "works 1 more day"]];
  const ACTORS = ["admin", "tenant", "shell", "server"];
  const tenantHref = (id) => "#/admin/tenant/" + encodeURIComponent(id);
  // the times an operator types, in UTC (the audit trail's): datetime-local values <-> unix seconds
  const toUnix = (v) => (v ? Date.parse(v.length === 16 ? v + ":00Z" : v + "Z") / 1000 : null);
  const fromUnix = (sec) => (sec ? new Date(sec * 1000).toISOString().slice(0, 16) : "");

  async function tenants() {
    const list = (await api("/v1/admin/tenants")).data;
    for (const t of list) tenantNames.set(t.id, t.name);
    return list;
  }

  // a failed action's message in the page's status line (the sign-in form if the key stopped working)
  async function act(status, action) {
    try {
      return await action();
    } catch (e) {
      if (e instanceof SignInNeeded) throw e;
      status.textContent = e.message;
      return null;
    }
  }

  // -- the tenants ----------------------------------------------------------------------------------------------------

  const COLUMNS = [  // [sort key, heading, the row's value to sort by]
    ["name", "Tenant", (t) => t.name.toLowerCase()], ["created", "Created", (t) => t.created_at],
    ["sessions", "Sessions", (t) => t.sessions], ["keys", "Keys", (t) => t.keys],
    ["requests", "Requests this minute", (t) => t.usage.requests_this_minute],
    ["turns", "Running turns", (t) => t.usage.running_turns], ["tokens", "Tokens today (UTC)", (t) => t.usage.tokens_today],
    ["retention", "Retention", (t) => t.retention || ""]];

  function newTenantForm(status) {
    const name = h("input", { id: "new-tenant-name", required: true, maxlength: 64, placeholder: "name" });
    const limits = ["requests_per_minute", "concurrent_turns", "tokens_per_day"].map((k) =>
      h("input", { type: "number", min: 1, id: "new-tenant-" + k, placeholder: k.replaceAll("_", " "), "data-limit": k }));
    const retention = h("input", { id: "new-tenant-retention", placeholder: "retention: idle=30d,age=180d or off" });
    return h("form", { class: "toolbar", id: "new-tenant", onsubmit: async (e) => {
      e.preventDefault();
      const quota = {};
      for (const input of limits) if (input.value) quota[input.dataset.limit] = Number(input.value);
      const body = { name: name.value, quota };
      if (retention.value) body.retention = retention.value;
      const made = await act(status, () => api("/v1/admin/tenants", { method: "POST", body: JSON.stringify(body) }));
      if (made) location.hash = tenantHref(made.id);
    } }, h("strong", {}, "New tenant"), name, limits, retention, h("button", { type: "submit" }, "Create"));
  }

  async function tenantsPage(params) {
    const list = await tenants();
    const sort = COLUMNS.find((c) => c[0] === params.get("sort")) || COLUMNS[1];
    const desc = params.get("dir") === "desc";
    const value = sort[2];
    list.sort((a, b) => (value(a) < value(b) ? -1 : value(a) > value(b) ? 1 : 0) * (desc ? -1 : 1));
    const pageNo = Math.max(0, Number(params.get("page") || 0) | 0);
    const shown = list.slice(pageNo * PAGE, (pageNo + 1) * PAGE);
    const href = (q) => "#/admin?" + new URLSearchParams(Object.assign({ sort: sort[0], dir: desc ? "desc" : "asc" }, q));
    const status = h("p", { class: "error", role: "alert", id: "admin-error" });
    const head = COLUMNS.map(([key, title]) => h("th", { "aria-sort": key === sort[0] ? (desc ? "descending" : "ascending") : null },
      h("a", { href: href({ sort: key, dir: key === sort[0] && !desc ? "desc" : "asc" }), class: "sort", "data-sort": key },
        title, key === sort[0] ? (desc ? " ▼" : " ▲") : "")));
    const rows = shown.map((t) => h("tr", { "data-tenant": t.id },
      h("td", {}, h("a", { href: tenantHref(t.id), class: "tenant-link" }, t.name), h("div", { class: "muted mono" }, t.id)),
      h("td", {}, when(t.created_at)), h("td", { class: "sessions" }, number(t.sessions)), h("td", {}, number(t.keys)),
      h("td", { class: "requests" }, of(t.usage.requests_this_minute, t.quota.requests_per_minute)),
      h("td", {}, of(t.usage.running_turns, t.quota.concurrent_turns)),
      h("td", { class: "tokens" }, of(t.usage.tokens_today, t.quota.tokens_per_day)),
      h("td", {}, t.retention || h("span", { class: "muted" }, "the server's"))));
    const more = [];
    if (pageNo > 0) more.push(h("a", { href: href({ page: pageNo - 1 }), id: "previous-page" }, "Previous page"));
    if ((pageNo + 1) * PAGE < list.length) more.push(h("a", { href: href({ page: pageNo + 1 }), id: "next-page" }, "Next page"));
    show(h("h1", {}, "Tenants"), h("p", { class: "muted" }, list.length + " tenants; usage is counted while a tenant " +
      "has a limit of some kind"), newTenantForm(status), status,
      list.length ? h("table", { id: "tenants" }, h("thead", {}, h("tr", {}, head)), h("tbody", {}, rows))
        : h("p", { class: "muted" }, "No tenants yet."),
      h("p", { class: "toolbar" }, more));
  }

  // -- one tenant -----------------------------------------------------------------------------------------------------

  // the secret of a key just made: here once, with a copy button; nowhere else, ever
  function secretCard(made, tenant) {
    const copy = h("button", { type: "button", id: "copy-secret", onclick: async () => {
      try { await navigator.clipboard.writeText(made.secret); copy.textContent = "Copied"; } catch (e) {
        copy.textContent = "Copy it by hand";
      }
    } }, "Copy");
    return h("div", { class: "card secret", id: "new-secret", role: "status" },
      h("p", {}, "The secret of key ", h("span", { class: "mono" }, made.id), " of ", tenant.name, ":"),
      h("p", {}, h("code", { id: "secret-value" }, made.secret), " ", copy),
      h("p", { class: "muted" }, "Shown this once: the server keeps only its digest. Store it now."));
  }

  function quotaForm(tenant, status, reload) {
    const fields = [["requests_per_minute", "Requests a minute"], ["concurrent_turns", "Running turns"],
      ["tokens_per_day", "Model tokens a day (UTC)"]];
    const inputs = fields.map(([k]) => h("input", { type: "number", min: 1, id: "quota-" + k, "data-limit": k,
      value: tenant.quota[k] === null ? "" : tenant.quota[k], placeholder: "no limit" }));
    return h("form", { class: "card", id: "quota-form", onsubmit: async (e) => {
      e.preventDefault();
      const quota = {};  // only what the form changed: a PATCH leaves the rest as it is
      for (const input of inputs) {
        const now = input.value === "" ? null : Number(input.value);
        if (now !== tenant.quota[input.dataset.limit]) quota[input.dataset.limit] = now;
      }
      if (!Object.keys(quota).length) { status.textContent = "Nothing changed."; return; }
      if (await act(status, () => api("/v1/admin/tenants/" + encodeURIComponent(tenant.id),
        { method: "PATCH", body: JSON.stringify({ quota }) }))) reload("Quota set.");
    } }, h("h2", {}, "Quota"), fields.map(([k, title], i) => h("label", {}, title + " ", inputs[i])),
    h("button", { type: "submit" }, "Set quota"));
  }

  function retentionForm(tenant, status, reload) {
    const input = h("input", { id: "retention-policy", value: tenant.retention || "",
      placeholder: "the server's (idle=30d,age=180d or off)" });
    return h("form", { class: "card", id: "retention-form", onsubmit: async (e) => {
      e.preventDefault();
      const now = input.value.trim() || null;
      if (now === tenant.retention) { status.textContent = "Nothing changed."; return; }
      if (await act(status, () => api("/v1/admin/tenants/" + encodeURIComponent(tenant.id),
        { method: "PATCH", body: JSON.stringify({ retention: now }) }))) reload("Retention set.");
    } }, h("h2", {}, "Retention"), h("label", {}, "Policy ", input), h("button", { type: "submit" }, "Set retention"));
  }

  function keysTable(tenant, keys, status, reload) {
    const rotate = async (key, grace) => {
      if (grace === 0 && !window.confirm("Rotate key " + key.id + " of " + tenant.name + " and end it now? Clients " +
        "still using it are refused from now on.")) return;
      const made = await act(status, () => api("/v1/admin/keys/" + encodeURIComponent(key.id) + "/rotate",
        { method: "POST", body: JSON.stringify({ grace_s: grace }) }));
      if (made) reload("Key " + key.id + " rotated.", made.new);
    };
    const revoke = async (key) => {
      if (!window.confirm("Revoke key " + key.id + " (" + (key.hint || "static key") + ") of " + tenant.name +
        "? Every client using it is refused from now on; this cannot be undone.")) return;
      if (await act(status, () => api("/v1/admin/keys/" + encodeURIComponent(key.id), { method: "DELETE" }))) {
        reload("Key " + key.id + " revoked.");
      }
    };
    const rows = keys.map((k) => {
      const grace = h("select", { class: "grace", "aria-label": "the old key, once rotated" },
        GRACES.map(([s, text]) => h("option", { value: s, selected: s === 3600 }, text)));
      return h("tr", { "data-key": k.id },
        h("td", { class: "mono" }, k.id), h("td", { class: "mono hint" }, k.hint || "static key"),
        h("td", {}, when(k.created_at)), h("td", { class: "last-used" }, k.last_used_at ? when(k.last_used_at) : "never"),
        h("td", {}, k.expires_at ? when(k.expires_at) : "never"),
        h("td", { class: "state" }, badge(k.state, k.state === "active" ? "accepted" : "refused")),
        h("td", {}, k.state === "active" ? [grace, " ",
          h("button", { type: "button", class: "rotate", onclick: () => rotate(k, Number(grace.value)) }, "Rotate"), " ",
          h("button", { type: "button", class: "danger revoke", onclick: () => revoke(k) }, "Revoke")] : null));
    });
    const days = h("input", { type: "number", min: 1, max: 3650, id: "new-key-days", placeholder: "days (none: until revoked)" });
    const issue = h("form", { class: "toolbar", id: "new-key", onsubmit: async (e) => {
      e.preventDefault();
      const body = days.value ? { expires_in: Number(days.value) * 86400 } : {};
      const made = await act(status, () => api("/v1/admin/tenants/" + encodeURIComponent(tenant.id) + "/keys",
        { method: "POST", body: JSON.stringify(body) }));
      if (made) reload("Key " + made.id + " issued.", made);
    } }, "Expires after ", days, h("button", { type: "submit" }, "Issue a key"));
    return h("div", { class: "card" }, h("h2", {}, "Keys"), issue,
      keys.length ? h("table", { id: "keys" }, h("thead", {}, h("tr", {}, ["Key", "Secret", "Created", "Last used",
        "Expires", "State", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows))
        : h("p", { class: "muted" }, "No keys: issue one for the tenant's clients."));
  }

  // -- use over time: the server's hourly counts, as bars ------------------------------------------------------------

  const CHART = { width: 880, height: 150, left: 64, bottom: 22, top: 18 };

  // one series as bars (with `over` stacked on top in the refusal colour), its peak and the time at both ends
  function bars(points, value, over, title, cls, label) {
    const { width, height, left, bottom, top } = CHART;
    const peak = Math.max(1, ...points.map((p) => value(p) + (over ? over(p) : 0)));
    const step = (width - left) / points.length, inner = height - bottom - top;
    const y = (v) => top + inner - (v / peak) * inner;
    const svg = s("svg", { width, height, class: "chart " + cls, role: "img", "aria-label": title + ", peak " + number(peak) },
      s("text", { x: 0, y: 12, "font-weight": "bold" }, title),
      s("text", { x: left - 6, y: top + 10, "text-anchor": "end" }, number(peak)),
      s("text", { x: left - 6, y: top + inner, "text-anchor": "end" }, "0"),
      s("line", { x1: left, x2: width, y1: top + inner, y2: top + inner, stroke: "#b8bfca" }));
    points.forEach((p, i) => {
      const x = left + i * step, v = value(p), o = over ? over(p) : 0;
      const tip = label(p) + ": " + number(v) + (over ? ", " + number(o) + " refused" : "");
      if (v) svg.append(s("rect", { x: x + 1, y: y(v), width: Math.max(1, step - 2), height: y(0) - y(v),
        class: "bar", "data-start": p.start, "data-value": v }, s("title", {}, tip)));
      if (o) svg.append(s("rect", { x: x + 1, y: y(v + o), width: Math.max(1, step - 2), height: y(v) - y(v + o),
        class: "bar refused", "data-start": p.start, "data-value": o }, s("title", {}, tip)));
    });
    const marks = [[0, "start"], [Math.floor(points.length / 2), "middle"], [points.length - 1, "end"]];
    for (const [i, anchor] of marks) {
      const x = anchor === "end" ? width : left + i * step + (anchor === "middle" ? step / 2 : 0);
      svg.append(s("text", { x, y: height - 6, "text-anchor": anchor }, label(points[i])));
    }
    return svg;
  }

  async function usageCard(tenant, bucket) {
    const found = await api("/v1/admin/tenants/" + encodeURIComponent(tenant.id) + "/usage?bucket=" + bucket);
    const points = found.data;
    const label = (p) => new Date(p.start * 1000).toISOString().slice(bucket === "hour" ? 5 : 0, bucket === "hour" ? 13 : 10)
      .replace("T", " ") + (bucket === "hour" ? "h" : "");
    const used = points.filter((p) => p.requests || p.tokens || p.refused);
    const other = bucket === "hour" ? "day" : "hour";
    const total = (k) => number(points.reduce((n, p) => n + p[k], 0));
    return h("div", { class: "card", id: "usage" },
      h("h2", {}, "Use over time"),
      h("p", { class: "muted" }, (bucket === "hour" ? "The last 48 hours" : "The last 30 days") + " (UTC): " +
        total("requests") + " requests, " + total("tokens") + " model tokens, " + total("refused") + " refused (429). ",
      h("a", { href: tenantHref(tenant.id) + "?usage=" + other, id: "usage-other" }, "By " + other)),
      h("div", { id: "usage-charts", "data-bucket": bucket },
        bars(points, (p) => p.requests, (p) => p.refused, "Requests (refused on top)", "requests", label),
        bars(points, (p) => p.tokens, null, "Model tokens", "tokens", label)),
      h("details", {}, h("summary", {}, "As a table (" + used.length + " " + bucket + "s with use)"),
        h("table", { id: "usage-table" }, h("thead", {}, h("tr", {}, [bucket === "hour" ? "Hour" : "Day", "Requests",
          "Model tokens", "Refused"].map((t) => h("th", {}, t)))),
        h("tbody", {}, used.map((p) => h("tr", {}, h("td", {}, label(p)), h("td", {}, number(p.requests)),
          h("td", {}, number(p.tokens)), h("td", {}, number(p.refused))))))));
  }

  // erase a subject in the tenant's memory: what would go first (a dry run), then the erasure after a confirmation
  // naming it, then its receipt
  function erasureCard(tenant, status) {
    const path = "/v1/admin/tenants/" + encodeURIComponent(tenant.id) + "/erasure";
    const subject = h("input", { id: "erasure-subject", required: true, maxlength: 512,
      placeholder: "a session name or an end-user id" });
    const out = h("div", { id: "erasure-out" });
    const counts = (removed) => h("ul", { class: "counts" }, Object.entries(removed).filter(([, n]) => n)
      .map(([kind, n]) => h("li", {}, number(n) + " " + kind.replaceAll("_", " "))));
    const erase = async (who, seen) => {
      if (!window.confirm("Erase everything tenant " + tenant.name + " stores about " + JSON.stringify(who) + ": " +
        seen.sessions.length + " sessions and all they hold? This cannot be undone.")) return;
      const receipt = await act(status, () => api(path, { method: "POST", body: JSON.stringify({ subject: who }) }));
      if (!receipt) return;
      out.replaceChildren(h("div", { id: "erasure-receipt" }, h("h3", {}, "Erased: receipt ",
        h("span", { class: "mono", id: "receipt-id" }, receipt.id)), counts(receipt.removed),
      h("p", { class: "muted" }, "At " + when(Math.floor(receipt.at)) + "; the subject kept only as a salted digest (" +
        receipt.subject_sha256.slice(0, 16) + "…); receipt digest " + receipt.digest.slice(0, 16) + "…"),
      (receipt.mentions || []).length ? [h("p", {}, "Other sessions that still mention it (not erased; review them):"),
        h("ul", { id: "erasure-mentions" }, receipt.mentions.map((m) => h("li", {}, m.session + ": " + m.requests +
          " requests, " + m.nodes + " states")))] : null,
      h("ul", { class: "muted" }, receipt.storage.map((note) => h("li", {}, note)))));
    };
    return h("form", { class: "card", id: "erasure-form", onsubmit: async (e) => {
      e.preventDefault();
      const who = subject.value;
      const seen = await act(status, () => api(path, { method: "POST", body: JSON.stringify({ subject: who, dry_run: true }) }));
      if (!seen) return;
      out.replaceChildren(h("div", { id: "erasure-preview" },
        h("p", {}, "An erasure of ", h("strong", {}, who), " would remove " + seen.sessions.length + " sessions:"),
        h("ul", { id: "erasure-sessions" }, seen.sessions.map((n) => h("li", { class: "mono" }, n))), counts(seen.removed),
        seen.sessions.length ? h("button", { type: "button", class: "danger", id: "erase", onclick: () => erase(who, seen) },
          "Erase") : h("p", { class: "muted" }, "Nothing is stored about it.")));
    } }, h("h2", {}, "Erase a subject"), h("p", { class: "muted" }, "Everything the tenant stores about a person or " +
      "a session, gone from the database with a receipt (forgetting.md)."),
    h("label", {}, "Subject ", subject), h("button", { type: "submit" }, "Show what would go"), out);
  }

  async function tenantPage(id, note, made, params) {
    const tenant = (await tenants()).find((t) => t.id === id);
    if (!tenant) {
      show(h("h1", {}, "No such tenant"), h("p", { class: "error", role: "alert" }, "This server has no tenant " + id + "."),
        h("p", {}, h("a", { href: "#/admin" }, "Back to the tenants")));
      return;
    }
    const keys = (await api("/v1/admin/tenants/" + encodeURIComponent(id) + "/keys")).data;
    const status = h("p", { class: "error", role: "alert", id: "admin-error" });
    const bucket = params && params.get("usage") === "day" ? "day" : "hour";
    const usage = await usageCard(tenant, bucket);
    const reload = (text, key) => tenantPage(id, text, key, params);
    const reading = "#/t/" + encodeURIComponent(id);
    show(h("h1", {}, "Tenant ", h("span", { id: "tenant-name" }, tenant.name)),
      h("p", { class: "muted" }, h("span", { class: "mono" }, tenant.id), " · created " + when(tenant.created_at) +
        " · " + number(tenant.sessions) + " sessions"),
      h("p", { class: "toolbar" }, h("a", { href: reading + "/", id: "read-sessions" }, "Its sessions (read-only)"),
        h("a", { href: reading + "/search" }, "Search its memory"),
        h("a", { href: "#/admin/audit?" + new URLSearchParams({ tenant: id }), id: "tenant-audit" }, "Its audit trail")),
      h("p", { id: "tenant-usage", class: "muted" }, "Requests this minute: ",
        of(tenant.usage.requests_this_minute, tenant.quota.requests_per_minute), " · Running turns: ",
        of(tenant.usage.running_turns, tenant.quota.concurrent_turns), " · Model tokens today (UTC): ",
        of(tenant.usage.tokens_today, tenant.quota.tokens_per_day)),
      note ? h("p", { class: "notice", id: "admin-notice", role: "status" }, note) : null, status,
      made && made.secret ? secretCard(made, tenant) : null,
      keysTable(tenant, keys, status, reload), usage,
      h("div", { class: "forms" }, quotaForm(tenant, status, reload), retentionForm(tenant, status, reload)),
      erasureCard(tenant, status));
  }

  // -- the audit trail ------------------------------------------------------------------------------------------------

  const FILTERS = ["tenant", "actor", "action", "since", "until"];

  function auditQuery(params, limit) {
    const q = new URLSearchParams({ limit: String(limit) });
    for (const k of FILTERS) if (params.get(k)) q.set(k, params.get(k));
    return q;
  }

  async function exportAudit(params, status) {
    const lines = [];
    for (let after = null; ;) {
      const q = auditQuery(params, 1000);
      if (after) q.set("after", after);
      const found = await api("/v1/admin/audit?" + q);
      for (const e of found.data) lines.push(JSON.stringify(e));
      if (!found.has_more) break;
      after = found.last_id;
    }
    const link = h("a", { href: URL.createObjectURL(new Blob(lines.map((l) => l + "\n"), { type: "application/x-ndjson" })),
      download: "audit.jsonl", hidden: true });
    document.body.append(link);
    link.click();
    link.remove();
    status.textContent = "Exported " + lines.length + " entries as audit.jsonl.";
  }

  async function auditPage(params) {
    const list = await tenants();
    const tenant = h("select", { id: "audit-tenant" }, h("option", { value: "" }, "any tenant"),
      list.map((t) => h("option", { value: t.id, selected: params.get("tenant") === t.id }, t.name)));
    const actor = h("select", { id: "audit-actor" }, h("option", { value: "" }, "any actor"),
      ACTORS.map((a) => h("option", { value: a, selected: params.get("actor") === a }, a)));
    const action = h("input", { id: "audit-action", placeholder: "action, e.g. key.create", value: params.get("action") || "" });
    const since = h("input", { type: "datetime-local", id: "audit-since", value: fromUnix(Number(params.get("since"))) });
    const until = h("input", { type: "datetime-local", id: "audit-until", value: fromUnix(Number(params.get("until"))) });
    const form = h("form", { class: "toolbar", id: "audit-filter", onsubmit: (e) => {
      e.preventDefault();
      const next = new URLSearchParams();
      for (const [k, v] of [["tenant", tenant.value], ["actor", actor.value], ["action", action.value.trim()],
        ["since", toUnix(since.value)], ["until", toUnix(until.value)]]) if (v) next.set(k, v);
      location.hash = "#/admin/audit?" + next;
    } }, tenant, actor, action, h("label", {}, "from ", since, " UTC"), h("label", {}, "until ", until, " UTC"),
    h("button", { type: "submit" }, "Filter"));
    const status = h("p", { class: "error", role: "alert", id: "audit-error" });
    const exported = h("p", { class: "muted", id: "audit-exported", role: "status" });
    const exportButton = h("button", { type: "button", id: "audit-export", onclick: () =>
      act(status, () => exportAudit(params, exported)) }, "Export as JSON lines");
    const q = auditQuery(params, PAGE);
    if (params.get("after")) q.set("after", params.get("after"));
    let found;
    try { found = await api("/v1/admin/audit?" + q); } catch (e) {
      if (e instanceof SignInNeeded) throw e;
      status.textContent = e.message;
      show(h("h1", {}, "Audit trail"), form, status);
      return;
    }
    const rows = found.data.map((e) => h("tr", { "data-entry": e.id, "data-action": e.action },
      h("td", {}, when(Math.floor(e.at))), h("td", {}, e.tenant ? (tenantNames.get(e.tenant) || e.tenant) : "—"),
      h("td", {}, e.actor, e.key ? h("div", { class: "muted mono" }, e.key) : null),
      h("td", { class: "mono action" }, e.action), h("td", { class: "mono target" }, e.target),
      h("td", {}, badge(e.result, e.result === "ok" ? "accepted" : "refused")),
      h("td", {}, Object.keys(e.detail).length ? h("details", {}, h("summary", {}, "detail"),
        h("pre", { class: "detail" }, json(e.detail))) : null)));
    const first = new URLSearchParams(auditQuery(params, PAGE));
    first.delete("limit");
    const more = [];
    if (params.get("after")) more.push(h("a", { href: "#/admin/audit?" + first }, "First page"));
    if (found.has_more) {
      const next = new URLSearchParams(first);
      next.set("after", found.last_id);
      more.push(h("a", { href: "#/admin/audit?" + next, id: "next-page" }, "Next page"));
    }
    show(h("h1", {}, "Audit trail"), h("p", { class: "muted" }, "Oldest first; every admin action, data action and " +
      "refusal, with the acting key's id (never a secret)."), form, h("p", { class: "toolbar" }, exportButton), exported,
    status, found.data.length ? h("table", { id: "audit" }, h("thead", {}, h("tr", {}, ["At (UTC)", "Tenant", "Actor",
      "Action", "Target", "Result", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows))
      : h("p", { class: "muted" }, "No entry matches."),
    h("p", { class: "toolbar" }, more));
  }

  pages.admin = async (parts, params) => {
    if (parts[0] === "tenant" && parts[1]) await tenantPage(parts[1], null, null, params);
    else if (parts[0] === "audit") await auditPage(params);
    else await tenantsPage(params);
  };
})();
