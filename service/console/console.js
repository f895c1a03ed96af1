// versiq console: a single page over the /v1 API of the server that serves it (no other host, no
// build step, no dependencies). Routes live in the URL hash:
//   #/                                   stores and streams
//   #/stores/{store}                     one store: settings, stream time, keys, commits
//   #/stores/{store}/keys/{key}?snapshot=S&at=T   a key's timeline (T: the as-of cursor, epoch ms)
//   #/stores/{store}/rejected?reason=R   the store's rejected records
//   #/streams/{stream}                   one stream
// Every time is shown as RFC 3339 (UTC or local, switchable) with its epoch ms on hover; every
// value shown comes from the API, never recomputed here (the cursor asks GET .../keys/{key}?asOf).

const REASONS = ["late", "malformed", "missing_field", "bad_key", "bad_timestamp", "bad_value",
  "bad_partition", "duplicate_offset", "partition_conflict", "too_large", "expression_error", "bad_offset"];
const main = () => document.getElementById("main");
const settings = { zone: localStorage.getItem("versiq.zone") || "utc" };

// ---------------------------------------------------------------- DOM and formatting helpers

/** An element with attributes (``on*`` functions become listeners) and children (strings are text). */
function h(tag, attrs = {}, ...children) {
  const svg = ["svg", "g", "rect", "line", "text", "title", "defs", "pattern", "path"].includes(tag);
  const el = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name.startsWith("on") && typeof value === "function") el.addEventListener(name.slice(2), value);
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const pad = (n, width = 2) => String(Math.abs(n)).padStart(width, "0");

/** Epoch ms as RFC 3339 with milliseconds, in UTC (``Z``) or in the browser's zone (``+hh:mm``). */
function rfc3339(ms) {
  const d = new Date(ms);
  if (settings.zone === "utc") return d.toISOString();
  const offset = -d.getTimezoneOffset();
  const zone = offset === 0 ? "Z" : `${offset > 0 ? "+" : "-"}${pad(Math.trunc(offset / 60))}:${pad(offset % 60)}`;
  return `${pad(d.getFullYear(), 4)}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:` +
    `${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}${zone}`;
}

/** A <time> showing ``ms`` as RFC 3339, its epoch ms on hover; a dash for null. */
function when(ms) {
  if (ms === null || ms === undefined) return h("span", { class: "muted" }, "—");
  return h("time", { datetime: new Date(ms).toISOString(), title: `${ms} (epoch ms)`, "data-ms": ms }, rfc3339(ms));
}

/** A duration in the largest unit that divides it exactly: 7d, 36h, 90m, 15s, 1500ms. */
function duration(ms) {
  for (const [unit, size] of [["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]]) {
    if (ms !== 0 && ms % size === 0) return `${ms / size}${unit}`;
  }
  return `${ms}ms`;
}

/** Epoch ms from what a person types: an integer (epoch ms) or an RFC 3339 date-time. */
function parseTime(text) {
  const t = text.trim();
  if (/^-?\d+$/.test(t)) return Number(t);
  const ms = Date.parse(t);
  if (Number.isNaN(ms)) throw new Error(`not a time: ${JSON.stringify(t)} (RFC 3339 or epoch ms)`);
  return ms;
}

const json = (value) => JSON.stringify(value);

/** JSON.parse of an API answer that also keeps the exact text of every member named "value"
 * (a record's value, which the API sends as stored) as ``valueText`` beside it: a value is shown
 * from that text, never parsed into doubles and written again (12345678901234567890 and 1.50
 * stay as they are). Invalid JSON throws as JSON.parse does. */
function parseAnswer(text) {
  const parsed = JSON.parse(text);
  let i = 0;
  const space = () => { while (" \t\n\r".includes(text[i]) && i < text.length) i++; };
  const skipString = () => { i++; while (text[i] !== '"') i += text[i] === "\\" ? 2 : 1; i++; };
  function walk(target) {  // ``target``: the value parsed from the text at ``i`` (same shape)
    space();
    if (text[i] === "{") {
      i++;
      space();
      while (text[i] !== "}") {
        const start = i;
        skipString();
        const name = JSON.parse(text.slice(start, i));
        space();
        i++;  // ":"
        space();
        const from = i;
        walk(target[name]);
        if (name === "value" && target !== null && typeof target === "object") target.valueText = text.slice(from, i);
        space();
        if (text[i] === ",") i++;
        space();
      }
      i++;
    } else if (text[i] === "[") {
      i++;
      space();
      for (let n = 0; text[i] !== "]"; n++) {
        walk(target[n]);
        space();
        if (text[i] === ",") i++;
        space();
      }
      i++;
    } else if (text[i] === '"') {
      skipString();
    } else {
      while (i < text.length && !",]} \t\n\r".includes(text[i])) i++;
    }
  }
  walk(parsed);
  return parsed;
}

/** A value's JSON text as stored, with a line-break opportunity (<wbr>) after each "," and ":"
 * outside strings, so a long value wraps between tokens rather than inside one. */
function breakable(text) {
  const parts = [];
  let start = 0;
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '"') {
      for (i++; i < text.length && text[i] !== '"'; i++) if (text[i] === "\\") i++;
    } else if (text[i] === "," || text[i] === ":") {
      parts.push(text.slice(start, i + 1), h("wbr"));
      start = i + 1;
    }
  }
  parts.push(text.slice(start));
  return parts;
}

