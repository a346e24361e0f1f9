// The Slack simulator's page: shows what Steward posted the way Slack shows it, live, and lets a
// person act as a Slack user. Every piece of text from Steward is untrusted: it only ever
// reaches the page through textContent or as a checked link, never as HTML.
"use strict";

const EMOJI = {
  warning: "⚠️", hourglass_flowing_sand: "⏳", x: "❌", white_check_mark: "✅",
  thinking_face: "🤔", leaves: "🍃", information_source: "ℹ️", ghost: "👻", gear: "⚙️",
  zzz: "💤", alarm_clock: "⏰", ballot_box_with_check: "☑️", link: "🔗", camera: "📷", wastebasket: "🗑️", broom: "🧹", lock: "🔒",
  rotating_light: "🚨", tada: "🎉", hourglass: "⌛", red_circle: "🔴", large_green_circle: "🟢",
  package: "📦", mag: "🔍", clipboard: "📋", stopwatch: "⏱️", no_entry: "⛔", heavy_check_mark: "✔️",
  recycle: "♻️", fire: "🔥", no_entry_sign: "🚫", left: "⬅️", pause_button: "⏸️", hammer_and_wrench: "🛠️",
  arrows_counterclockwise: "🔄", moneybag: "💰", floppy_disk: "💾", eyes: "👀", bell: "🔔", memo: "📝",
  heavy_multiplication_x: "✖️", repeat: "🔁", construction: "🚧", skull: "💀", test_tube: "🧪",
};
const ATTACHMENT_COLORS = { good: "#2eb67d", warning: "#ecb22e", danger: "#e01e5a" };
// Markers of mrkdwn's inline styles, tried in this order when two start at the same place.
const INLINE = [
  { re: /`([^`\n]+)`/, make: (m) => el("code", null, decode(m[1])) },
  { re: /<([^<>\n]+)>/, make: (m) => special(m[1]) },
  { re: /(?<![\w*])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])/, make: (m) => el("b", null, ...inline(m[1])) },
  { re: /(?<![\w_])_(?=\S)([^_\n]+?)(?<=\S)_(?![\w_])/, make: (m) => el("i", null, ...inline(m[1])) },
  { re: /(?<![\w~])~(?=\S)([^~\n]+?)(?<=\S)~(?![\w~])/, make: (m) => el("s", null, ...inline(m[1])) },
];

const state = {
  seq: 0, loaded: false, pending: [], interactive: false,
  people: [], users: {}, channels: new Map(), // id -> name
  messages: new Map(), // "channel|ts" -> message (top-level and replies)
  ephemeral: new Map(), // ts -> ephemeral message
  modals: new Map(), // view id -> modal
  unread: new Set(),
  person: null, channel: null, thread: null, // thread: {channel, ts}
};

// ---------- DOM helpers ----------

/** An element with attributes and children (strings become text nodes). */
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}
const $ = (id) => document.getElementById(id);

// ---------- mrkdwn ----------

/** Slack escapes only these three in message text. */
function decode(text) {
  return String(text).replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&amp;/g, "&");
}

function emojify(text) {
  return String(text).replace(/:([a-z0-9_+-]+):/g, (all, name) => EMOJI[name] || all);
}

/** A safe link target: absolute http(s) and mailto URLs only. */
function safeHref(url) {
  if (!/^(https?:\/\/|mailto:)/i.test(url)) return null;
  try {
    return new URL(url).href;
  } catch (_) {
    return null;
  }
}

function userName(id) {
  return state.users[id] || id;
}

/** `<...>`: mentions, special mentions and links. */
function special(inner) {
  const [target, label] = splitOnce(inner, "|");
  if (target.startsWith("@")) {
    return el("span", { class: "mention" }, "@" + (label || userName(target.slice(1))));
  }
  if (target.startsWith("#")) {
    const id = target.slice(1);
    return el("span", { class: "mention" }, "#" + (label || state.channels.get(id) || id));
  }
  if (target.startsWith("!")) {
    const word = target.slice(1);
    if (word.startsWith("subteam^")) return el("span", { class: "mention" }, label || "@group");
    if (word.startsWith("date^")) return document.createTextNode(decode(label || ""));
    return el("span", { class: "mention" }, "@" + (label || word));
  }
  const href = safeHref(decode(target));
  if (href) return el("a", { href, target: "_blank", rel: "noopener noreferrer" }, decode(label || target));
  // Not a link Slack would draw: shown as typed (or its label).
  return document.createTextNode(label ? decode(label) : "<" + decode(inner) + ">");
}

function splitOnce(text, sep) {
  const i = text.indexOf(sep);
  return i < 0 ? [text, null] : [text.slice(0, i), text.slice(i + 1)];
}

/** Inline mrkdwn (no code blocks) to nodes. */
function inline(text) {
  const out = [];
  let rest = text;
  while (rest.length) {
    let best = null;
    for (const rule of INLINE) {
      const m = rule.re.exec(rest);
      if (m && (!best || m.index < best.m.index)) best = { m, rule };
    }
    if (!best) break;
    if (best.m.index > 0) out.push(emojify(decode(rest.slice(0, best.m.index))));
    out.push(best.rule.make(best.m));
    rest = rest.slice(best.m.index + best.m[0].length);
  }
  if (rest.length) out.push(emojify(decode(rest)));
  return out;
}

/** mrkdwn to a `div.mrkdwn`: code blocks first, then inline styles. */
function mrkdwn(text) {
  const root = el("div", { class: "mrkdwn" });
  const parts = String(text || "").split("```");
  parts.forEach((part, i) => {
    // Odd parts sit between ``` fences; an unclosed fence is shown as typed.
    if (i % 2 === 1 && i < parts.length - 1) root.append(el("pre", null, decode(part.replace(/^\n/, ""))));
    else root.append(...inline(i % 2 === 1 ? "```" + part : part));
  });
  return root;
}

