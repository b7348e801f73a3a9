// FlowState's console: a view of the public routes (/v1/sessions, a session and its requests, /v1/memory/search),
// read with the key the user signed in with; with an admin key, the operator's pages (admin.js) and any tenant's
// memory read-only (X-FlowState-Tenant). Every value from a model, a tool or a user is set as text (never as
// HTML), the key stays in this tab's session storage and travels only as a bearer token.
"use strict";
(() => {
  const KEY = "flowstate.console.key";
  const ROLE = "flowstate.console.role";  // "admin" for an admin key, else a tenant's key
  const TENANT_HEADER = "X-FlowState-Tenant";
  const SVG = "http://www.w3.org/2000/svg";
  const TYPES = ["preference", "knowledge", "attribute", "judgement", "artifact"];
  const RELATIONS = ["supports", "derives", "follows", "supersedes"];
  // the palette is console.css's (--t-TYPE, --r-RELATION), the one place it is written (the server's graph page
  // reads it there too)
  const palette = (prefix, names) => Object.fromEntries(names.map((n) =>
    [n, getComputedStyle(document.documentElement).getPropertyValue("--" + prefix + n).trim()]));
  const TYPE_COLOURS = palette("t-", [...TYPES, "observation"]);
  const RELATION_COLOURS = palette("r-", RELATIONS);
  const POLL_MS = 1500;
  const main = document.getElementById("main");
  let poll = null;
  let viewing = null;  // the tenant an admin key reads (#/t/ID/…), or null
  const pages = {};  // further pages by their first path part (admin.js adds "admin")
  const tenantNames = new Map();  // tenant id -> name, as the admin pages last read them

  class SignInNeeded extends Error {}

  // -- building the page: elements with text children only -------------------------------------------------------

  function build(doc, ns, tag, attrs, children) {
    const e = ns ? doc.createElementNS(ns, tag) : doc.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else if (k === "class") e.setAttribute("class", v);
      else e.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
      if (c === null || c === undefined || c === false) continue;
      e.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return e;
  }
  const h = (tag, attrs, ...children) => build(document, null, tag, attrs, children);
  const s = (tag, attrs, ...children) => build(document, SVG, tag, attrs, children);

  function show(...nodes) {
    main.replaceChildren(...(viewing ? [viewingBanner()] : []), ...nodes);
  }

  // on every page of a tenant an admin key reads: whose memory it is, and that it is read-only and audited
  function viewingBanner() {
    const name = tenantNames.get(viewing);
    return h("p", { id: "viewing", class: "banner", role: "status" }, "Tenant ",
      h("strong", { id: "viewing-name" }, name || viewing), name ? " (" + viewing + ")" : null,
      " — read with the admin key, read-only; every read is in the audit trail. ",
      h("a", { href: "#/admin/tenant/" + encodeURIComponent(viewing) }, "Back to the tenant"));
  }

  const number = (n) => (n === null || n === undefined ? "—" : Number(n).toLocaleString("en"));
  // a figure against its limit: "2 / 100", "0 / no limit"
  const of = (used, limit) => number(used) + " / " + (limit === null || limit === undefined ? "no limit" : number(limit));
  const clip = (text, n) => (text.length <= n ? text : text.slice(0, n - 1) + "…");
  const when = (sec) => (sec ? new Date(sec * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC" : "—");
  const json = (value) => JSON.stringify(value, null, 2);
  // a page's address, in the tenant an admin key reads when it reads one
  const at = (path) => (viewing ? "#/t/" + encodeURIComponent(viewing) : "#") + path;
  const isAdmin = () => sessionStorage.getItem(ROLE) === "admin";
  const sessionHref = (name, state) =>
    at("/session/") + encodeURIComponent(name) + (state ? "?state=" + encodeURIComponent(state) : "");
  const kindOf = (node) => (node.kind === "observation" ? "observation" : node.type);
  const badge = (text, cls) => h("span", { class: "badge " + (cls || "") }, text);
  const typeBadge = (kind) => h("span", { class: "badge t-" + kind }, kind);

  // -- the API, with the signed-in key ---------------------------------------------------------------------------

  async function call(path, options) {
    const headers = Object.assign({}, (options && options.headers) || {});
    const key = sessionStorage.getItem(KEY);
    if (key) headers.Authorization = "Bearer " + key;
    if (viewing && !path.startsWith("/v1/admin/")) headers[TENANT_HEADER] = viewing;
    if (options && options.body !== undefined) headers["Content-Type"] = "application/json";
    const res = await fetch(path, Object.assign({ cache: "no-store" }, options || {}, { headers }));
    if (res.status === 304) return { res, body: null };
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    if (res.status === 401) throw new SignInNeeded(body && body.error ? body.error.message : "sign in");
    if (!res.ok) {
      const err = new Error(body && body.error ? body.error.message : res.status + " " + res.statusText);
      err.status = res.status;
      throw err;
    }
    return { res, body };
  }

  async function api(path, options) {
    return (await call(path, options)).body;
  }

  // a read that a poll repeats: with the entity tag of the last answer, null when nothing changed (a 304)
  async function changed(path, last) {
    const { res, body } = await call(path, last && last.tag ? { headers: { "If-None-Match": last.tag } } : {});
    return res.status === 304 ? null : { body, tag: res.headers.get("ETag") };
  }

  const sessionPath = (name) => "/v1/sessions/" + encodeURIComponent(name);

  // -- sign in ------------------------------------------------------------------------------------------------------

  function signIn(message) {
    stopPolling();
    document.getElementById("sign-out").hidden = true;
    const form = document.getElementById("sign-in-template").content.firstElementChild.cloneNode(true);
    show(form);
    const error = form.querySelector("#sign-in-error");
    error.textContent = message || "";
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const key = form.querySelector("#api-key").value;
      sessionStorage.setItem(KEY, key);
      sessionStorage.removeItem(ROLE);
      try {
        await api("/v1/sessions?limit=1");
      } catch (e) {
        let admin = false;
        if (e.status === 403) {  // an admin key reads no memory of its own: the admin routes say it is one
          try { await api("/v1/admin/tenants"); admin = true; } catch (e2) { admin = false; }
        }
        if (!admin) {
          sessionStorage.removeItem(KEY);
          error.textContent = e instanceof SignInNeeded || e.status === 403
            ? "That key is not one this server takes." : e.message;
          return;
        }
        sessionStorage.setItem(ROLE, "admin");
      }
      form.querySelector("#api-key").value = "";
      document.getElementById("sign-out").hidden = false;
      if (isAdmin() && !location.hash.startsWith("#/admin")) location.hash = "#/admin";
      route();
    });
  }

  document.getElementById("sign-out").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    sessionStorage.removeItem(ROLE);
    tenantNames.clear();
    location.hash = "#/";
    signIn("Signed out.");
  });

  // -- sessions -----------------------------------------------------------------------------------------------------

  // the signed-in tenant's usage against its quota (GET /v1/usage); nothing on a server without tenants
  async function quotaLine() {
    let u;
    try { u = await api("/v1/usage"); } catch (e) { return null; }
    if (!u.tenant) return null;
    return h("p", { id: "quota", class: "muted", "aria-label": "usage against quota" },
      "Requests this minute: ", of(u.usage.requests_this_minute, u.quota.requests_per_minute),
      " · Running turns: ", of(u.usage.running_turns, u.quota.concurrent_turns),
      " · Model tokens today (UTC): ", of(u.usage.tokens_today, u.quota.tokens_per_day));
  }

  async function sessionsPage(params) {
    const name = params.get("name") || "";
    const after = params.get("after");
    const query = new URLSearchParams({ limit: "50" });
    if (name) query.set("name", name);
    if (after) query.set("after", after);
    const list = await api("/v1/sessions?" + query);
    const quota = await quotaLine();
    const filter = h("input", { type: "search", id: "session-filter", placeholder: "filter by name", value: name });
    const form = h("form", { class: "toolbar", onsubmit: (e) => {
      e.preventDefault();
      location.hash = at("/") + (filter.value ? "?name=" + encodeURIComponent(filter.value) : "");
    } }, filter, h("button", { type: "submit" }, "Filter"));
    const status = h("p", { class: "error", role: "alert", id: "sessions-error" });
    const rows = list.data.map((row) => h("tr", { "data-session": row.id },
      h("td", {}, h("a", { href: sessionHref(row.id), class: "session-link" }, row.id), " ",
        row.running ? badge("running", "running") : null),
      h("td", {}, row.requests), h("td", {}, row.states), h("td", {}, when(row.last_activity)),
      h("td", {}, when(row.created_at)), h("td", {}, row.strategy || "—"),
      h("td", {}, row.forked_from ? h("a", { href: sessionHref(row.forked_from.session) },
        row.forked_from.session + " @" + row.forked_from.requests) : "—"),
      h("td", {}, viewing ? null : h("button", { type: "button", class: "danger delete",
        onclick: () => remove(row.id, status) }, "Delete"))));
    const more = [];
    if (after) more.push(h("a", { href: at("/") + (name ? "?name=" + encodeURIComponent(name) : "") }, "First page"));
    if (list.has_more) {
      const next = new URLSearchParams({ after: list.last_id });
      if (name) next.set("name", name);
      more.push(h("a", { href: at("/?") + next, id: "next-page" }, "Next page"));
    }
    show(h("h1", {}, "Sessions"), quota, form, status,
      list.data.length ? h("table", { id: "sessions" },
        h("thead", {}, h("tr", {}, ["Session", "Requests", "States", "Last activity", "Created", "Strategy",
          "Forked from", ""].map((t) => h("th", {}, t)))),
        h("tbody", {}, rows))
        : h("p", { class: "muted" }, name ? "No session's name contains that." : "No sessions yet."),
      h("p", { class: "toolbar" }, more));
  }

  async function remove(name, status) {
    if (!window.confirm("Delete session " + name + " and all of its memory? This cannot be undone.")) return;
    try {
      await api(sessionPath(name), { method: "DELETE" });
    } catch (e) {
      if (e instanceof SignInNeeded) throw e;
      status.textContent = "Not deleted: " + e.message;
      return;
    }
    route();
  }

  // -- one session ----------------------------------------------------------------------------------------------------

  function relationsOf(dump) {
    const incoming = new Map();
    for (const node of dump.nodes) {
      for (const rel of node.relations) {
        if (!incoming.has(rel.target)) incoming.set(rel.target, []);
        incoming.get(rel.target).push({ rel: rel.rel, source: node.id });
      }
    }
    return incoming;
  }

  // What the graph shows, kept across a page's repaints (a poll redraws the page): the zoom, the state types,
  // relations and requests shown.
  function graphView() {
    return { zoom: 1, types: new Set([...TYPES, "observation"]), relations: new Set(RELATIONS), from: null, to: null };
  }
  const ZOOMS = [0.25, 0.5, 0.75, 1, 1.5, 2];
  const DRAWN_MARGIN = 200;  // pixels of the drawing drawn past each edge of the view, so a scroll shows no gap
  const shownBy = (view, node) => view.types.has(kindOf(node)) &&
    (view.from === null || node.request >= view.from) && (view.to === null || node.request <= view.to);

  // the graph as the server lays it out (serving/graph.py's layout, the session's `layout` with ?layout=true): the
  // graph page draws the same one. Only what is in view is drawn (a session of thousands of states is a few hundred
  // elements at a time), again as the view is scrolled, dragged, zoomed or filtered.
  function graph(dump, selected, select, view) {
    const lay = dump.layout, w = lay.node_width, nh = lay.node_height;
    const nodes = new Map(dump.nodes.map((n) => [n.id, n]));
    const queries = new Map(dump.requests.map((r) => [r.index, r.query]));
    const at = new Map(lay.nodes.map((spot) => [spot.id, spot]));
    const column = new Map();  // a column's x -> the spots in it
    for (const spot of lay.nodes) {
      if (!column.has(spot.x)) column.set(spot.x, []);
      column.get(spot.x).push(spot);
    }
    const svg = s("svg", { id: "state-graph", role: "group", viewBox: "0 0 " + lay.width + " " + lay.height,
      "aria-label": "state graph: " + dump.nodes.length + " nodes over " + dump.requests.length + " requests" });
    const defs = s("defs", {});
    for (const [rel, colour] of Object.entries(RELATION_COLOURS)) {
      defs.append(s("marker", { id: "arrow-" + rel, viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7,
        markerHeight: 7, orient: "auto-start-reverse" }, s("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: colour })));
    }
    const drawn = s("g", { id: "graph-drawn" });
    svg.append(defs, drawn);
    const scroller = h("div", { class: "graph", id: "graph-scroll" }, svg);
    const count = h("span", { class: "muted", id: "graph-shown" });

    function nodeBox(node, x, y) {
      const kind = kindOf(node);
      return s("g", { class: "node" + (node.id === selected ? " selected" : ""), "data-id": node.id,
        "data-type": kind, tabindex: 0, role: "button", "aria-pressed": node.id === selected ? "true" : "false",
        "aria-label": node.id + ", " + kind + ", request " + node.request + ": " + node.summary,
        onclick: () => select(node.id),
        onkeydown: (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); select(node.id); } },
        onmouseenter: () => tipAt(node, x, y), onfocus: () => tipAt(node, x, y), onmouseleave: hideTip, onblur: hideTip },
        s("title", {}, node.id + " (" + kind + ")\n" + node.summary),
        s("rect", { x, y, width: w, height: nh, rx: 6, fill: TYPE_COLOURS[kind] || "#ddd" }),
        s("text", { x: x + 8, y: y + 16, "font-weight": "bold" }, clip(node.id, 30)),
        s("text", { x: x + 8, y: y + 32 }, clip(node.summary, 32)));
    }
    // the part of the drawing in view (and a margin around it), in the layout's pixels
    function inView() {
      const z = view.zoom, vw = scroller.clientWidth || 1400, vh = scroller.clientHeight || 560;
      return { x0: (scroller.scrollLeft - DRAWN_MARGIN) / z, y0: (scroller.scrollTop - DRAWN_MARGIN) / z,
        x1: (scroller.scrollLeft + vw + DRAWN_MARGIN) / z, y1: (scroller.scrollTop + vh + DRAWN_MARGIN) / z };
    }
    const visible = (id) => at.has(id) && shownBy(view, nodes.get(id));
    // each part drawn is kept while it stays in view (a scroll adds and removes only what enters and leaves it, so
    // the state under the pointer or with the focus stays the same element)
    const layers = [s("g", {}), s("g", {}), s("g", {})].map((g) => ({ g, drawn: new Map() }));
    drawn.append(...layers.map((l) => l.g));
    function keep(layer, wanted) {
      for (const [key, el] of layer.drawn) if (!wanted.has(key)) { el.remove(); layer.drawn.delete(key); }
      for (const [key, make] of wanted) {
        if (layer.drawn.has(key)) continue;
        const el = make();
        layer.g.append(el);
        layer.drawn.set(key, el);
      }
    }
    function draw() {
      const r = inView(), cols = new Map(), edges = new Map(), boxes = new Map();
      for (const col of lay.columns) {
        if (col.x + w < r.x0 || col.x > r.x1) continue;
        if (view.from !== null && col.index < view.from || view.to !== null && col.index > view.to) continue;
        const query = queries.get(col.index) || "";
        cols.set(col.index, () => s("g", {}, s("text", { x: col.x, y: 22, "font-weight": "bold" }, "request " + col.index),
          s("text", { x: col.x, y: 40 }, s("title", {}, query), clip(query, 34))));
      }
      lay.edges.forEach((edge, i) => {
        if (!view.relations.has(edge.rel) || !visible(edge.source) || !visible(edge.target)) return;
        const a = at.get(edge.source), b = at.get(edge.target);
        if (Math.max(a.x, b.x) + 2 * w < r.x0 || Math.min(a.x, b.x) > r.x1 ||
          Math.max(a.y, b.y) + nh < r.y0 || Math.min(a.y, b.y) > r.y1) return;
        const colour = RELATION_COLOURS[edge.rel] || "#555";
        edges.set(i, () => s("g", {}, s("path", { class: "edge", "data-rel": edge.rel, d: edge.path, fill: "none",
          stroke: colour, "stroke-width": 1.5, "marker-end": "url(#arrow-" + edge.rel + ")" }),
        s("text", { x: edge.label_x, y: edge.label_y, fill: colour }, edge.rel)));
      });
      for (const [x, spots] of column) {
        if (x + w < r.x0 || x > r.x1) continue;
        for (const spot of spots) {
          if (spot.y + nh < r.y0 || spot.y > r.y1 || !visible(spot.id)) continue;
          boxes.set(spot.id, () => nodeBox(nodes.get(spot.id), x, spot.y));
        }
      }
      [cols, edges, boxes].forEach((wanted, i) => keep(layers[i], wanted));
    }
    function sized() {
      svg.setAttribute("width", Math.round(lay.width * view.zoom));
      svg.setAttribute("height", Math.round(lay.height * view.zoom));
      zoomLabel.textContent = Math.round(view.zoom * 100) + "%";
    }
    function counted() {
      const n = dump.nodes.filter((node) => at.has(node.id) && shownBy(view, node)).length;
      count.textContent = n === at.size ? number(n) + " states" : "showing " + number(n) + " of " + number(at.size);
    }
    // zoom about the middle of the view
    function zoomTo(z) {
      const vw = scroller.clientWidth, vh = scroller.clientHeight;
      const cx = (scroller.scrollLeft + vw / 2) / view.zoom, cy = (scroller.scrollTop + vh / 2) / view.zoom;
      view.zoom = z;
      sized();
      scroller.scrollLeft = cx * z - vw / 2;
      scroller.scrollTop = cy * z - vh / 2;
      draw();
    }
    const step = (by) => () => {
      const i = ZOOMS.indexOf(view.zoom);
      zoomTo(ZOOMS[Math.max(0, Math.min(ZOOMS.length - 1, (i < 0 ? 3 : i) + by))]);
    };
    const zoomLabel = h("span", { id: "graph-zoom", class: "muted" });
    // the view's middle on a state (scrolled only if it is out of view)
    function reveal(id) {
      const spot = at.get(id);
      if (!spot) return;
      const z = view.zoom, vw = scroller.clientWidth, vh = scroller.clientHeight;
      const x = spot.x * z, y = spot.y * z;
      if (x < scroller.scrollLeft || x + w * z > scroller.scrollLeft + vw) scroller.scrollLeft = x + w * z / 2 - vw / 2;
      if (y < scroller.scrollTop || y + nh * z > scroller.scrollTop + vh) scroller.scrollTop = y + nh * z / 2 - vh / 2;
      draw();
    }
    scroller.reveal = reveal;
    const changedFilter = () => { counted(); draw(); };
    const box = (set, name, label) => h("label", { class: "check" }, h("input", { type: "checkbox", id: "graph-" + name,
      checked: set.has(name), onchange: (e) => { if (e.target.checked) set.add(name); else set.delete(name); changedFilter(); } }),
    label || name);
    const bound = (which, label) => h("label", { class: "check" }, label, h("input", { type: "number", min: 1,
      id: "graph-" + which, class: "short", value: view[which] === null ? "" : view[which], onchange: (e) => {
        view[which] = e.target.value === "" ? null : Number(e.target.value);
        changedFilter();
        const first = lay.columns.find((c) => view.from === null || c.index >= view.from);
        if (which === "from" && first) { scroller.scrollLeft = Math.max(0, first.x * view.zoom - 20); draw(); }
      } }));
    const note = h("span", { id: "graph-find-note", class: "muted", role: "status" });
    const find = h("form", { id: "graph-find", class: "check", onsubmit: (e) => {
      e.preventDefault();
      const id = find.querySelector("input").value.trim();
      if (!at.has(id)) {
        const like = id ? dump.nodes.filter((n) => n.id.includes(id)).slice(0, 5).map((n) => n.id) : [];
        note.textContent = id ? "No state " + id + " in this session." + (like.length ? " Like it: " + like.join(", ") : "")
          : "Type a state's id.";
        return;
      }
      if (!visible(id)) {  // shown again: the filters that hid it are lifted
        Object.assign(view, graphView(), { zoom: view.zoom });
        note.textContent = "The filters hid " + id + "; they are cleared.";
      } else note.textContent = "";
      select(id);
    } }, h("input", { type: "search", id: "graph-find-id", placeholder: "state id", "aria-label": "find a state by id" }),
    h("button", { type: "submit" }, "Find"));
    const tools = h("div", { class: "toolbar graph-tools", id: "graph-tools" },
      h("span", { class: "group" }, h("button", { type: "button", id: "zoom-out", "aria-label": "zoom out", onclick: step(-1) }, "−"),
        zoomLabel, h("button", { type: "button", id: "zoom-in", "aria-label": "zoom in", onclick: step(1) }, "+")),
      h("span", { class: "group" }, "Types:", [...TYPES, "observation"].map((t) => box(view.types, t))),
      h("span", { class: "group" }, "Relations:", RELATIONS.map((r) => box(view.relations, r))),
      h("span", { class: "group" }, bound("from", "Requests from "), bound("to", " to ")), find, note, count);
    // dragging the background pans (the scroll bars and the wheel do too)
    let drag = null;
    svg.addEventListener("pointerdown", (e) => {
      if (e.button !== 0 || e.target.closest(".node")) return;
      drag = { x: e.clientX, y: e.clientY, left: scroller.scrollLeft, top: scroller.scrollTop };
      svg.setPointerCapture(e.pointerId);
    });
    svg.addEventListener("pointermove", (e) => {
      if (!drag) return;
      scroller.scrollLeft = drag.left - (e.clientX - drag.x);
      scroller.scrollTop = drag.top - (e.clientY - drag.y);
    });
    const drop = () => { drag = null; };
    svg.addEventListener("pointerup", drop);
    svg.addEventListener("pointercancel", drop);
    scroller.addEventListener("scroll", draw);
    scroller.addEventListener("keydown", (e) => {
      if (e.key === "+" || e.key === "=") step(1)(); else if (e.key === "-") step(-1)(); else return;
      e.preventDefault();
    });
    // a state's whole summary, under its box while the pointer or the focus is on it (the box shows 32 characters)
    const tip = h("div", { class: "graph-tip", id: "graph-tip", role: "tooltip", hidden: true });
    scroller.append(tip);
    function tipAt(node, x, y) {
      tip.replaceChildren(h("strong", {}, node.id), " ", node.summary);
      tip.style.left = x * view.zoom + "px";
      tip.style.top = (y + nh) * view.zoom + 4 + "px";
      tip.style.maxWidth = Math.max(w, 320) + "px";
      tip.hidden = false;
    }
    function hideTip() { tip.hidden = true; }
    sized();
    counted();
    draw();
    requestAnimationFrame(draw);  // once in the page, with the view's real size
    return h("div", { id: "graph-view" }, tools, scroller);
  }

  function statePanel(dump, id, select) {
    const nodes = new Map(dump.nodes.map((n) => [n.id, n]));
    const node = nodes.get(id);
    if (!node) return h("div", { class: "card panel", id: "state" }, h("p", { class: "muted" },
      id ? "This session has no state " + id + "." : "Select a state in the graph to see its history."));
    const incoming = relationsOf(dump).get(id) || [];
    const link = (target) => nodes.has(target)
      ? h("a", { href: "#", class: "state-link", "data-target": target, onclick: (e) => { e.preventDefault(); select(target); } },
        target, " ", typeBadge(kindOf(nodes.get(target))))
      : h("span", { class: "mono" }, target, " (not in this session)");
    const older = [], newer = [];
    for (let cur = node, seen = new Set([id]); ;) {  // what it supersedes, back to the first version
      const rel = cur.relations.find((r) => r.rel === "supersedes" && nodes.has(r.target) && !seen.has(r.target));
      if (!rel) break;
      seen.add(rel.target);
      cur = nodes.get(rel.target);
      older.push(cur.id);
    }
    for (let cur = id, seen = new Set([id]); ;) {  // what supersedes it, up to the current version
      const by = (relationsOf(dump).get(cur) || []).find((r) => r.rel === "supersedes" && !seen.has(r.source));
      if (!by) break;
      seen.add(by.source);
      newer.push(by.source);
      cur = by.source;
    }
    const chain = [...older.reverse(), id, ...newer];
    return h("div", { class: "card panel", id: "state", "data-state": id },
      h("h2", {}, typeBadge(kindOf(node)), " ", h("span", { class: "mono", id: "state-id" }, node.id)),
      h("p", { id: "state-summary" }, node.summary),
      h("p", { class: "muted" }, "Written in request " + node.request +
        (node.kind === "observation" ? " (a raw tool observation)" : "")),
      h("h3", {}, "Value"), h("pre", { id: "state-value" }, json(node.value)),
      chain.length > 1 ? [h("h3", {}, "Versions (supersedes)"), h("ol", { id: "supersedes-chain" },
        chain.map((c) => h("li", {}, c === id ? h("strong", {}, c) : link(c))))] : null,
      h("h3", {}, "Relations from it"),
      node.relations.length ? h("ul", { id: "relations-out" }, node.relations.map((r) => h("li", {}, r.rel, " → ", link(r.target))))
        : h("p", { class: "muted" }, "none"),
      h("h3", {}, "Relations to it"),
      incoming.length ? h("ul", { id: "relations-in" }, incoming.map((r) => h("li", {}, link(r.source), " ", r.rel, " →")))
        : h("p", { class: "muted" }, "none"));
  }

  function usageLine(usage, grammarMs) {
    const u = usage || {};
    const ms = (x) => (x ? Math.round(x * 1000) + " ms" : "0 ms");
    return h("p", { class: "muted usage" }, `prompt ${u.prompt_tokens || 0} tokens (${u.cached_tokens || 0} cached), ` +
      `completion ${u.completion_tokens || 0} (${u.forced_tokens || 0} forced), TTFT ${ms(u.ttft_s)}, ` +
      `decode ${ms(u.decode_s)}` + (grammarMs ? `, grammar ${Math.round(grammarMs)} ms` : ""));
  }

  function stepView(step, nodes, select, title) {
    const from = (id) => (nodes.has(id) ? " (from request " + nodes.get(id).request + ")" : "");
    const ops = [
      ...step.committed.map((op) => h("li", { class: "op accepted" }, badge("accepted", "accepted"), " ", op.operation, " ",
        h("a", { href: "#", onclick: (e) => { e.preventDefault(); select(op.state_id); } }, op.state_id),
        op.summary ? ": " + op.summary : "")),
      ...step.rejected.map((op) => h("li", { class: "op rejected" }, badge("rejected", "rejected"), " ", op.operation, " ",
        h("span", { class: "mono" }, op.state_id), " — ", h("span", { class: "reason" }, op.reason))),
      ...(step.malformed || []).map((m) => h("li", { class: "op rejected" }, badge("malformed", "rejected"), " ",
        h("span", { class: "mono" }, json(m)))),
    ];
    const focus = [
      ...step.disclosed.map((id) => h("li", {}, badge("disclosed", "accepted"), " ",
        h("a", { href: "#", onclick: (e) => { e.preventDefault(); select(id); } }, id), from(id))),
      ...step.refused.map((r) => h("li", {}, badge("refused", "refused"), " ", h("span", { class: "mono" }, r.target_id),
        " — ", h("span", { class: "reason" }, r.reason))),
    ];
    const calls = step.tool_calls.map((c) => h("li", {}, h("span", { class: "mono" }, c.name), " ",
      c.error ? badge("error", "error") : null, c.repeat_of ? badge("refused as a repeat of " + c.repeat_of, "refused") : null,
      h("pre", {}, "arguments: " + json(c.arguments) + "\n" + (c.error ? "error: " + c.error : "result: " + json(c.result)))));
    return h("div", { class: "step", "data-step": step.index },
      h("h3", {}, title + " — " + step.decision, step.protocol_error ? [" ", badge("protocol error", "error")] : null),
      usageLine(step.usage, step.grammar_ms),
      step.protocol_error ? h("p", { class: "error" }, step.protocol_error.block + ": " + step.protocol_error.message) : null,
      h("details", {}, h("summary", {}, "the output as the model wrote it"), h("pre", { class: "raw" }, step.raw)),
      focus.length ? [h("h3", {}, "state_focus"), h("ul", { class: "ops" }, focus)] : null,
      ops.length ? [h("h3", {}, "state_delta"), h("ul", { class: "ops" }, ops)] : null,
      calls.length ? [h("h3", {}, "tool_calls"), h("ul", { class: "ops" }, calls)] : null,
      step.final_response !== null && step.final_response !== undefined
        ? [h("h3", {}, "assistant_message"), h("pre", { class: "answer" }, step.final_response)] : null);
  }

  function steps(record, nodes, select) {
    return [
      ...(record.steps || []).map((st) => stepView(st, nodes, select, "step " + st.index)),
      ...(record.memory_calls || []).map((st, i) => stepView(st, nodes, select, "the memory method's call " + (i + 1))),
    ];
  }

  async function lineage(dump) {
    const up = [];
    let parent = dump.forked_from;
    while (parent && up.length < 16) {
      up.unshift(parent);
      try {
        parent = (await api(sessionPath(parent.session))).forked_from;
      } catch (e) {
        if (e instanceof SignInNeeded) throw e;
        break;
      }
    }
    return up;
  }

  function forkTree(name, dump, up) {
    if (!up.length && !dump.forks.length) return null;
    let inner = h("li", {}, h("strong", {}, name), " (" + dump.requests.length + " requests)",
      dump.forks.length ? h("ul", {}, dump.forks.map((f) => h("li", {}, h("a", { href: sessionHref(f.session) }, f.session),
        " shares requests 1–" + f.requests))) : null);
    for (let i = up.length - 1; i >= 0; i--) {
      const shared = (i + 1 < up.length ? up[i + 1] : dump.forked_from).requests;
      inner = h("li", {}, h("a", { href: sessionHref(up[i].session) }, up[i].session),
        " — the next shares its requests 1–" + shared, h("ul", {}, inner));
    }
    return [h("h2", {}, "Forks"), h("div", { class: "tree", id: "fork-tree" }, h("ul", {}, inner))];
  }

  // What a live update keeps of the page: which <details> are open, which element has focus, how far each
  // scrolling box is scrolled. Each is found again by what it shows (a request, a step, a state), not by identity.
  function placeOf(el) {
    if (!el || el === document.body) return null;
    if (el.id) return "#" + CSS.escape(el.id);
    const request = el.closest("[id^='request-'], #running");
    const step = el.closest(".step");
    const at = (request ? "#" + CSS.escape(request.id) + " " : "") + (step ? ".step[data-step='" + step.dataset.step + "'] " : "");
    if (el.dataset && el.dataset.id) return ".node[data-id='" + CSS.escape(el.dataset.id) + "']";
    if (el.classList.contains("steps-toggle")) return at + ".steps-toggle";
    if (el.tagName === "DETAILS") return at + "details";
    return null;
  }

  // a point of a text selection: the nearest element with an id around it, and the character offset in that
  // element's text (a live update builds the same element again, with the same id)
  function spotOf(node, offset) {
    const el = node && node.nodeType === Node.TEXT_NODE ? node.parentElement.closest("[id]") : null;
    if (!el || !main.contains(el)) return null;
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let before = 0;
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      if (t === node) return { id: el.id, at: before + offset };
      before += t.data.length;
    }
    return null;
  }

  function pointAt(spot) {
    const el = spot && document.getElementById(spot.id);
    if (!el) return null;
    const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
    let left = spot.at;
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      if (left <= t.data.length) return [t, left];
      left -= t.data.length;
    }
    return null;
  }

  function kept(paint) {
    const sel = window.getSelection();
    const chosen = sel && sel.rangeCount && !sel.isCollapsed
      ? [spotOf(sel.anchorNode, sel.anchorOffset), spotOf(sel.focusNode, sel.focusOffset)] : null;
    const open = [...main.querySelectorAll("details[open]")].map(placeOf).filter(Boolean);
    const focused = placeOf(document.activeElement);
    const scrolled = [...main.querySelectorAll(".graph")].map((g) => [g.id, g.scrollLeft, g.scrollTop]);
    const x = window.scrollX, y = window.scrollY;
    paint();
    for (const where of open) main.querySelector(where)?.setAttribute("open", "");
    for (const [id, left, top] of scrolled) {
      const g = id && document.getElementById(id);
      if (g) { g.scrollLeft = left; g.scrollTop = top; g.dispatchEvent(new Event("scroll")); }  // drawn there now
    }
    if (focused) main.querySelector(focused)?.focus({ preventScroll: true });
    const [from, to] = chosen ? chosen.map(pointAt) : [null, null];
    if (from && to) sel.setBaseAndExtent(from[0], from[1], to[0], to[1]);  // the text the reader had selected
    window.scrollTo(x, y);
  }

  async function sessionPage(name, params) {
    const records = new Map(), open = new Set();
    const withLayout = (last) => changed(sessionPath(name) + "?layout=true", last);
    let last = await withLayout(null);
    let dump = last.body;
    let selected = params.get("state") || null;
    let up = await lineage(dump);
    const view = graphView();
    // the page's parts that live updates change, each replaced in place (the rest of the page stays as it is)
    const counts = h("p", { class: "muted", id: "session-counts" });
    const graphBox = h("div", { id: "graph-box" }), forks = h("div", { id: "fork-box" });
    const timelineBox = h("div", { id: "timeline" }), panelBox = h("div", { id: "panel-box" });
    const select = (id) => {
      selected = id;
      history.replaceState(null, "", sessionHref(name, id));
      kept(paint);
      document.getElementById("graph-scroll").reveal(id);
      document.getElementById("state").scrollIntoView({ block: "nearest" });
    };
    // what redaction replaced in the request, counted per kind (never a value: the server stored placeholders)
    const redacted = (record) => {
      const kinds = Object.entries(record.redactions || {});
      return kinds.length ? h("p", { class: "muted redactions" }, "Redacted before storing: " +
        kinds.map(([kind, n]) => n + " " + kind).join(", ")) : null;
    };
    // what users said of the request (POST …/feedback): every piece, the latest last
    const feedback = (given) => given.length ? h("ul", { class: "feedback" }, given.map((f) =>
      h("li", {}, h("strong", {}, "Feedback: "), [f.score !== null ? "score " + f.score : null,
        f.label ? "“" + f.label + "”" : null].filter(Boolean).join(" · "),
        f.comment ? [" — ", h("span", { class: "comment" }, f.comment)] : null,
        h("span", { class: "muted" }, " " + when(Math.round(f.at)))))) : null;
    function paint() {
      const nodes = new Map(dump.nodes.map((n) => [n.id, n]));
      const timeline = dump.requests.map((req) => {
        const shown = open.has(req.index);
        const toggle = h("button", { type: "button", class: "steps-toggle", "aria-expanded": shown ? "true" : "false",
          onclick: async () => {
            if (shown) open.delete(req.index); else {
              open.add(req.index);
              if (!records.has(req.index)) {
                records.set(req.index, (await api(sessionPath(name) + "/requests/" + req.index)).record);
              }
            }
            kept(paint);
          } }, shown ? "Hide steps" : "Show steps");
        return h("div", { class: "request" + (req.unfinished ? " unfinished" : ""), id: "request-" + req.index },
          h("h3", {}, "Request " + req.index, " ", h("span", { class: "muted" }, when(req.created_at) +
            (req.strategy ? " · " + req.strategy : ""))),
          h("p", {}, h("strong", {}, "Query: "), h("span", { class: "query" }, req.query)),
          req.response !== null ? h("p", {}, h("strong", {}, "Answer: "), h("span", { class: "response" }, req.response))
            : h("p", { class: "error" }, "Unfinished: " + (req.unfinished || "")),
          feedback(req.feedback || []),
          toggle, shown && records.has(req.index) ? redacted(records.get(req.index)) : null,
          shown && records.has(req.index) ? steps(records.get(req.index), nodes, select) : null);
      });
      const running = dump.running ? h("div", { class: "request running", id: "running" },
        h("h3", {}, "Request " + dump.running.index + " ", badge(dump.running.waiting ? "waiting on tool results" : "running",
          "running")),
        h("p", {}, h("strong", {}, "Query: "), dump.running.query),
        steps({ steps: dump.running.steps }, nodes, select)) : null;
      const states = dump.nodes.filter((n) => n.kind === "state").length;
      counts.replaceChildren(dump.requests.length + " requests, " + states + " states, " +
        (dump.nodes.length - states) + " observations", ...[dump.forked_from ? [" · forked from ",
        h("a", { href: sessionHref(dump.forked_from.session) }, dump.forked_from.session),
        " after request " + dump.forked_from.requests] : []].flat());
      graphBox.replaceChildren(graph(dump, selected, select, view));
      forks.replaceChildren(...(forkTree(name, dump, up) || []));
      timelineBox.replaceChildren(...timeline, ...(running ? [running] : []));
      panelBox.replaceChildren(statePanel(dump, selected, select));
    }
    show(
      h("h1", {}, "Session ", h("span", { id: "session-name" }, name)), counts,
      h("p", { class: "legend" }, TYPES.concat(["observation"]).map((t) => h("span", { class: "t-" + t }, t)),
        RELATIONS.map((r) => h("span", { class: "badge" }, r))),
      h("div", { class: "layout" }, h("div", {}, graphBox, forks, h("h2", {}, "Requests"), timelineBox), panelBox));
    paint();
    // what a poll compares: the requests, states and running turn, and the feedback given
    const shape = (d) => JSON.stringify([d.requests.length, d.nodes.length, d.running,
      d.requests.map((r) => (r.feedback || []).length)]);
    let seen = shape(dump);
    const tick = async () => {  // one poll at a time: the next is set once this one is done
      let fresh;
      try { fresh = await withLayout(last); } catch (e) {
        stopPolling();
        if (e instanceof SignInNeeded) signIn(e.message);
        return;
      }
      if (poll === null) return;  // the page was left while this poll ran
      if (fresh) last = fresh;  // null: a 304, the session as it was
      const next = last.body;
      const now = shape(next);
      if (now !== seen) {
        seen = now;
        dump = next;
        up = await lineage(dump);
        kept(paint);  // a running turn shows up, and settles when it ends: in place
      }
      if (poll !== null) poll = setTimeout(tick, POLL_MS);
    };
    poll = setTimeout(tick, POLL_MS);
  }

  // -- search ---------------------------------------------------------------------------------------------------------

  async function searchPage(params) {
    const q = h("input", { type: "search", id: "search-q", name: "q", placeholder: "words to search for",
      value: params.get("q") || "", required: true });
    const type = h("select", { id: "search-type" }, h("option", { value: "" }, "any type"),
      TYPES.map((t) => h("option", { value: t, selected: params.get("type") === t }, t)));
    const obs = h("input", { type: "checkbox", id: "search-observations",
      checked: (params.get("in") || "").includes("observations") });
    const session = h("input", { type: "text", id: "search-session", placeholder: "in session (optional)",
      value: params.get("session") || "" });
    const form = h("form", { class: "toolbar", onsubmit: (e) => {
      e.preventDefault();
      const next = new URLSearchParams({ q: q.value });
      if (type.value) next.set("type", type.value);
      if (obs.checked) next.set("in", "states,observations");
      if (session.value) next.set("session", session.value);
      location.hash = at("/search?") + next;
    } }, q, type, h("label", {}, obs, " observations too"), session, h("button", { type: "submit" }, "Search"));
    const results = h("div", { id: "hits" });
    const status = h("p", { class: "error", role: "alert", id: "search-error" });
    show(h("h1", {}, "Search memory"), form, status, results);
    if (!params.get("q")) return;
    const query = new URLSearchParams();
    for (const k of ["q", "type", "in", "session"]) if (params.get(k)) query.set(k, params.get(k));
    const load = async (after) => {
      const page = new URLSearchParams(query);
      if (after) page.set("after", after);
      let found;
      try { found = await api("/v1/memory/search?" + page); } catch (e) {
        if (e instanceof SignInNeeded) throw e;
        status.textContent = e.message;
        return;
      }
      results.querySelector(".more")?.remove();
      if (!found.data.length && !after) results.append(h("p", { class: "muted" }, "No state matches."));
      for (const hit of found.data) {
        results.append(h("div", { class: "hit" },
          h("a", { href: sessionHref(hit.session, hit.state_id), class: "hit-link" }, hit.state_id), " ",
          typeBadge(hit.kind === "observation" ? "observation" : hit.type), " ",
          h("span", { class: "summary" }, hit.summary),
          h("div", { class: "muted" }, "session " + hit.session + " · request " + hit.request + " · " + when(hit.created) +
            " · score " + hit.score.toFixed(3))));
      }
      if (found.has_more) {
        results.append(h("button", { type: "button", class: "more", onclick: () => load(found.next) }, "More"));
      }
    };
    await load(null);
  }

  // -- routing ----------------------------------------------------------------------------------------------------

  function stopPolling() {
    if (poll !== null) clearTimeout(poll);
    poll = null;
  }

  async function route() {
    stopPolling();
    const [path, qs] = (location.hash.slice(1) || "/").split("?");
    const params = new URLSearchParams(qs || "");
    let parts = path.split("/").filter(Boolean).map(decodeURIComponent);
    viewing = null;
    if (parts[0] === "t" && parts[1] && isAdmin()) {
      viewing = parts[1];
      parts = parts.slice(2);
      if (!tenantNames.has(viewing)) await readTenantNames();
    }
    navFor();
    try {
      if (parts[0] === "session" && parts[1]) await sessionPage(parts[1], params);
      else if (parts[0] === "search") await searchPage(params);
      else if (pages[parts[0]]) await pages[parts[0]](parts.slice(1), params);
      else if (isAdmin() && !viewing) await pages.admin([], params);
      else await sessionsPage(params);
      document.getElementById("sign-out").hidden = !sessionStorage.getItem(KEY);
    } catch (e) {
      if (e instanceof SignInNeeded) signIn(sessionStorage.getItem(KEY) ? e.message : "");
      else show(h("h1", {}, "Something went wrong"), h("p", { class: "error", role: "alert" }, e.message),
        h("p", {}, h("a", { href: isAdmin() && !viewing ? "#/admin" : at("/") }, "Back")));
    }
  }

  async function readTenantNames() {
    try {
      for (const t of (await api("/v1/admin/tenants")).data) tenantNames.set(t.id, t.name);
    } catch (e) { /* the banner names the tenant by its id */ }
  }

  // the header's links: an admin key's pages, and a tenant's memory pages where there is one to read
  function navFor() {
    const admin = isAdmin();
    document.getElementById("nav-tenants").hidden = !admin;
    document.getElementById("nav-audit").hidden = !admin;
    const memory = !admin || viewing;
    for (const [id, path] of [["nav-sessions", "/"], ["nav-search", "/search"]]) {
      const link = document.getElementById(id);
      link.hidden = !memory;
      link.setAttribute("href", at(path));
    }
  }

  // what admin.js builds its pages with
  window.FlowStateConsole = { h, s, api, show, when, badge, json, clip, at, number, of, pages, tenantNames, SignInNeeded,
    tenantHeader: TENANT_HEADER };
  window.addEventListener("hashchange", route);
  document.addEventListener("DOMContentLoaded", route);  // once admin.js (loaded after this file) has added its pages
})();