/** A value's JSON text laid out for reading, two spaces per level, every token as it is in
 * ``text`` (numbers are not reparsed); a space after each ":" and "," so long lines wrap
 * between tokens. */
function prettyJson(text) {
  let out = "";
  let depth = 0;
  const newline = () => "\n" + "  ".repeat(depth);
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (c === '"') {
      const start = i;
      for (i++; text[i] !== '"'; i++) if (text[i] === "\\") i++;
      out += text.slice(start, i + 1);
    } else if (c === "{" || c === "[") {
      const close = c === "{" ? "}" : "]";
      let j = i + 1;
      while (" \t\n\r".includes(text[j])) j++;
      if (text[j] === close) { out += c + close; i = j; continue; }
      depth++;
      out += c + newline();
    } else if (c === "}" || c === "]") {
      depth--;
      out += newline() + c;
    } else if (c === ",") {
      out += "," + newline();
    } else if (c === ":") {
      out += ": ";
    } else if (!" \t\n\r".includes(c)) {
      out += c;
    }
  }
  return out;
}
const plural = (n, one, many = `${one}s`) => `${n.toLocaleString("en")} ${n === 1 ? one : many}`;

// ---------------------------------------------------------------- the API

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

/** A path segment, percent-encoded; "." and ".." too, which a browser would otherwise resolve away. */
const segment = (text) => (/^\.{1,2}$/.test(text) ? text.replaceAll(".", "%2E") : encodeURIComponent(text));

/** GET a /v1 path (segments are encoded here) with query parameters, or POST ``body`` as JSON;
 * the JSON answer or ApiError. */
async function api(segments, params = {}, body = undefined) {
  const path = "/v1/" + segments.map(segment).join("/");
  const query = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") query.set(name, String(value));
  }
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem("versiq.token");
  if (token) headers.Authorization = `Bearer ${token}`;
  const init = { headers };
  if (body !== undefined) Object.assign(init, { method: "POST", body: JSON.stringify(body) }, { headers: { ...headers, "Content-Type": "application/json" } });
  const response = await fetch(path + (query.size ? `?${query}` : ""), init);
  const answer = await response.text().then(parseAnswer).catch(() => ({ title: response.statusText }));
  if (response.status === 401) {
    askForToken(answer.detail || "");
    throw new ApiError(401, answer);
  }
  if (!response.ok) throw new ApiError(response.status, answer);
  return answer;
}

/** The single-key read of ``key`` as of ``asOf`` at ``snapshot``, through keys:batchGet: the
 * same answer (the record, or the problem the single-key read gives) as a 200, so an expected
 * "no value" is not logged by the browser as a failed request. */
async function valueAsOf(store, key, asOf, snapshot) {
  const answer = await api(["stores", store, "keys:batchGet"], {}, { keys: [key], asOf, snapshot });
  const result = answer.results[0];
  if (result.problem) throw new ApiError(result.problem.status, result.problem);
  return result.record;
}

/** Every page of a paged listing (records under ``field``), following ``nextPageToken``. */
async function allPages(segments, params, field = "records", limit = 20000) {
  let page = await api(segments, params);
  const first = page;
  const records = [...page[field]];
  while (page.nextPageToken && records.length < limit) {
    page = await api(segments, { ...params, pageToken: page.nextPageToken, snapshot: undefined });
    records.push(...page[field]);
  }
  return { first, records, complete: !page.nextPageToken };
}

function askForToken(detail) {
  const dialog = document.getElementById("auth");
  document.getElementById("auth-detail").textContent = detail;
  if (!dialog.open) dialog.showModal();
}

function problemBox(error) {
  if (error instanceof ApiError) {
    const kind = (error.problem.type || "").split("/").pop();
    return h("p", { class: "error", "data-problem": kind }, `${error.status} ${kind}: ${error.message}`);
  }
  return h("p", { class: "error" }, String(error && error.message ? error.message : error));
}