/** A Block Kit text object. */
function textObject(t) {
  if (!t) return document.createTextNode("");
  if (typeof t === "string") return mrkdwn(t);
  if (t.type === "mrkdwn") return mrkdwn(t.text);
  return el("span", { class: "plain" }, t.emoji === false ? t.text : emojify(t.text || ""));
}

function plain(t) {
  if (!t) return "";
  return typeof t === "string" ? t : t.text || "";
}

// ---------- Block Kit ----------

/** `where` says whose blocks these are, so a button knows what to send. */
function renderBlocks(blocks, where) {
  const frag = document.createDocumentFragment();
  (Array.isArray(blocks) ? blocks : []).forEach((block, i) => {
    const node = renderBlock(block || {}, i, where);
    if (node) frag.append(node);
  });
  return frag;
}

function renderBlock(block, index, where) {
  switch (block.type) {
    case "header":
      return el("div", { class: "block block-header" }, textObject(block.text));
    case "section": {
      const main = el("div", { class: "section-main" });
      if (block.text) main.append(textObject(block.text));
      if (Array.isArray(block.fields) && block.fields.length) {
        main.append(el("div", { class: "fields" }, block.fields.map((f) => el("div", { class: "field" }, textObject(f)))));
      }
      const node = el("div", { class: "block block-section" }, main);
      if (block.accessory) node.append(renderElement(block.accessory, index, null, where));
      return node;
    }
    case "context":
      return el("div", { class: "block block-context" },
        (block.elements || []).map((e) => (e.type === "image" ? el("span", { class: "alt" }, "[" + (e.alt_text || "image") + "]") : textObject(e))));
    case "divider":
      return el("hr", { class: "block-divider" });
    case "actions":
      return el("div", { class: "block block-actions" }, (block.elements || []).map((e, j) => renderElement(e, index, j, where)));
    case "image":
      return el("div", { class: "block block-image" },
        block.title ? el("div", null, plain(block.title)) : null,
        el("span", { class: "alt" }, "[image: " + (block.alt_text || "") + "]"));
    case "input":
      return renderInput(block, index, where);
    case "rich_text":
      return el("div", { class: "block" }, plain({ text: richText(block) }));
    default:
      return block.text ? el("div", { class: "block" }, textObject(block.text)) : null;
  }
}

function richText(block) {
  const texts = [];
  const walk = (v) => {
    if (!v || typeof v !== "object") return;
    if (typeof v.text === "string") texts.push(v.text);
    Object.values(v).forEach(walk);
  };
  walk(block.elements);
  return texts.join("");
}

function renderElement(element, blockIndex, elementIndex, where) {
  if (element.type === "button") {
    const style = element.style === "primary" || element.style === "danger" ? element.style : "";
    return el("button", {
      type: "button",
      class: ("btn " + style).trim(),
      "data-action-id": element.action_id || "",
      disabled: !state.interactive || where.kind === "modal",
      onclick: () => click(element, blockIndex, elementIndex, where),
    }, emojify(plain(element.text)));
  }
  if (element.type === "image") return el("span", { class: "alt" }, "[" + (element.alt_text || "image") + "]");
  const label = plain(element.placeholder) || element.type || "element";
  return el("button", { type: "button", class: "btn", disabled: true }, label);
}