// ---------------------------------------------------------------- routing

function parseHash() {
  const [path, query = ""] = location.hash.replace(/^#/, "").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { parts, params: Object.fromEntries(new URLSearchParams(query)) };
}

function link(parts, params = {}) {
  const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== ""));
  return "#/" + parts.map(encodeURIComponent).join("/") + (query.size ? `?${query}` : "");
}

let renderCount = 0;

async function render() {
  const ticket = ++renderCount;
  const { parts, params } = parseHash();
  const view = h("div", { id: "view" });
  try {
    if (parts.length === 0) await overview(view);
    else if (parts[0] === "stores" && parts.length === 2) await storePage(view, parts[1]);
    else if (parts[0] === "stores" && parts[2] === "keys" && parts.length === 4) await keyPage(view, parts[1], parts[3], params);
    else if (parts[0] === "stores" && parts[2] === "rejected" && parts.length === 3) await rejectedPage(view, parts[1], params);
    else if (parts[0] === "streams" && parts.length === 2) await streamPage(view, parts[1]);
    else view.append(h("p", { class: "error" }, `no page at ${location.hash}`));
  } catch (error) {
    view.append(problemBox(error));
  }
  if (ticket === renderCount) {
    main().replaceChildren(view);
    document.body.dataset.ready = String(ticket);
  }
}

// ---------------------------------------------------------------- stores and streams

async function rejectedCounts(store) {
  try {
    return (await api(["stores", store, "rejected"], { pageSize: 1 })).counts;
  } catch (error) {
    return null;
  }
}

function countsText(counts) {
  const entries = Object.entries(counts || {});
  if (entries.length === 0) return "none";
  return entries.map(([reason, n]) => `${reason} ${n.toLocaleString("en")}`).join(", ");
}

function provenance(inputs) {
  const entries = Object.entries(inputs || {});
  if (entries.length === 0) return h("span", { class: "muted" }, "—");
  return h("span", {}, entries.map(([name, snapshot], i) => [i ? ", " : "", h("a", { href: link(["stores", name]) }, name),
    h("span", { class: "muted" }, ` @ snapshot ${snapshot}`)]));
}

/** A store's ``field`` per partition, folded away, when it has more than one partition. */
function perPartition(store, field) {
  if (store.partitionStreamTimes.length < 2) return null;
  return h("details", { class: "partitions" }, h("summary", { class: "muted" }, "per partition"),
    h("ul", {}, store.partitionStreamTimes.map((p) => h("li", {}, `${p.partition}: `, when(p[field])))));
}

async function overview(view) {
  const [stores, streams] = await Promise.all([api(["stores"]), api(["streams"])]);
  const rejected = await Promise.all(stores.stores.map((s) => rejectedCounts(s.name)));
  view.append(h("h1", {}, "Stores"));
  if (stores.stores.length === 0) view.append(h("p", { class: "muted" }, "No stores in this warehouse yet."));
  else view.append(h("table", { id: "stores" },
    h("thead", {}, h("tr", {}, ["Store", "Kind", "Retention", "Partitions", "Stream time", "Horizon", "Snapshot",
      "Keys", "Versions", "Rejected", "Inputs"].map((t) => h("th", {}, t)))),
    h("tbody", {}, stores.stores.map((s, i) => h("tr", { "data-store": s.name },
      h("td", {}, h("a", { href: link(["stores", s.name]) }, s.name)),
      h("td", {}, s.kind),
      h("td", {}, s.kind === "versioned" ? duration(s.historyRetentionMs) : "—"),
      h("td", { class: "num" }, s.partitions),
      h("td", {}, when(s.streamTime), perPartition(s, "streamTime")),
      h("td", {}, when(s.oldestQueryableTimestamp), perPartition(s, "oldestQueryableTimestamp")),
      h("td", { class: "num" }, s.snapshot),
      h("td", { class: "num" }, keyCountsText(s.counts)),
      h("td", { class: "num" }, s.counts.versions ?? "—"),
      h("td", {}, rejected[i] === null ? "—" :
        h("a", { href: link(["stores", s.name, "rejected"]), "data-rejected": json(rejected[i]) }, countsText(rejected[i]))),
      h("td", {}, provenance(s.inputs)))))));
  if (stores.unavailable.length) {
    view.append(h("h2", {}, "Unavailable"), h("ul", {}, stores.unavailable.map((u) =>
      h("li", {}, h("b", {}, u.name), ": ", h("span", { class: "error" }, u.error)))));
  }
  view.append(h("h1", {}, "Streams"));
  if (streams.streams.length === 0) view.append(h("p", { class: "muted" }, "No streams."));
  else view.append(h("table", { id: "streams" },
    h("thead", {}, h("tr", {}, ["Stream", "Snapshot", "Last run", "Records", "First timestamp", "Last timestamp", "Inputs"]
      .map((t) => h("th", {}, t)))),
    h("tbody", {}, streams.streams.map((s) => h("tr", { "data-stream": s.name },
      h("td", {}, h("a", { href: link(["streams", s.name]) }, s.name)),
      h("td", { class: "num" }, s.snapshot), h("td", { class: "num" }, s.lastRun ?? "—"),
      h("td", { class: "num" }, s.counts.records ?? "—"),
      h("td", {}, when(s.minTimestamp)), h("td", {}, when(s.maxTimestamp)),
      h("td", {}, provenance(s.inputs)))))));
}

function settingsPanel(info) {
  const rows = [
    ["Kind", info.kind],
    ["History retention", info.kind === "versioned" ? `${duration(info.historyRetentionMs)} (${info.historyRetentionMs} ms)` : "— (latest value only)"],
    ["Snapshot", info.snapshot],
    ["Stream time", when(info.streamTime)],
    ["Horizon (oldest queryable)", when(info.oldestQueryableTimestamp)],
    ["Counts", Object.entries(info.counts).map(([k, v]) => `${k} ${v.toLocaleString("en")}`).join(", ")],
    ["Inputs", provenance(info.inputs)],
  ];
  return h("table", { class: "panel", id: "store-info" }, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v)))));
}

async function storePage(view, store) {
  const [info, log, rejected] = await Promise.all([api(["stores", store]), api(["stores", store, "history"]),
    api(["stores", store, "rejected"], { pageSize: 1 })]);
  view.append(h("h1", {}, "Store ", h("span", { class: "mono" }, store)));
  const left = h("div", { class: "grow" }, settingsPanel(info));
  if (info.partitionStreamTimes.length > 1) {
    left.append(h("h2", {}, "Stream time per partition"), h("table", { id: "partitions" },
      h("thead", {}, h("tr", {}, h("th", { class: "num" }, "Partition"), h("th", {}, "Stream time"), h("th", {}, "Horizon"))),
      h("tbody", {}, info.partitionStreamTimes.map((p) => h("tr", {}, h("td", { class: "num" }, p.partition),
        h("td", {}, when(p.streamTime)), h("td", {}, when(p.oldestQueryableTimestamp)))))));
  }
  left.append(h("h2", {}, "Rejected records"), h("p", {},
    h("a", { href: link(["stores", store, "rejected"]) }, countsText(rejected.counts))));
  left.append(h("h2", {}, "Commits"), h("table", { id: "commits" },
    h("thead", {}, h("tr", {}, ["Snapshot", "Committed", "Operation", "Run", "Rows written", "Files"].map((t) => h("th", {}, t)))),
    h("tbody", {}, log.commits.map((c) => h("tr", {}, h("td", { class: "num" }, c.snapshot), h("td", {}, when(c.committedAt)),
      h("td", {}, c.operation), h("td", { class: "num" }, c.run ?? "—"), h("td", { class: "num" }, c.counts.rowsWritten ?? "—"),
      h("td", { class: "mono" }, c.files.join(", ") || (c.kafka ? "kafka" : "—")))))));
  const right = h("div", { class: "side" }, h("h2", {}, "Keys"), await keySearch(store, info));
  view.append(h("div", { class: "row" }, left, right));
}

/** How many keys a store has with a value and how many are deleted (latest version a tombstone);
 * null where the store does not count its keys (an earlier snapshot). */
function keyCounts(counts) {
  if (counts.keys === undefined) return null;
  const deleted = counts.deletedKeys ?? 0;
  return { live: counts.keys - deleted, deleted };
}

function keyCountsText(counts) {
  const c = keyCounts(counts);
  return c === null ? "—" : `${c.live.toLocaleString("en")}${c.deleted ? ` (+${c.deleted.toLocaleString("en")} deleted)` : ""}`;
}

/** Key search: keys by prefix (the key listing), or one exact key. Deleted keys (whose latest
 * version is a tombstone, e.g. a filter table's rows that no longer pass) are hidden unless the
 * toggle asks for them: they are counted apart, never mixed into the keys that have a value. */