function renderAttachments(attachments, where) {
  const frag = document.createDocumentFragment();
  (Array.isArray(attachments) ? attachments : []).forEach((a, i) => {
    const color = ATTACHMENT_COLORS[a.color] || (/^#?[0-9a-f]{3,8}$/i.test(a.color || "") ? "#" + a.color.replace(/^#/, "") : "#ddd");
    const body = el("div", { class: "attachment-body" });
    if (a.pretext) body.append(mrkdwn(a.pretext));
    if (a.title) body.append(el("b", null, a.title));
    if (a.text) body.append(mrkdwn(a.text));
    (a.fields || []).forEach((f) => body.append(el("div", null, el("b", null, f.title || ""), mrkdwn(f.value || ""))));
    if (a.blocks) body.append(renderBlocks(a.blocks, { ...where, attachment: i }));
    if (!a.text && !a.blocks && !a.title && a.fallback) body.append(mrkdwn(a.fallback));
    const bar = el("div", { class: "bar" });
    bar.style.background = color;
    frag.append(el("div", { class: "attachment", "data-color": a.color || "" }, bar, body));
  });
  return frag;
}

// ---------- messages ----------

const key = (channel, ts) => channel + "|" + ts;

/** Seconds the page's clock is moved on (tests move it to see the times change). */
let clockSkewSecs = 0;
const nowSecs = () => Date.now() / 1000 + clockSkewSecs;

/** When a message was posted, said from now: "just now", "4 min ago", "2 h ago", then the
 * clock time (with the day once it is not today). Redrawn every half minute ([`tickTimes`]). */
function time(ts) {
  const at = parseFloat(ts);
  const ago = nowSecs() - at;
  if (!Number.isFinite(at)) return "";
  if (ago < 45) return "just now";
  if (ago < 3600) return Math.max(1, Math.round(ago / 60)) + " min ago";
  if (ago < 6 * 3600) return Math.floor(ago / 3600) + " h ago";
  const d = new Date(at * 1000);
  const clock = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit" });
  const today = new Date(nowSecs() * 1000).toDateString() === d.toDateString();
  return today ? clock : d.toLocaleDateString([], { month: "short", day: "numeric" }) + " " + clock;
}

/** The full date and time, for the tooltip. */
function fullTime(ts) {
  return new Date(parseFloat(ts) * 1000).toLocaleString();
}

/** Redraws every shown time from its message's ts. */
function tickTimes() {
  document.querySelectorAll(".time[data-ts]").forEach((node) => {
    const text = time(node.dataset.ts);
    if (node.textContent !== text) node.textContent = text;
  });
}

function replies(channel, parentTs) {
  const out = [];
  for (const m of state.messages.values()) if (m.channel === channel && m.thread_ts === parentTs) out.push(m);
  for (const e of state.ephemeral.values()) {
    if (e.channel === channel && e.thread_ts === parentTs && e.user === state.person) out.push({ ...e, ephemeral: true });
  }
  return out.sort((a, b) => (a.ts < b.ts ? -1 : 1));
}

/** One message (channel or ephemeral) as a node. */
function renderMessage(m, { inThread = false } = {}) {
  const where = m.ephemeral
    ? { kind: "ephemeral", ts: m.ts, channel: m.channel }
    : { kind: "message", ts: m.ts, channel: m.channel };
  const body = el("div", { class: "msg-body" });
  if (m.ephemeral) body.append(el("div", { class: "only-you" }, "Only visible to you"));
  body.append(el("div", { class: "msg-head" },
    el("span", { class: "author" }, "Steward"), el("span", { class: "app-badge" }, "APP"),
    el("span", { class: "time", "data-ts": m.ts, title: fullTime(m.ts) }, time(m.ts)),
    m.edited ? el("span", { class: "edited" }, "(edited)") : null));
  const hasBlocks = Array.isArray(m.blocks) && m.blocks.length;
  const hasAttachments = Array.isArray(m.attachments) && m.attachments.length;
  if (hasBlocks) body.append(renderBlocks(m.blocks, where));
  else if (m.text) body.append(mrkdwn(m.text));
  if (hasAttachments) body.append(renderAttachments(m.attachments, where));
  for (const f of m.files || []) {
    body.append(el("div", null, el("a", { class: "file", href: f.url, target: "_blank", rel: "noopener" }, "📎 " + (f.title || f.name))));
  }
  if (!inThread && !m.ephemeral) {
    const n = replies(m.channel, m.ts).length;
    if (n) {
      body.append(el("button", { type: "button", class: "replies", onclick: () => openThread(m.channel, m.ts) },
        n === 1 ? "1 reply" : n + " replies"));
    }
  }
  return el("div", {
    class: "msg" + (m.ephemeral ? " ephemeral" : ""),
    "data-ts": m.ts, "data-channel": m.channel, "data-key": (m.ephemeral ? "e|" : "m|") + m.ts,
  }, el("div", { class: "avatar" }, "S"), body);
}

/** What the selected person sees at the top level of the selected channel, oldest first. */
function visibleTopLevel() {
  const out = [];
  for (const m of state.messages.values()) if (m.channel === state.channel && !m.thread_ts) out.push(m);
  for (const e of state.ephemeral.values()) {
    if (e.channel === state.channel && !e.thread_ts && e.user === state.person) out.push({ ...e, ephemeral: true });
  }
  return out.sort((a, b) => (a.ts < b.ts ? -1 : 1));
}

let renderGeneration = 0;
/** Redraws the selected channel: the newest messages first, older ones in chunks after, so a
 * channel of hundreds of messages shows at once and stays responsive. */
function renderChannel() {
  const list = $("messages");
  const items = visibleTopLevel();
  const generation = ++renderGeneration;
  list.replaceChildren();
  const CHUNK = 100;
  let end = items.length;
  let start = Math.max(0, end - CHUNK);
  list.append(...items.slice(start, end).map((m) => renderMessage(m)));
  list.scrollTop = list.scrollHeight;
  const more = () => {
    if (generation !== renderGeneration || start === 0) return;
    end = start;
    start = Math.max(0, end - CHUNK);
    const height = list.scrollHeight;
    list.prepend(...items.slice(start, end).map((m) => renderMessage(m)));
    list.scrollTop += list.scrollHeight - height;
    setTimeout(more, 0);
  };
  setTimeout(more, 0);
  $("channel-title").textContent = "#" + (state.channels.get(state.channel) || state.channel || "");
}

/** Puts one message's node in place (replacing its old one), without redrawing the rest. */
function placeMessage(m) {
  const list = $("messages");
  const dataKey = (m.ephemeral ? "e|" : "m|") + m.ts;
  const node = renderMessage(m);
  // A reader at the bottom stays at the bottom as messages arrive or grow.
  const stick = list.scrollHeight - list.scrollTop - list.clientHeight < 40;
  const old = list.querySelector(`[data-key="${CSS.escape(dataKey)}"]`);
  if (old) {
    old.replaceWith(node);
  } else {
    let after = list.lastElementChild;
    while (after && after.dataset.ts > m.ts) after = after.previousElementSibling;
    if (after) after.after(node);
    else list.prepend(node);
  }
  if (stick) list.scrollTop = list.scrollHeight;
}

function removeNode(dataKey) {
  const old = $("messages").querySelector(`[data-key="${CSS.escape(dataKey)}"]`);
  if (old) old.remove();
}

function openThread(channel, ts) {
  state.thread = { channel, ts };
  renderThread();
}

function renderThread() {
  const pane = $("thread");
  if (!state.thread) {
    pane.hidden = true;
    return;
  }
  const parent = state.messages.get(key(state.thread.channel, state.thread.ts));
  if (!parent) {
    state.thread = null;
    pane.hidden = true;
    return;
  }
  pane.hidden = false;
  const parentNode = renderMessage(parent, { inThread: true });
  parentNode.classList.add("parent");
  $("thread-title").textContent = "Thread in #" + (state.channels.get(parent.channel) || parent.channel);
  $("thread-messages").replaceChildren(parentNode,
    ...replies(parent.channel, parent.ts).map((m) => renderMessage(m, { inThread: true })));
}

// ---------- sidebar and people ----------

function renderChannels() {
  const ul = $("channels");
  ul.replaceChildren(...[...state.channels.entries()].map(([id, name]) => el("li", {
    class: id === state.channel ? "selected" : "", "data-channel": id,
    onclick: () => selectChannel(id),
  }, el("span", { class: state.unread.has(id) ? "unread" : "" }, "# " + name))));
}

function renderPeople() {
  const select = $("person");
  select.replaceChildren(...state.people.map((p) => el("option", { value: p.id, selected: p.id === state.person }, personLabel(p))));
}

/** A person as the terminal names them: "erin (approver)"; the label alone for a person the
 * simulator knows no name of. */
function personLabel(p) {
  const name = state.users[p.id];
  if (!name || name === p.label || name === p.id.toLowerCase()) return p.label;
  return p.label ? name + " (" + p.label + ")" : name;
}

/** The channel with the newest message (a reply counts for its channel), so the page opens
 * where something happened; the first channel when nothing was posted yet. */
function mostRecentChannel() {
  let best = null;
  for (const m of state.messages.values()) {
    if (!best || m.ts > best.ts) best = m;
  }
  return best ? best.channel : [...state.channels.keys()][0];
}

function selectChannel(id) {
  state.channel = id;
  state.unread.delete(id);
  state.thread = null;
  remember();
  renderChannels();
  renderChannel();
  renderThread();
}

function remember() {
  const params = new URLSearchParams({ channel: state.channel || "", as: state.person || "" });
  history.replaceState(null, "", "#" + params.toString());
}

// ---------- modals and dialogs ----------

function modalFor(person) {
  for (const m of state.modals.values()) if (!m.user || m.user === person) return m;
  return null;
}

function renderInput(block, index, where) {
  const blockId = block.block_id || "sim-block-" + index;
  const e = block.element || {};
  const actionId = e.action_id || "sim-action-" + index;
  const id = "in-" + blockId + "-" + actionId;
  const attrs = { id, "data-block-id": blockId, "data-action-id": actionId, "data-type": e.type || "" };
  let field;
  if (e.type === "plain_text_input") {
    field = e.multiline ? el("textarea", attrs) : el("input", { ...attrs, type: "text" });
    if (e.placeholder) field.placeholder = plain(e.placeholder);
    if (e.initial_value) field.value = e.initial_value;
  } else if (e.type === "datepicker") {
    field = el("input", { ...attrs, type: "date" });
    if (e.initial_date) field.value = e.initial_date;
  } else if (e.type === "static_select") {
    field = el("select", attrs, el("option", { value: "" }, plain(e.placeholder) || "Choose…"),
      (e.options || []).map((o) => el("option", { value: o.value }, plain(o.text))));
    if (e.initial_option) field.value = e.initial_option.value;
  } else if (e.type === "checkboxes") {
    // One box per option; the group carries the block and action ids, each box its value.
    const initial = new Set((e.initial_options || []).map((o) => o.value));
    field = el("div", { ...attrs, class: "checkboxes", role: "group" },
      (e.options || []).map((o, n) => {
        const boxId = id + "-" + n;
        return el("div", { class: "checkbox" },
          el("input", { type: "checkbox", id: boxId, value: o.value, checked: initial.has(o.value) }),
          el("label", { for: boxId }, textObject(o.text)),
          o.description ? el("div", { class: "hint" }, plain(o.description)) : null);
      }));
  } else {
    field = el("input", { ...attrs, type: "text" });
  }
  const error = where.errors && where.errors[blockId];
  return el("div", { class: "input-block" + (error ? " has-error" : "") },
    el("label", { for: id }, plain(block.label), block.optional ? el("span", { class: "optional" }, " (optional)") : null),
    field,
    block.hint ? el("div", { class: "hint" }, plain(block.hint)) : null,
    error ? el("div", { class: "input-error" }, error) : null);
}

/** Shows the selected person's open modal (keeping what was typed), or hides it. */
function renderModal() {
  const overlay = $("overlay");
  if (overlay.dataset.kind === "confirm") return;
  const modal = modalFor(state.person);
  if (!modal) {
    overlay.hidden = true;
    overlay.replaceChildren();
    delete overlay.dataset.kind;
    return;
  }
  const typed = {};
  overlay.querySelectorAll("[data-block-id]").forEach((f) => (typed[f.id] = fieldValue(f)));
  const view = modal.view || {};
  const where = { kind: "modal", errors: modal.errors || {} };
  const error = el("div", { class: "banner error", hidden: true, role: "alert" });
  const form = el("form", { class: "dialog", "data-view-id": modal.id, onsubmit: (ev) => { ev.preventDefault(); submitModal(modal, form, error); } },
    el("header", null, plain(view.title)),
    el("div", { class: "dialog-body" }, renderBlocks(view.blocks, where), error),
    el("footer", null,
      el("button", { type: "button", class: "btn", onclick: () => closeModal(modal) }, plain(view.close) || "Cancel"),
      view.submit ? el("button", { type: "submit", class: "btn primary" }, plain(view.submit)) : null));
  overlay.replaceChildren(form);
  overlay.dataset.kind = "modal";
  overlay.hidden = false;
  for (const [id, value] of Object.entries(typed)) {
    const f = document.getElementById(id);
    if (!f) continue;
    if (Array.isArray(value)) f.querySelectorAll("input[type=checkbox]").forEach((box) => (box.checked = value.includes(box.value)));
    else f.value = value;
  }
}

/** What an input holds: its text, or the values of the ticked boxes of a checkbox group. */
function fieldValue(f) {
  if (f.dataset.type === "checkboxes") {
    return [...f.querySelectorAll("input[type=checkbox]:checked")].map((box) => box.value);
  }
  return f.value;
}

async function submitModal(modal, form, error) {
  const values = {};
  form.querySelectorAll("[data-block-id]").forEach((f) => {
    (values[f.dataset.blockId] ||= {})[f.dataset.actionId] = fieldValue(f);
  });
  const answer = await act("/_sim/act/submit", { user: state.person, view_id: modal.id, values });
  if (answer.error) {
    error.textContent = answer.error;
    error.hidden = false;
  }
}

async function closeModal(modal) {
  await act("/_sim/act/close", { user: state.person, view_id: modal.id });
}

/** Slack's confirm dialog before a button with `confirm` sends anything. */
function confirmDialog(confirm) {
  return new Promise((resolve) => {
    const overlay = $("overlay");
    const previous = [...overlay.childNodes];
    const wasHidden = overlay.hidden;
    const done = (yes) => {
      delete overlay.dataset.kind;
      overlay.replaceChildren(...previous);
      overlay.hidden = wasHidden;
      resolve(yes);
      renderModal();
    };
    const style = confirm.style === "danger" ? "danger" : "primary";
    overlay.replaceChildren(el("div", { class: "dialog confirm", role: "dialog" },
      el("header", null, plain(confirm.title) || "Are you sure?"),
      el("div", { class: "dialog-body" }, textObject(confirm.text)),
      el("footer", null,
        el("button", { type: "button", class: "btn", "data-confirm": "deny", onclick: () => done(false) }, plain(confirm.deny) || "Cancel"),
        el("button", { type: "button", class: "btn " + style, "data-confirm": "confirm", onclick: () => done(true) }, plain(confirm.confirm) || "Yes"))));
    overlay.dataset.kind = "confirm";
    overlay.hidden = false;
  });
}

// ---------- acting ----------

function showError(text) {
  const box = $("error");
  box.textContent = text || "";
  box.hidden = !text;
}

/** POSTs an action to the simulator; `{error}` when it was refused. */
async function act(path, body) {
  try {
    const resp = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const text = await resp.text();
    const json = text ? JSON.parse(text) : {};
    if (!resp.ok) {
      const error = json.error || `The simulator answered ${resp.status}.`;
      showError(error);
      return { error };
    }
    showError("");
    return json;
  } catch (e) {
    const error = "The simulator did not answer: " + e.message;
    showError(error);
    return { error };
  }
}

async function click(element, block, elementIndex, where) {
  if (element.confirm && !(await confirmDialog(element.confirm))) return;
  await act("/_sim/act/click", {
    user: state.person, channel: where.channel, ts: where.ts, ephemeral: where.kind === "ephemeral",
    attachment: where.attachment ?? null, block, element: elementIndex,
  });
}

async function sendCommand(ev) {
  ev.preventDefault();
  const input = $("command");
  const text = input.value.trim();
  if (!text) return;
  const answer = await act("/_sim/act/command", { user: state.person, channel: state.channel, text });
  if (!answer.error) input.value = "";
}

// ---------- the world and its changes ----------

function storeMessage(m) {
  state.messages.set(key(m.channel, m.ts), m);
  if (!state.channels.has(m.channel)) state.channels.set(m.channel, m.channel);
}

async function loadWorld() {
  const world = await (await fetch("/_sim/world")).json();
  state.seq = world.seq;
  state.interactive = world.interactive;
  state.people = world.people;
  state.users = world.users;
  state.channels = new Map(world.channels.map((c) => [c.id, c.name]));
  state.messages = new Map();
  for (const c of world.channels) {
    for (const m of c.messages) {
      storeMessage(m);
      for (const r of m.replies || []) storeMessage(r);
    }
  }
  state.ephemeral = new Map(world.ephemeral.map((e) => [e.ts, e]));
  state.modals = new Map(world.modals.map((m) => [m.id, m]));
  const wanted = new URLSearchParams(location.hash.slice(1));
  if (!state.person || !state.people.some((p) => p.id === state.person)) {
    state.person = state.people.some((p) => p.id === wanted.get("as")) ? wanted.get("as") : (state.people[0] || {}).id;
  }
  if (!state.channel || !state.channels.has(state.channel)) {
    state.channel = state.channels.has(wanted.get("channel")) ? wanted.get("channel") : mostRecentChannel();
  }
  $("readonly").hidden = state.interactive;
  $("command").disabled = !state.interactive;
  $("send").disabled = !state.interactive;
  state.loaded = true;
  renderPeople();
  renderChannels();
  renderChannel();
  renderThread();
  renderModal();
  const pending = state.pending;
  state.pending = [];
  pending.forEach(apply);
}

/** Applies one change from the feed, redrawing only what it touches. */
function apply(change) {
  if (!state.loaded) return state.pending.push(change);
  if (change.seq <= state.seq) return;
  if (change.seq > state.seq + 1) return loadWorld(); // missed a change: read everything again
  state.seq = change.seq;
  switch (change.kind) {
    case "message": {
      const m = change.message;
      const isNewChannel = !state.channels.has(m.channel);
      storeMessage(m);
      if (isNewChannel) renderChannels();
      if (m.channel !== state.channel) {
        state.unread.add(m.channel);
        renderChannels();
      } else if (m.thread_ts) {
        const parent = state.messages.get(key(m.channel, m.thread_ts));
        if (parent) placeMessage(parent);
      } else {
        placeMessage(m);
      }
      if (state.thread && state.thread.channel === m.channel && (state.thread.ts === m.ts || state.thread.ts === m.thread_ts)) renderThread();
      break;
    }
    case "deleted":
      state.messages.delete(key(change.channel, change.ts));
      removeNode("m|" + change.ts);
      renderThread();
      break;
    case "ephemeral": {
      const e = change.ephemeral;
      state.ephemeral.set(e.ts, e);
      if (!state.channels.has(e.channel)) {
        state.channels.set(e.channel, e.channel);
        renderChannels();
      }
      if (e.user === state.person && e.channel === state.channel) {
        if (e.thread_ts) renderThread();
        else placeMessage({ ...e, ephemeral: true });
      }
      break;
    }
    case "ephemeral_deleted":
      state.ephemeral.delete(change.ts);
      removeNode("e|" + change.ts);
      break;
    case "modal":
      state.modals.set(change.modal.id, change.modal);
      renderModal();
      break;
    case "modal_closed":
      state.modals.delete(change.id);
      renderModal();
      break;
  }
}

function connect() {
  const events = new EventSource("/_sim/events");
  const status = $("connection");
  events.addEventListener("open", () => {
    status.textContent = "live";
    status.classList.add("live");
    // (Re)connected: changes may have been missed, so read the world again.
    state.loaded = false;
    loadWorld().catch((e) => showError("Could not read the simulator: " + e.message));
  });
  events.addEventListener("change", (ev) => apply(JSON.parse(ev.data)));
  events.addEventListener("resync", () => loadWorld());
  events.addEventListener("error", () => {
    status.textContent = "reconnecting…";
    status.classList.remove("live");
  });
}

document.addEventListener("DOMContentLoaded", () => {
  $("composer").addEventListener("submit", sendCommand);
  $("person").addEventListener("change", (ev) => {
    state.person = ev.target.value;
    remember();
    renderChannel();
    renderThread();
    renderModal();
  });
  $("thread-close").addEventListener("click", () => {
    state.thread = null;
    renderThread();
  });
  connect();
  setInterval(tickTimes, 30000);
});

// For tests in the browser: the mrkdwn renderer on its own.
// `skew(secs)` moves the page's clock on, as if that much time had passed, and redraws the times.
window.stewardSim = {
  mrkdwn, state,
  skew: (secs) => {
    clockSkewSecs = Number(secs) || 0;
    tickTimes();
  },
};