async function keySearch(store, info) {
  const box = h("div", { id: "key-search" });
  const results = h("div", { id: "key-results" });
  const input = h("input", { id: "key-prefix", type: "search", placeholder: "key prefix", autocomplete: "off" });
  const counts = keyCounts(info.counts);
  const toggle = h("input", { id: "show-deleted", type: "checkbox", disabled: counts !== null && counts.deleted === 0 });
  let timer = null;
  let generation = 0;
  const search = async (prefix, token = null) => {
    const asked = token ? generation : ++generation;
    const page = await api(["stores", store, "keys"], { prefix, pageSize: 50, includeDeleted: toggle.checked ? "true" : null, pageToken: token });
    if (asked !== generation) return; // a newer search (another prefix, the toggle) has replaced this one
    const list = token ? results.querySelector("ul") : h("ul", { class: "keys" });
    for (const r of page.records) {
      list.append(h("li", { "data-key": r.key, "data-deleted": r.deleted ? "true" : null },
        h("a", { href: link(["stores", store, "keys", r.key]) }, h("span", { class: "mono" }, r.key)), " ",
        r.deleted ? h("span", { class: "tag deleted" }, "deleted") : h("span", { class: "muted mono" }, r.valueText.slice(0, 60))));
    }
    if (!token) results.replaceChildren(list);
    results.querySelector("button.more")?.remove();
    if (page.records.length === 0 && !token) {
      const what = toggle.checked ? "No key" : "No key with a value";
      results.replaceChildren(h("p", { class: "muted" }, `${what} starts with ${json(prefix)}.`));
    }
    if (page.nextPageToken) {
      results.append(h("button", { class: "more", type: "button", onclick: () => search(prefix, page.nextPageToken).catch(show) }, "More keys"));
    }
  };
  const show = (error) => results.replaceChildren(problemBox(error));
  input.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(() => search(input.value).catch(show), 200);
  });
  const summary = h("p", { class: "muted", id: "key-counts", "data-live": counts?.live, "data-deleted": counts?.deleted });
  const describe = () => {
    const deleted = counts?.deleted ? `, ${plural(counts.deleted, "deleted key")}${toggle.checked ? "" : " (hidden)"}` : "";
    const keys = counts === null ? "" : `${plural(counts.live, "key")} with a value${deleted}; `;
    summary.textContent = `${keys}type a prefix to search, or an exact key and Enter.`;
  };
  describe();
  toggle.addEventListener("change", () => {
    describe();
    search(input.value).catch(show);
  });
  box.append(h("form", { class: "inline", onsubmit: (e) => {
    e.preventDefault();
    location.hash = link(["stores", store, "keys", input.value]);
  } }, input, h("button", { type: "submit", title: "Open this exact key" }, "Open key")),
  summary, h("label", {}, toggle, " show deleted keys"), results);
  await search("").catch(show);
  return box;
}

// ---------------------------------------------------------------- a key's timeline

const W = 1000, BAR_Y = 34, BAR_H = 34, H = 110;

/** Whether a key's history reaches back to the retention horizon: its oldest version began
 * before it, so older versions, if any, are no longer kept (a key whose history all lies after
 * the horizon has lost nothing; records are oldest first). */
function reachesHorizon(records, horizon) {
  return horizon !== null && horizon !== undefined && records.length > 0 && records[0].timestamp < horizon;
}

/** The time domain drawn: every version, the horizon and stream time, with a margin. */
function domain(records, horizon, streamTime) {
  const times = records.flatMap((r) => [r.timestamp, r.validTo]).concat([horizon, streamTime]).filter((t) => t !== null && t !== undefined);
  let lo = Math.min(...times), hi = Math.max(...times);
  if (!Number.isFinite(lo)) { lo = Date.now() - 3600000; hi = Date.now(); }
  if (hi === lo) { lo -= 1000; hi += 1000; }
  const margin = (hi - lo) * 0.06;
  return [Math.floor(lo - margin), Math.ceil(hi + margin)];
}

function ticks(lo, hi, n = 5) {
  const step = (hi - lo) / n;
  return Array.from({ length: n + 1 }, (_, i) => Math.round(lo + i * step));
}

function timeline(store, key, snapshot, records, lo, hi, horizon, streamTime, onPick) {
  const x = (t) => ((t - lo) / (hi - lo)) * W;
  const svg = h("svg", { class: "timeline", id: "timeline", viewBox: `0 0 ${W} ${H}`, role: "img", "data-snapshot": snapshot,
    "aria-label": `versions of ${key}`, "data-lo": lo, "data-hi": hi },
  h("defs", {}, h("pattern", { id: "hatch", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
    h("rect", { width: 6, height: 6, fill: "#fff4ed" }), h("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#c2410c", "stroke-width": 2 }))));
  const axis = h("g", { class: "axis" });
  for (const t of ticks(lo, hi)) {
    axis.append(h("line", { x1: x(t), x2: x(t), y1: 18, y2: H - 16 }),
      h("text", { x: Math.min(Math.max(x(t), 4), W - 4), y: H - 3, "text-anchor": t === lo ? "start" : t === hi ? "end" : "middle" },
        rfc3339(t).replace("T", " ").slice(0, 19)));
  }
  svg.append(axis);
  const bars = h("g", { class: "bars" });
  for (const r of records) {
    const end = r.validTo ?? hi;
    bars.append(h("rect", {
      class: r.deleted ? "bar deleted" : "bar", x: x(r.timestamp), y: BAR_Y, height: BAR_H, width: Math.max(1, x(end) - x(r.timestamp)),
      "data-key": key, "data-valid-from": r.timestamp, "data-valid-to": r.validTo ?? "", "data-deleted": r.deleted ? "true" : null,
    }, h("title", {}, `${r.deleted ? "deleted" : r.valueText}\n${rfc3339(r.timestamp)} → ${r.validTo === null ? "still valid" : rfc3339(r.validTo)}`)));
  }
  svg.append(bars);
  if (horizon !== null && horizon !== undefined && horizon > lo) {
    svg.append(h("rect", { class: "expired", x: 0, y: 14, width: x(horizon), height: BAR_Y + BAR_H - 6 },
      h("title", {}, "before the retention horizon: reads here answer expired")));
  }
  const mark = (cls, t, label, attr) => {
    if (t === null || t === undefined) return;
    svg.append(h("line", { class: cls, x1: x(t), x2: x(t), y1: 14, y2: BAR_Y + BAR_H + 8, [attr]: t }),
      h("text", { class: "label", x: x(t) + 3, y: 12, fill: cls === "horizon" ? "#7a5af8" : "#0e9384" }, label));
  };
  mark("horizon", horizon, "horizon", "data-horizon");
  mark("stream-time", streamTime, "stream time", "data-stream-time");
  const cursor = h("line", { class: "cursor", id: "cursor-line", x1: 0, x2: 0, y1: 14, y2: BAR_Y + BAR_H + 8 });
  svg.append(cursor);
  svg.addEventListener("click", (event) => {
    const box = svg.getBoundingClientRect();
    onPick(Math.round(lo + ((event.clientX - box.left) / box.width) * (hi - lo)));
  });
  svg.moveCursor = (t) => {
    cursor.setAttribute("x1", x(t));
    cursor.setAttribute("x2", x(t));
    cursor.setAttribute("data-cursor", t);
  };
  return svg;
}

async function keyPage(view, store, key, params) {
  const snapshot = params.snapshot === undefined ? undefined : Number(params.snapshot);
  const [info, log] = await Promise.all([api(["stores", store], { snapshot }), api(["stores", store, "history"])]);
  view.append(h("h1", {}, h("a", { href: link(["stores", store]) }, store), " / ", h("span", { class: "mono", id: "key-name" }, key)));
  const picker = h("select", { id: "snapshot", onchange: () => {
    location.hash = link(["stores", store, "keys", key], { snapshot: picker.value === "current" ? undefined : picker.value, at: params.at });
  } }, h("option", { value: "current" }, `current (snapshot ${log.commits[0]?.snapshot ?? info.snapshot})`),
  log.commits.map((c) => h("option", { value: c.snapshot, selected: snapshot === c.snapshot },
    `snapshot ${c.snapshot} · ${c.operation} · ${rfc3339(c.committedAt)}`)));
  view.append(h("form", { class: "inline" }, h("label", {}, "History as of ", picker)));
  if (/^\.{1,2}$/.test(key)) {
    // WHATWG URLs resolve "." and ".." path segments, percent-encoded ones too, so no browser can
    // send this key in the path of GET .../keys/{key}/versions.
    view.append(h("p", { class: "error", id: "dot-key" }, `A browser cannot ask for the key ${json(key)}: browsers resolve ` +
      `"." and ".." path segments even when percent-encoded. Read it with a client that sends the path as given, e.g. ` +
      `curl --path-as-is '${location.origin}/v1/stores/${encodeURIComponent(store)}/keys/${key.replaceAll(".", "%2E")}/versions'.`));
    return;
  }
  if (info.kind !== "versioned") {
    view.append(h("p", { class: "muted" }, "A timestamped store keeps the latest value of each key only."));
    try {
      const latest = await valueAsOf(store, key, undefined, snapshot);
      view.append(h("div", { class: "panel", id: "cursor-value" }, h("pre", {}, prettyJson(latest.valueText)), "since ", when(latest.timestamp)));
    } catch (error) {
      view.append(problemBox(error));
    }
    return;
  }
  const { first, records, complete } = await allPages(["stores", store, "keys", key, "versions"],
    { includeDeleted: "true", pageSize: 1000, snapshot });
  const pinned = first.snapshot;
  const horizon = first.horizon;
  const streamTime = info.partitions === 1 || horizon === null || horizon === 0 ? info.streamTime : horizon + info.historyRetentionMs;
  const [lo, hi] = domain(records, horizon, streamTime);
  let cursorAt = params.at !== undefined ? Number(params.at) : records.length ? records[records.length - 1].timestamp : streamTime ?? hi;

  const summary = h("p", { id: "key-summary" }, `${plural(records.filter((r) => !r.deleted).length, "version")}`,
    records.some((r) => r.deleted) ? `, ${plural(records.filter((r) => r.deleted).length, "tombstone")}` : "",
    ` at snapshot ${pinned}`, reachesHorizon(records, horizon) ?
      " · its oldest version shown began before the retention horizon: versions that ended before the horizon are no longer kept" : "",
    complete ? "" : " · only the first 20,000 versions are drawn");
  view.append(summary);
  if (records.length === 0) view.append(h("p", { class: "muted" }, "This key has no version inside the retention window at this snapshot."));

  const valueBox = h("div", { class: "panel", id: "cursor-value", "aria-live": "polite" });
  const slider = h("input", { type: "range", id: "cursor-range", min: lo, max: hi, step: 1, value: cursorAt });
  const typed = h("input", { id: "cursor-time", size: 30, value: rfc3339(cursorAt), title: "RFC 3339 or epoch ms" });
  const rows = new Map();
  const svg = timeline(store, key, pinned, records, lo, hi, horizon, streamTime, (t) => moveTo(t));
  let asked = 0;

  async function moveTo(t, fromSlider = false) {
    cursorAt = t;
    svg.moveCursor(t);
    if (!fromSlider) slider.value = String(t);
    typed.value = rfc3339(t);
    history.replaceState(null, "", link(["stores", store, "keys", key], { snapshot, at: t }));
    for (const [r, tr] of rows) tr.classList.toggle("at-cursor", r.timestamp <= t && (r.validTo === null || t < r.validTo));
    const ticket = ++asked;
    valueBox.dataset.state = "loading";
    let content;
    try {
      const answer = await valueAsOf(store, key, t, pinned);
      content = [h("div", {}, "Value as of ", when(t), ":"), h("pre", { id: "cursor-json", "data-value": answer.valueText }, prettyJson(answer.valueText)),
        h("div", { class: "muted" }, "valid from ", when(answer.timestamp), " to ", answer.validTo === null ? "now (still valid)" : when(answer.validTo))];
    } catch (error) {
      content = [h("div", {}, "As of ", when(t), ":"), problemBox(error)];
    }
    if (ticket !== asked) return;
    valueBox.replaceChildren(...content);
    valueBox.dataset.state = "done";
    valueBox.dataset.at = String(t);
  }

  slider.addEventListener("input", () => moveTo(Number(slider.value), true));
  const legend = h("div", { class: "legend" }, h("span", { class: "l-bar" }, "version (validFrom → validTo)"),
    h("span", { class: "l-deleted" }, "tombstone"), h("span", { class: "l-horizon" }, "retention horizon"),
    h("span", { class: "l-stream" }, "stream time"), h("span", { class: "l-cursor" }, "as-of cursor"));
  const cursorForm = h("form", { class: "inline", onsubmit: (e) => {
    e.preventDefault();
    try {
      moveTo(parseTime(typed.value));
    } catch (error) {
      valueBox.replaceChildren(problemBox(error));
    }
  } }, h("label", {}, "Cursor ", typed), h("button", { type: "submit", id: "cursor-go" }, "Show value"));
  const table = h("table", { id: "versions" }, h("thead", {}, h("tr", {}, ["Valid from", "Valid to", "Value"].map((t) => h("th", {}, t)))),
    h("tbody", {}, records.slice().reverse().map((r) => {
      const tr = h("tr", { "data-valid-from": r.timestamp, "data-deleted": r.deleted ? "true" : null },
        h("td", {}, when(r.timestamp)), h("td", {}, r.validTo === null ? h("span", { class: "muted" }, "still valid") : when(r.validTo)),
        h("td", {}, r.deleted ? h("span", { class: "tag deleted" }, "deleted") : h("pre", {}, breakable(r.valueText))));
      rows.set(r, tr);
      return tr;
    })));
  view.append(h("div", { class: "row" },
    h("div", { class: "grow" }, svg, slider, legend, cursorForm, valueBox,
      h("p", { class: "muted" }, "Horizon ", when(horizon), " · stream time ", when(streamTime),
        " · click the timeline or drag the slider to move the cursor")),
    h("div", { class: "side" }, h("h2", {}, "Versions"), h("div", { class: "scroll" }, table))));
  moveTo(cursorAt);
}

// ---------------------------------------------------------------- rejected records and streams

/** A rejected record's raw text; a listing cuts a long one, and a button fetches it whole. */
function rawText(store, snapshot, record) {
  const pre = h("pre", { class: "raw", "data-id": record.id }, record.raw ?? "");
  if (!record.rawTruncated) return pre;
  const more = h("button", { type: "button", class: "raw-all", onclick: async () => {
    try {
      const answer = await api(["stores", store, "rejected", String(record.id)], { snapshot });
      pre.textContent = answer.record.raw;
      pre.dataset.whole = "true";
      more.remove();
    } catch (error) {
      more.replaceWith(problemBox(error));
    }
  } }, `… show all ${plural(record.rawLength, "character")}`);
  return [pre, more];
}

async function rejectedPage(view, store, params) {
  const reason = params.reason || undefined;
  const page = await api(["stores", store, "rejected"], { reason, pageSize: 100 });
  view.append(h("h1", {}, h("a", { href: link(["stores", store]) }, store), " / rejected records"));
  const select = h("select", { id: "reason", onchange: () => { location.hash = link(["stores", store, "rejected"], { reason: select.value }); } },
    h("option", { value: "" }, `every reason (${Object.values(page.counts).reduce((a, b) => a + b, 0)})`),
    REASONS.map((r) => h("option", { value: r, selected: r === reason }, `${r} (${page.counts[r] ?? 0})`)));
  view.append(h("form", { class: "inline" }, h("label", {}, "Reason ", select)),
    h("p", { class: "muted", id: "rejected-summary" }, `${plural(page.total, "record")} at snapshot ${page.snapshot}`));
  const body = h("tbody", {});
  const add = (records) => body.append(...records.map((r) => h("tr", { "data-reason": r.reason },
    h("td", { class: "num" }, r.run), h("td", {}, h("span", { class: "tag" }, r.reason)),
    h("td", { class: "mono" }, r.source, r.line !== undefined ? `:${r.line}` : r.row !== undefined ? ` row ${r.row}` : "",
      r.partition !== undefined ? ` partition ${r.partition}` : "", r.offset !== undefined ? ` offset ${r.offset}` : ""),
    h("td", {}, r.detail), h("td", {}, rawText(store, page.snapshot, r)), h("td", { class: "mono" }, r.ingestedAt ?? "—"))));
  add(page.records);
  view.append(h("table", { id: "rejected" }, h("thead", {}, h("tr", {}, ["Run", "Reason", "Where", "Detail", "Raw text", "Ingested"].map((t) => h("th", {}, t)))), body));
  let token = page.nextPageToken;
  if (token) {
    const more = h("button", { type: "button", class: "more", onclick: async () => {
      const next = await api(["stores", store, "rejected"], { reason, pageSize: 100, pageToken: token });
      add(next.records);
      token = next.nextPageToken;
      if (!token) more.remove();
    } }, "More");
    view.append(more);
  }
}

async function streamPage(view, stream) {
  const info = await api(["streams", stream]);
  view.append(h("h1", {}, "Stream ", h("span", { class: "mono" }, stream)), h("table", { class: "panel" }, h("tbody", {},
    [["Snapshot", info.snapshot], ["Last run", info.lastRun ?? "—"], ["Records", info.counts.records ?? "—"],
      ["First timestamp", when(info.minTimestamp)], ["Last timestamp", when(info.maxTimestamp)], ["Inputs", provenance(info.inputs)]]
      .map(([k, v]) => h("tr", {}, h("th", {}, k), h("td", {}, v))))));
}

// ---------------------------------------------------------------- start

function start() {
  const zone = document.getElementById("zone");
  zone.value = settings.zone;
  zone.addEventListener("change", () => {
    settings.zone = zone.value;
    localStorage.setItem("versiq.zone", zone.value);
    render();
  });
  const signout = document.getElementById("signout");
  signout.hidden = !sessionStorage.getItem("versiq.token");
  signout.addEventListener("click", () => {
    sessionStorage.removeItem("versiq.token");
    signout.hidden = true;
    render();
  });
  document.getElementById("auth-form").addEventListener("submit", () => {
    sessionStorage.setItem("versiq.token", document.getElementById("auth-token").value.trim());
    signout.hidden = false;
    render();
  });
  window.addEventListener("hashchange", render);
  render();
}

start();
