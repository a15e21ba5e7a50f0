// The saga console: plain ES module, no build step, no dependency. It reads and steers sagas
// through the same HTTP API as any client, with the user's token (kept for this tab only, in
// sessionStorage, and sent as a bearer header: never in a URL or a cookie).
//
// Live updates are a cheap poll: a saga's page reads the saga every 2 seconds and its attempts,
// events and deliveries only when it changed; the list reads its page and the (server-cached)
// counts every 5. Nothing is polled while the tab is hidden or once a saga is finished. What
// did not change is not drawn again, and what is drawn again is patched in place (the same
// nodes stay), so that the keyboard's focus, scroll positions and a screen reader's place
// survive an update.

const TOKEN_KEY = 'saga-console-token';
// Nothing drives these on their own (the server's SagaStatus::is_terminal): their time axis
// ends at their last activity. A FAILED saga waits for a person, who may still retry it.
const STOPPED = new Set(['COMPLETED', 'COMPENSATED', 'ABORTED', 'FAILED']);
// No operator action changes these any more: their page stops polling.
const FINISHED = new Set(['COMPLETED', 'COMPENSATED', 'ABORTED']);
const STATUSES = ['QUEUED', 'RUNNING', 'COMPENSATING', 'COMPLETED', 'COMPENSATED', 'FAILED', 'ABORTED'];
const UNKNOWN_OUTCOMES = new Set(['timed_out', 'interrupted', 'abandoned']);
const FAILED_OUTCOMES = new Set(['failed', 'retryable']);
const SAGA_POLL_MS = 2000;
const LIST_POLL_MS = 5000;
const ZOOMS = [1, 2, 4, 8, 16, 32, 64];
const EXPAND_BRANCHES_UP_TO = 16;

const state = {
  token: sessionStorage.getItem(TOKEN_KEY),
  me: null,
  definitions: null,
  names: new Set(), // saga names known: the definitions', and any seen in a list
  generation: 0, // bumped at every navigation: pollers of an older page stop
  listCursors: {}, // per filter: the cursors of the pages before the current one
  view: {}, // per saga: zoom, folded groups, selected bar
  counts: null, // the counts last drawn, to draw them only when they change
};

// ---- small helpers ------------------------------------------------------------------------

/**
 * Builds an element: `el('a', {href: '#'}, 'text', child)`. Text is always text, never HTML.
 * Handlers are set as properties (`onclick`), so that a patch can hand them on (see morph).
 */
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'class') node.className = v;
    else if (k === 'style') node.style.cssText = v; // through the CSSOM: allowed by the CSP
    else if (k.startsWith('on')) node[k] = v;
    else if (k === 'dataset') Object.assign(node.dataset, v);
    else if (v === true) node.setAttribute(k, '');
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  describe() {
    return `${this.status ? this.status : ''}${this.code ? ' ' + this.code : ''}: ${this.message}`.trim();
  }
}

function describe(e) {
  return e instanceof ApiError ? e.describe() : e.message;
}

async function api(path, { method = 'GET', body } = {}) {
  const headers = { accept: 'application/json' };
  if (state.token) headers.authorization = `Bearer ${state.token}`;
  if (body !== undefined) headers['content-type'] = 'application/json';
  let response;
  const sent = Date.now();
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'unreachable', `the server did not answer (${e.message})`);
  }
  // The Date header is the server's clock to the second, read between `sent` and now.
  const date = Date.parse(response.headers.get('date') || '');
  if (!Number.isNaN(date)) clockSample(date - Date.now(), date + 1000 - sent);
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = data && data.error ? data.error : {};
    throw new ApiError(response.status, err.code, err.message || text || response.statusText);
  }
  return data;
}

function can(scope) {
  const scopes = (state.me && state.me.scopes) || [];
  return scopes.includes('admin') || scopes.includes(scope);
}

// ---- the server's clock -------------------------------------------------------------------
//
// Running bars, the now-line and "running for" compare the server's timestamps with the
// present, which must then be read on the server's clock, not the browser's. Each answer
// bounds the offset between the two: its Date header (to the second) from both sides, and any
// time the server reports (it is past by then) from below. The bounds of recent answers are
// intersected; the browser's own clock is kept if it lies within them.

const clock = { samples: [], offset: 0 };

function clockSample(lo, hi) {
  const at = Date.now();
  clock.samples.push({ lo, hi, at });
  clock.samples = clock.samples.filter((s) => at - s.at < 600_000).slice(-50);
  let low = -Infinity;
  let high = Infinity;
  for (let i = clock.samples.length - 1; i >= 0; i--) {
    const s = clock.samples[i];
    const l = Math.max(low, s.lo);
    const h = Math.min(high, s.hi);
    if (l > h) break; // an older answer disagrees: one of the clocks was set since
    low = l;
    high = h;
  }
  clock.offset = Math.min(Math.max(0, low), high);
}

/** Notes that the server's clock had reached `iso` by now. */
function serverWasAt(iso) {
  const t = Date.parse(iso || '');
  if (!Number.isNaN(t)) clockSample(t - Date.now(), Infinity);
}

function serverNow() {
  return Date.now() + clock.offset;
}

// ---- times --------------------------------------------------------------------------------

const localFormat = new Intl.DateTimeFormat(undefined, { dateStyle: 'medium', timeStyle: 'medium' });
const timeOnly = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit', second: '2-digit' });
const dayAndTime = new Intl.DateTimeFormat(undefined, {
  month: 'short', day: 'numeric', hour: '2-digit', minute: '2-digit', second: '2-digit',
});

function ms(iso) {
  return iso ? Date.parse(iso) : null;
}

function dayOf(t) {
  const d = new Date(t);
  return `${d.getFullYear()}-${d.getMonth()}-${d.getDate()}`;
}

/** Whether times between `from` and `to` need their date: they span days, or are not today's. */
function needsDate(from, to) {
  return dayOf(from) !== dayOf(to) || dayOf(to) !== dayOf(serverNow());
}

/** A clock time, with its date if `withDate`. */
function clockText(t, withDate) {
  return (withDate ? dayAndTime : timeOnly).format(new Date(t));
}

/** A time in the viewer's zone, UTC on hover; `short` leaves out the date unless `withDate`. */
function timeEl(iso, short = false, withDate = false) {
  if (!iso) return el('span', { class: 'muted' }, '—');
  const d = new Date(iso);
  const text = short ? clockText(d, withDate) : localFormat.format(d);
  return el('time', { datetime: iso, title: `UTC: ${d.toISOString()}` }, text);
}

function fmtDur(milliseconds) {
  if (milliseconds === null || milliseconds === undefined || Number.isNaN(milliseconds)) return '—';
  const m = Math.max(0, milliseconds);
  if (m < 1000) return `${Math.round(m)} ms`;
  if (m < 60_000) return `${(m / 1000).toFixed(m < 10_000 ? 2 : 1)} s`;
  const s = Math.round(m / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86_400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86_400)} d ${Math.floor((s % 86_400) / 3600)} h`;
}

function badge(status, prefix = '') {
  return el('span', { class: `badge s-${status}` }, prefix + status);
}

/**
 * A short form of an id. Ids are UUIDv7: their first digits are their creation time, the
 * same for sagas started together, so the last ones (random) are kept too.
 */
function shortId(id) {
  return id ? `${id.slice(0, 8)}…${id.slice(-4)}` : '';
}

/** A whole id that a narrow screen shortens as `shortId` does, keeping it whole for reading. */
function idText(id) {
  return [
    el('span', {}, id.slice(0, 8)),
    el('span', { class: 'id-mid' }, id.slice(8, -4)),
    el('span', { class: 'id-ell', 'aria-hidden': 'true' }, '…'),
    el('span', {}, id.slice(-4)),
  ];
}

function toast(message) {
  const box = document.getElementById('toast');
  const item = el('div', {}, message);
  box.append(item);
  setTimeout(() => item.remove(), 6000);
}

/** Replaces `node`'s children with the given ones, leaving out the absent (null, false). */
function fill(node, ...children) {
  node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  return node;
}

/** A labelled form field: the label beside its control, not around it. */
function field(id, label, control, ...more) {
  return el('div', { class: 'field' }, el('label', { for: id }, label), control, ...more);
}

function pretty(value, name) {
  return el('pre', { class: 'json', tabindex: 0, role: 'region', 'aria-label': name, dataset: { focus: `json ${name}` } },
    JSON.stringify(value, null, 2));
}

function main() {
  return document.getElementById('main');
}

// ---- drawing again without losing one's place -----------------------------------------------

/** What pairs a node with its next version: its data-key, else its data-focus. */
function keyOf(node) {
  if (node.nodeType !== 1) return null;
  return node.dataset.key ?? node.dataset.focus ?? null;
}

const HANDLERS = ['onclick', 'onchange', 'oninput', 'onsubmit', 'onkeydown'];

/** Makes `old` like `fresh`, keeping every node that stands for the same thing in both. */
function morph(old, fresh) {
  for (const { name } of [...old.attributes]) {
    if (!fresh.hasAttribute(name)) old.removeAttribute(name);
  }
  for (const { name, value } of fresh.attributes) {
    if (name === 'style') {
      if (old.style.cssText !== fresh.style.cssText) old.style.cssText = fresh.style.cssText; // CSSOM, as el() does
    } else if (old.getAttribute(name) !== value) {
      old.setAttribute(name, value);
    }
  }
  for (const h of HANDLERS) if (old[h] !== fresh[h]) old[h] = fresh[h];
  morphChildren(old, fresh);
}

function morphChildren(parent, fresh) {
  const keyed = new Map();
  for (const c of parent.childNodes) {
    const k = keyOf(c);
    if (k !== null) keyed.set(k, c);
  }
  let cursor = parent.firstChild;
  for (const next of [...fresh.childNodes]) {
    const k = keyOf(next);
    let match = null;
    if (k !== null) {
      const found = keyed.get(k);
      if (found && found.nodeName === next.nodeName) {
        match = found;
        keyed.delete(k);
      }
    } else if (cursor && keyOf(cursor) === null && cursor.nodeName === next.nodeName) {
      match = cursor;
    }
    if (!match) {
      parent.insertBefore(next, cursor);
      continue;
    }
    if (match === cursor) cursor = cursor.nextSibling;
    // moveBefore keeps a moved node's focus; insertBefore (older browsers) does not.
    else if (parent.moveBefore) parent.moveBefore(match, cursor);
    else parent.insertBefore(match, cursor);
    if (match.nodeType === 1) morph(match, next);
    else if (match.nodeValue !== next.nodeValue) match.nodeValue = next.nodeValue;
  }
  while (cursor) {
    const after = cursor.nextSibling;
    cursor.remove();
    cursor = after;
  }
}

/** Whether the user has text selected in `region` (a redraw would take it away). */
function selecting(region) {
  const selection = document.getSelection();
  if (!selection || selection.isCollapsed) return false;
  for (let i = 0; i < selection.rangeCount; i++) {
    if (selection.getRangeAt(i).intersectsNode(region)) return true;
  }
  return false;
}

/** A name for a focusable node that its next version shares. */
function focusKey(node) {
  if (node.dataset && node.dataset.focus) return `f ${node.dataset.focus}`;
  if (node.id) return `#${node.id}`;
  if (node.getAttribute('href')) return `href ${node.getAttribute('href')}`;
  return `${node.tagName} ${node.getAttribute('aria-label') || node.textContent.trim()}`;
}

/**
 * Draws `children` into `region` as a patch of what it shows. Not while the user selects text
 * there (answers false: the caller tries again at its next poll) unless `force`. Focus that
 * was in the region and lost with a node goes to the node's new version, if any.
 */
function update(region, children, force = false) {
  if (!force && selecting(region)) return false;
  const active = document.activeElement;
  const had = active && active !== region && region.contains(active) ? focusKey(active) : null;
  morphChildren(region, el('div', {}, children));
  if (had && !region.contains(document.activeElement)) {
    const again = [...region.querySelectorAll('a[href], button, input, select, textarea, [tabindex]')]
      .find((n) => focusKey(n) === had);
    if (again) again.focus({ preventScroll: true });
    else if (document.activeElement === document.body) main().focus({ preventScroll: true });
  }
  return true;
}

// ---- polling and its problems ---------------------------------------------------------------

/** Says, politely, that the page shows older data than it should; `null` says all is well. */
function refreshNotice(problem, shownAt) {
  const box = document.getElementById('refresh');
  const text = problem
    ? `${problem}${shownAt ? `; showing the data from ${timeOnly.format(new Date(shownAt))}` : ''}.`
    : '';
  if (box.textContent === text) return; // the same words are not announced again
  fill(box, text ? el('p', {}, text) : null);
}

/**
 * Runs `tick` now (its error goes to the caller, which shows it) and then every `every` ms
 * while the page of `generation` is shown and `tick` does not answer `false`. `tick` gets a
 * function that tells whether that page is still the one shown: checked after each wait, so
 * that a page left while it loaded never draws over the next one. A later failure leaves the
 * page as it was, with a notice saying so until a poll succeeds.
 */
async function poll(generation, tick, every, gone = 'the server no longer has it') {
  const current = () => generation === state.generation;
  let shownAt = Date.now();
  const run = async () => {
    if (!current()) return;
    if (document.hidden) {
      setTimeout(run, every);
      return;
    }
    let again = true;
    try {
      again = (await tick(current)) !== false;
      if (current()) {
        shownAt = Date.now();
        refreshNotice(null);
      }
    } catch (e) {
      if (!current()) return;
      if (e instanceof ApiError && e.status === 401) {
        showLogin('The token was refused.');
        return;
      }
      if (e instanceof ApiError && e.status === 404) {
        refreshNotice(`Not refreshed: ${gone}`, shownAt);
        return; // it will not come back
      }
      refreshNotice(`Could not refresh: ${describe(e)}`, shownAt);
    }
    if (again && current()) setTimeout(run, every);
  };
  if ((await tick(current)) !== false && current()) setTimeout(run, every);
}

// ---- identity -----------------------------------------------------------------------------

async function loadMe() {
  try {
    state.me = await api('/v1/whoami');
  } catch (e) {
    if (e instanceof ApiError && (e.status === 401 || e.status === 403)) {
      state.me = null;
      return false;
    }
    throw e;
  }
  renderWho();
  return true;
}

function renderWho() {
  const who = document.getElementById('who');
  who.replaceChildren();
  if (!state.me) return;
  const label = state.me.auth_required
    ? `${state.me.name} (${state.me.scopes.join(', ')})`
    : 'open API';
  who.append(el('span', { title: 'The token this tab uses' }, label));
  if (state.me.auth_required) {
    who.append(
      el('button', {
        type: 'button',
        onclick: () => {
          sessionStorage.removeItem(TOKEN_KEY);
          state.token = null;
          state.me = null;
          showLogin();
        },
      }, 'Sign out'),
    );
  }
}

function showLogin(problem) {
  state.generation += 1;
  state.counts = null;
  refreshNotice(null);
  document.getElementById('counts').replaceChildren();
  renderWho();
  const input = el('input', {
    id: 'token', name: 'token', type: 'password', autocomplete: 'off', required: true, spellcheck: 'false',
  });
  const error = el('p', { class: 'error-text', role: 'alert', hidden: !problem }, problem || '');
  const form = el('form', {
    class: 'login',
    onsubmit: async (ev) => {
      ev.preventDefault();
      state.token = input.value.trim();
      if (await loadMe()) {
        sessionStorage.setItem(TOKEN_KEY, state.token);
        route();
      } else {
        state.token = null;
        error.textContent = 'This token is not accepted by the server.';
        error.hidden = false;
      }
    },
  },
  el('h1', {}, 'Sign in'),
  el('p', { class: 'muted' }, 'This server asks for an API token. It is kept for this tab only.'),
  field('token', 'API token', input),
  error,
  el('div', {}, el('button', { class: 'primary', type: 'submit' }, 'Sign in')));
  fill(main(), form);
  input.focus();
}

// ---- counts in the header -----------------------------------------------------------------

function showCounts(counts, currentStatus) {
  serverWasAt(counts.counted_at);
  const { counted_at: _, ...shown } = counts;
  const key = JSON.stringify([shown, currentStatus]);
  const nav = document.getElementById('counts');
  if (key === state.counts && nav.childElementCount) return;
  const chips = STATUSES.map((s) => {
    const href = `#/?status=${s}`;
    return el('a', {
      href, 'aria-current': currentStatus === s ? 'true' : 'false', class: 'badge-chip', dataset: { key: href },
    }, `${s.toLowerCase()} ${counts.by_status[s] ?? 0}`);
  });
  chips.push(el('a', { href: '#/?needs_attention=1', class: 'flag', dataset: { key: 'attention' } },
    `needs attention ${counts.needs_attention}`));
  if (counts.blocked) {
    chips.push(el('a', { href: '#/?blocked=1', class: 'flag', dataset: { key: 'blocked' } }, `blocked ${counts.blocked}`));
  }
  if (update(nav, chips)) state.counts = key;
}

// ---- the list of sagas --------------------------------------------------------------------

function toLocalInput(iso) {
  if (!iso) return '';
  const d = new Date(iso);
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

function listQuery(params) {
  const q = new URLSearchParams();
  if (params.get('status')) q.set('status', params.get('status'));
  if (params.get('name')) q.set('name', params.get('name'));
  if (params.get('needs_attention')) q.set('needs_attention', 'true');
  if (params.get('blocked')) q.set('blocked', 'true');
  if (params.get('after')) q.set('created_after', params.get('after'));
  if (params.get('before')) q.set('created_before', params.get('before'));
  if (params.get('id')) q.set('id_prefix', params.get('id'));
  q.set('limit', '50');
  return q;
}

function sagaRow(s) {
  return el('tr', { class: s.needs_attention ? 'attention' : '', dataset: { key: s.id } },
    el('td', { class: 'idcell' }, el('a', { href: `#/sagas/${s.id}`, class: 'mono' }, idText(s.id))),
    el('td', {}, s.name),
    el('td', {}, badge(s.status), ' ',
      s.needs_attention ? el('span', { class: 'badge flagbadge' }, 'needs attention') : null, ' ',
      s.blocked ? el('span', { class: 'badge flagbadge' }, 'blocked') : null),
    el('td', { class: 'opt' }, timeEl(s.created_at)),
    el('td', { class: 'opt' }, timeEl(s.updated_at)),
    el('td', { class: 'err', title: s.error || '' }, s.error || ''));
}

function sagaTable(sagas, caption, name) {
  return el('div', { class: 'table-wrap', dataset: { key: name } }, el('table', {},
    el('caption', { class: 'muted', style: 'text-align:left' }, caption),
    el('thead', {}, el('tr', {},
      el('th', { scope: 'col' }, 'Id'), el('th', { scope: 'col' }, 'Saga'), el('th', { scope: 'col' }, 'Status'),
      el('th', { scope: 'col', class: 'opt' }, 'Created'), el('th', { scope: 'col', class: 'opt' }, 'Updated'),
      el('th', { scope: 'col' }, 'Error'))),
    el('tbody', {}, sagas.map(sagaRow))));
}

/** The API's complaint about a filter, shown beside the field it is about. */
const FILTER_PARAMS = [['id_prefix', 'f-id'], ['created_after', 'f-after'], ['created_before', 'f-before'], ['status', 'f-status'], ['name', 'f-name']];

async function renderList(params) {
  const generation = state.generation;
  document.title = 'Sagas';
  if (!state.definitions) {
    try {
      state.definitions = (await api('/v1/definitions')).definitions;
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) throw e;
      state.definitions = []; // the names of the sagas listed are offered instead
    }
  }
  if (generation !== state.generation) return;
  for (const d of state.definitions) state.names.add(d.name);

  const status = el('select', { id: 'f-status', name: 'status' },
    el('option', { value: '' }, 'any'),
    STATUSES.map((s) => el('option', { value: s, selected: params.get('status') === s }, s)));
  // Free text: sagas of a definition no running process has are listed too. Exact, as the API matches.
  const names = el('datalist', { id: 'f-names' });
  const name = el('input', {
    id: 'f-name', name: 'name', type: 'text', list: 'f-names', value: params.get('name') || '',
    autocomplete: 'off', spellcheck: 'false', size: 16, placeholder: 'exact name',
  });
  const attention = el('input', { id: 'f-attention', type: 'checkbox', checked: !!params.get('needs_attention') });
  const blocked = el('input', { id: 'f-blocked', type: 'checkbox', checked: !!params.get('blocked') });
  const after = el('input', { id: 'f-after', type: 'datetime-local', value: toLocalInput(params.get('after')) });
  const before = el('input', { id: 'f-before', type: 'datetime-local', value: toLocalInput(params.get('before')) });
  const idPrefix = el('input', {
    id: 'f-id', type: 'search', value: params.get('id') || '', placeholder: '8+ hex digits', size: 14,
    autocomplete: 'off', spellcheck: 'false',
  });
  const problems = {};
  for (const [, id] of FILTER_PARAMS) problems[id] = el('p', { class: 'field-error', id: `${id}-error`, hidden: true });
  const formProblem = el('p', { class: 'field-error', hidden: true });
  const showNames = () => {
    const known = [...state.names].sort();
    if (names.childElementCount !== known.length) fill(names, known.map((n) => el('option', { value: n })));
  };
  showNames();

  const fromForm = () => {
    const q = new URLSearchParams();
    if (status.value) q.set('status', status.value);
    if (name.value.trim()) q.set('name', name.value.trim());
    if (attention.checked) q.set('needs_attention', '1');
    if (blocked.checked) q.set('blocked', '1');
    if (after.value) q.set('after', new Date(after.value).toISOString());
    if (before.value) q.set('before', new Date(before.value).toISOString());
    if (idPrefix.value.trim()) q.set('id', idPrefix.value.trim());
    return q;
  };
  // A filter applied stays in the URL (a link shares the view) but is not a navigation: the
  // form stays as it is and the focus where it is, only the results change.
  let shown = params;
  const show = (q) => {
    if (q.toString() === shown.toString()) return;
    shown = q;
    history.pushState(null, '', q.toString() ? `#/?${q}` : '#/');
    state.generation += 1;
    load(q).catch((e) => {
      if (e instanceof ApiError && e.status === 401) showLogin('The token was refused.');
    });
  };
  const apply = () => show(fromForm());
  const form = el('form', {
    class: 'filters', role: 'search', 'aria-label': 'Filter sagas',
    onsubmit: (ev) => { ev.preventDefault(); apply(); },
  },
  field('f-status', 'Status', status, problems['f-status']),
  field('f-name', 'Saga', name, names, problems['f-name']),
  el('label', { class: 'check', for: 'f-attention' }, attention, 'Needs attention'),
  el('label', { class: 'check', for: 'f-blocked' }, blocked, 'Blocked'),
  field('f-after', 'Created from', after, problems['f-after']),
  field('f-before', 'Created before', before, problems['f-before']),
  field('f-id', 'Id starts with', idPrefix, problems['f-id']),
  el('div', { class: 'actions' },
    el('button', { type: 'submit', class: 'primary' }, 'Filter'),
    el('button', {
      type: 'button',
      onclick: () => {
        for (const c of [status, name, after, before, idPrefix]) c.value = '';
        attention.checked = false;
        blocked.checked = false;
        apply();
      },
    }, 'Clear')),
  formProblem);
  // Choices apply at once; typed values once complete: on Enter, on leaving the field, or
  // with the Filter button.
  for (const input of [status, attention, blocked]) input.addEventListener('change', apply);
  for (const input of [name, after, before, idPrefix]) input.addEventListener('blur', apply);
  name.addEventListener('input', (ev) => {
    // A name picked from the suggestions is complete.
    if (ev.inputType === 'insertReplacementText' || (!ev.inputType && state.names.has(name.value))) apply();
  });

  const queue = el('section', { class: 'attention-queue', 'aria-labelledby': 'q-title', hidden: true });
  const results = el('section', { 'aria-labelledby': 'r-title' },
    el('h2', { id: 'r-title' }, 'Sagas'), el('p', { class: 'muted' }, 'Loading…'));
  fill(main(), el('h1', {}, 'Sagas'), queue, form, results);

  let problemShown = false;
  const showProblem = (e) => {
    if (!e && !problemShown) return; // nothing to take away: the page is left untouched
    problemShown = !!e;
    const message = e ? describe(e) : '';
    const at = e ? FILTER_PARAMS.find(([p]) => e.message.includes(p)) : null;
    const target = at ? problems[at[1]] : formProblem;
    for (const [, id] of FILTER_PARAMS) {
      const control = document.getElementById(id);
      const mine = e && problems[id] === target;
      problems[id].hidden = !mine;
      problems[id].textContent = mine ? message : '';
      if (mine) {
        control.setAttribute('aria-invalid', 'true');
        control.setAttribute('aria-describedby', `${id}-error`);
      } else {
        control.removeAttribute('aria-invalid');
        control.removeAttribute('aria-describedby');
      }
    }
    formProblem.hidden = !e || target !== formProblem;
    formProblem.textContent = e && target === formProblem ? message : '';
  };

  let drawn = {};
  const load = (p) => {
    const loadGeneration = state.generation;
    const filterKey = listQuery(p).toString();
    const cursors = state.listCursors[filterKey] || (state.listCursors[filterKey] = []);
    const cursor = p.get('cursor');
    const filtering = [...p.keys()].some((k) => k !== 'cursor');
    let loaded = false;
    results.setAttribute('aria-busy', 'true');
    const page = (q2) => el('div', { class: 'pager', dataset: { key: 'pager' } },
      el('button', {
        type: 'button', disabled: !cursor, dataset: { focus: 'newer' },
        onclick: () => {
          const previous = cursors.pop();
          const next = new URLSearchParams(p);
          if (previous) next.set('cursor', previous); else next.delete('cursor');
          show(next);
        },
      }, '← Newer'),
      el('button', {
        type: 'button', disabled: !q2.next_cursor, dataset: { focus: 'older' },
        onclick: () => {
          cursors.push(cursor || '');
          const next = new URLSearchParams(p);
          next.set('cursor', q2.next_cursor);
          show(next);
        },
      }, 'Older →'));
    return poll(loadGeneration, async (current) => {
      const q = listQuery(p);
      if (cursor) q.set('cursor', cursor);
      let found;
      let attentionPage;
      let counts;
      try {
        [found, attentionPage, counts] = await Promise.all([
          api(`/v1/sagas?${q}`),
          filtering ? null : api('/v1/sagas?needs_attention=true&limit=10'),
          api('/v1/counts'),
        ]);
      } catch (e) {
        if (!current() || !(e instanceof ApiError)) throw e;
        if (e.status === 400) {
          // The form is left as it is, with the field in question marked.
          showProblem(e);
          results.removeAttribute('aria-busy');
          update(results, [el('h2', { id: 'r-title' }, 'Sagas'), el('p', { class: 'muted' }, 'No result: a filter is not valid.')]);
          drawn = {};
          return false;
        }
        if (!loaded && e.status !== 401) {
          results.removeAttribute('aria-busy');
          update(results, [el('h2', { id: 'r-title' }, 'Sagas'), el('p', { class: 'notice', role: 'alert' }, `Could not load the sagas: ${describe(e)}`)]);
          drawn = {};
          return true; // tried again at the next poll
        }
        throw e;
      }
      if (!current()) return false;
      loaded = true;
      showProblem(null);
      showCounts(counts, p.get('status'));
      for (const s of [...found.sagas, ...(attentionPage ? attentionPage.sagas : [])]) state.names.add(s.name);
      showNames();
      const queueKey = JSON.stringify(attentionPage);
      if (queueKey !== drawn.queue) {
        if (attentionPage && attentionPage.sagas.length) {
          queue.hidden = false;
          if (update(queue, [
            el('h2', { id: 'q-title' }, `Needs attention first (${attentionPage.sagas.length}${attentionPage.next_cursor ? '+' : ''})`),
            sagaTable(attentionPage.sagas, 'Compensations that keep failing, failed sagas: each waits for a person.', 'queue'),
            attentionPage.next_cursor ? el('a', { href: '#/?needs_attention=1' }, 'All sagas needing attention') : null,
          ])) drawn.queue = queueKey;
        } else {
          queue.hidden = true;
          queue.replaceChildren();
          drawn.queue = queueKey;
        }
      }
      const resultsKey = JSON.stringify([found, cursor]);
      if (resultsKey !== drawn.results && update(results, [
        el('h2', { id: 'r-title' }, 'Sagas'),
        found.sagas.length
          ? sagaTable(found.sagas, 'Newest first. Times in your time zone; hover for UTC.', 'results')
          : el('p', { class: 'muted' }, 'No saga matches these filters.'),
        page(found),
      ])) drawn.results = resultsKey;
      results.removeAttribute('aria-busy');
      return true;
    }, LIST_POLL_MS);
  };
  await load(params);
}

// ---- one saga -----------------------------------------------------------------------------

function viewOf(id) {
  return state.view[id] || (state.view[id] = { zoom: 1, folded: new Map(), selected: null, lane: null, tableOpen: new Set() });
}

/**
 * Whether a group's branches are folded into its lane: as the user last chose, else when there
 * are more than can be read at once. Decided for each group as it is drawn, so a group that
 * starts or grows while the page is open folds too.
 */
function isFolded(view, group) {
  if (view.folded.has(group.name)) return view.folded.get(group.name);
  return (group.branches || []).length > EXPAND_BRANCHES_UP_TO;
}

/** The last time anything happened to the saga: its last change or its latest attempt's end. */
function lastActivity(saga, attempts) {
  let end = ms(saga.updated_at);
  for (const a of attempts) end = Math.max(end, ms(a.ended_at) || ms(a.started_at));
  return end;
}

async function renderSaga(id) {
  document.title = `Saga ${shortId(id)}`;
  fill(main(), el('p', { class: 'muted' }, 'Loading…'));
  const page = {
    id,
    saga: null,
    attempts: [],
    events: [],
    deliveries: [],
    texts: {}, // each list as last fetched, to tell whether it changed
    drawn: {}, // what each region shows, to draw it only when that changes
    polls: 0,
    header: el('div'),
    timeline: el('section', { 'aria-labelledby': 't-title' }),
    panels: el('div', { class: 'panels' }),
  };
  let scaffolded = false;
  const tick = async (current) => {
    const [saga, counts] = await Promise.all([api(`/v1/sagas/${id}`), api('/v1/counts')]);
    serverWasAt(saga.updated_at);
    const sagaText = JSON.stringify(saga);
    // Every attempt started or ended, and nearly every event, changes the saga (its steps or
    // its updated_at), so its lists are read again only then. A signal that arrives before
    // the saga waits for it is the exception: its event is read at least every 10 s.
    const changed = sagaText !== page.texts.saga;
    page.polls += 1;
    const pending = page.deliveries.some((d) => d.state === 'pending');
    const [attempts, events, deliveries] = await Promise.all([
      changed ? api(`/v1/sagas/${id}/attempts`) : null,
      changed || (!STOPPED.has(saga.status) && page.polls % 5 === 0) ? api(`/v1/sagas/${id}/events`) : null,
      // Deliveries go on after the saga: a pending one is read every 6 s.
      changed || (pending && page.polls % 3 === 0) ? api(`/v1/sagas/${id}/deliveries`) : null,
    ]);
    if (!current()) return false;
    page.saga = saga;
    page.texts.saga = sagaText;
    if (attempts) {
      page.attempts = attempts.attempts;
      page.texts.attempts = JSON.stringify(attempts);
    }
    if (events) {
      page.events = events.events;
      page.texts.events = JSON.stringify(events);
    }
    if (deliveries) {
      page.deliveries = deliveries.deliveries;
      page.texts.deliveries = JSON.stringify(deliveries);
    }
    showCounts(counts, null);
    if (!scaffolded) {
      fill(main(), el('p', {}, el('a', { href: '#/' }, '← All sagas')), page.header, page.timeline, page.panels);
      scaffolded = true;
    }
    const deferred = drawSaga(page);
    // A finished saga is polled on only for what it has yet to show.
    return !FINISHED.has(saga.status) || page.deliveries.some((d) => d.state === 'pending') || deferred;
  };
  const gone = 'this saga is no longer on the server (removed by retention?)';
  // After an action: read it again now, and poll again if it had stopped.
  state.refresh = () => {
    state.generation += 1;
    const generation = state.generation;
    poll(generation, tick, SAGA_POLL_MS, gone).catch((e) => {
      if (generation !== state.generation) return;
      if (e instanceof ApiError && e.status === 401) showLogin('The token was refused.');
      else refreshNotice(`Could not refresh: ${describe(e)}`, null);
    });
  };
  await poll(state.generation, tick, SAGA_POLL_MS, gone);
}

/**
 * Draws what changed of a saga's page: the header and the timeline also while it runs (its
 * time goes on), each region only if no text is selected in it (else at the next poll).
 * Answers whether a region was left for later.
 */
function drawSaga(page, force = {}) {
  const { saga } = page;
  const view = viewOf(saga.id);
  const live = !STOPPED.has(saga.status);
  const now = serverNow();
  document.title = `${saga.name} ${shortId(saga.id)} (${saga.status.toLowerCase()})`;
  const keys = {
    header: `${page.texts.saga}|${can('start')}|${can('operate')}`,
    timeline: `${page.texts.saga}|${page.texts.attempts}`,
    panels: `${page.texts.saga}|${page.texts.events}|${page.texts.deliveries}`,
  };
  const withDate = needsDate(ms(saga.created_at), live ? now : lastActivity(saga, page.attempts));
  const draw = {
    header: () => sagaHeader(saga, now),
    timeline: () => timelineOf(page, now, withDate),
    panels: () => panelsOf(page, withDate),
  };
  let deferred = false;
  for (const region of ['header', 'timeline', 'panels']) {
    const moving = live && region !== 'panels';
    if (!force[region] && !moving && keys[region] === page.drawn[region]) continue;
    if (update(page[region], draw[region](), force[region])) page.drawn[region] = keys[region];
    else deferred = true;
  }
  return deferred;
}

function sagaHeader(saga, now) {
  const stopped = STOPPED.has(saga.status);
  const lived = (stopped ? ms(saga.updated_at) : now) - ms(saga.created_at);
  const children = saga.stages.filter((s) => s.child_id);
  let since = ['Updated', timeEl(saga.updated_at)];
  let took = [saga.status === 'QUEUED' ? 'Queued for' : 'Running for', fmtDur(lived)];
  if (saga.status === 'FAILED') {
    // Not running: it waits for a person to retry or abort it.
    since = ['Waiting for an operator since', timeEl(saga.updated_at)];
    took = ['Ran for', fmtDur(lived)];
  } else if (stopped) {
    since = ['Ended', timeEl(saga.updated_at)];
    took = ['Took', fmtDur(lived)];
  }
  const meta = el('dl', { class: 'meta' },
    el('div', {}, el('dt', {}, 'Id'), el('dd', { class: 'mono' }, saga.id)),
    el('div', {}, el('dt', {}, 'Definition'), el('dd', {}, `${saga.name} v${saga.version}`,
      el('span', { class: 'muted mono' }, ` #${saga.definition_hash}`))),
    el('div', {}, el('dt', {}, 'Created'), el('dd', {}, timeEl(saga.created_at))),
    el('div', { dataset: { key: 'since' } }, el('dt', {}, since[0]), el('dd', {}, since[1])),
    el('div', { dataset: { key: 'took' } }, el('dt', {}, took[0]), el('dd', {}, took[1])),
    saga.scheduled_at ? el('div', { dataset: { key: 'scheduled' } }, el('dt', {}, 'Scheduled for'), el('dd', {}, timeEl(saga.scheduled_at))) : null,
    saga.next_run_at && !stopped ? el('div', { dataset: { key: 'next' } }, el('dt', {}, 'Next run'), el('dd', {}, timeEl(saga.next_run_at))) : null,
    saga.lease_owner ? el('div', { dataset: { key: 'lease' } }, el('dt', {}, 'Driven by'), el('dd', { class: 'mono' }, `${saga.lease_owner} (epoch ${saga.lease_epoch})`)) : null,
    saga.parent_id ? el('div', { dataset: { key: 'parent' } }, el('dt', {}, 'Parent'), el('dd', {},
      el('a', { href: `#/sagas/${saga.parent_id}`, class: 'mono', title: saga.parent_id, dataset: { focus: 'parent' } }, shortId(saga.parent_id)),
      saga.parent_stage ? ` (stage ${saga.parent_stage})` : '')) : null,
    children.length ? el('div', { dataset: { key: 'children' } }, el('dt', {}, 'Children'), el('dd', {}, children.map((c) =>
      el('span', { dataset: { key: c.child_id } },
        el('a', { href: `#/sagas/${c.child_id}`, class: 'mono', title: c.child_id, dataset: { focus: `child ${c.child_id}` } }, shortId(c.child_id)),
        ` (${c.name}) `)))) : null);
  return [
    el('h1', {}, saga.name, badge(saga.status),
      saga.needs_attention ? el('span', { class: 'badge flagbadge' }, 'needs attention') : null,
      saga.blocked ? el('span', { class: 'badge flagbadge' }, 'blocked: no running process has this definition') : null,
      saga.cancel_requested && !stopped ? el('span', { class: 'badge flagbadge' }, 'cancel requested') : null,
      saga.pivot_reached ? el('span', { class: 'badge s-NONE' }, 'past its point of no return') : null),
    saga.error ? el('p', { class: 'notice', role: 'note', dataset: { key: 'error' } }, saga.error) : null,
    meta,
    actionBar(saga),
  ];
}

// ---- the timeline -------------------------------------------------------------------------

function stepsOf(saga) {
  const lanes = [];
  for (const stage of saga.stages) {
    const kind = stage.kind === 'step' ? stage.step_kind : stage.kind;
    lanes.push({ key: stage.name, label: stage.name, kind, rec: stage, stage, depth: 0 });
    for (const b of stage.branches || []) {
      lanes.push({
        key: b.name, label: b.name.slice(stage.name.length + 1), kind: 'branch', rec: b, stage, depth: 1,
      });
    }
  }
  return lanes;
}

/**
 * The time range drawn: the saga's life, stretched to show near deadlines. A saga that is not
 * driven any more (finished, or FAILED and waiting for a person) ends at its last activity;
 * one that is, at the present.
 */
function axisOf(saga, attempts, now) {
  const t0 = ms(saga.created_at);
  const live = !STOPPED.has(saga.status);
  const last = lastActivity(saga, attempts);
  const end = live ? Math.max(now, last) : last;
  const lived = Math.max(end - t0, 1);
  const deadlines = [];
  if (live) {
    const walk = (rec) => {
      if (rec.status !== 'WAITING' && rec.status !== 'RETRYING') return;
      for (const d of [rec.wake_at, rec.timeout_at]) if (d) deadlines.push(ms(d));
    };
    for (const stage of saga.stages) {
      walk(stage);
      (stage.branches || []).forEach(walk);
    }
    if (saga.next_run_at) deadlines.push(ms(saga.next_run_at));
  }
  let t1 = end;
  for (const d of deadlines) {
    // A deadline soon enough is drawn in place; a far one is named at the edge instead, so
    // that an hour's timeout does not squash a second of calls into a pixel.
    if (d > t1 && d - t0 <= lived * 4) t1 = d;
  }
  t1 += (t1 - t0) * 0.02 + 1;
  // `until`: where what has not ended (a running call, a wait) ends on the drawing.
  return { t0, t1, span: t1 - t0, now, live, until: end };
}

function pct(axis, t) {
  return `${(((t - axis.t0) / axis.span) * 100).toFixed(4)}%`;
}

function widthPct(axis, from, to) {
  return `${((Math.max(to - from, 0) / axis.span) * 100).toFixed(4)}%`;
}

function ticks(axis, zoom, withDate) {
  // About one label per 150 pixels of a track as wide as the screen allows.
  const labels = Math.max(3, Math.floor(((window.innerWidth - 240) * zoom) / 150));
  const target = axis.span / labels;
  const pow = 10 ** Math.floor(Math.log10(target));
  const step = [1, 2, 5, 10].map((m) => m * pow).find((s) => s >= target) || target;
  const out = [];
  for (let t = 0; t <= axis.span; t += step) {
    out.push(el('div', { class: 'tick', style: `left:${pct(axis, axis.t0 + t)}`, 'aria-hidden': 'true' },
      t === 0 ? clockText(axis.t0, withDate) : `+${fmtDur(t)}`));
  }
  return out;
}

function outcomeClass(a, running) {
  if (running) return 'running';
  if (FAILED_OUTCOMES.has(a.outcome)) return 'failed';
  if (UNKNOWN_OUTCOMES.has(a.outcome) || !a.outcome) return 'unknown';
  return 'ok';
}

function attemptBar(axis, lane, a, view, select) {
  // An attempt with no end in a saga nothing drives any more will not end: its outcome is unknown.
  const open = !a.outcome && !a.ended_at;
  const running = open && axis.live;
  const start = ms(a.started_at);
  const end = open ? axis.until : ms(a.ended_at) || start;
  const cls = outcomeClass(a, running);
  const phase = a.phase === 'compensation' ? 'undo' : 'action';
  // The phase is in the mark as well as in the pattern, so both read at a glance.
  const mark = (a.phase === 'compensation' ? '↩' : '') + (cls === 'failed' ? '✕' : cls === 'unknown' ? '?' : '');
  // A running call is named by its start, not its length, so the label stays the same while it runs.
  const outcome = running ? `running since ${clockText(start, false)}` : `${a.outcome || 'no result recorded'}, ${fmtDur(end - start)}`;
  const what = `${lane.key} ${phase} attempt ${a.attempt}: ${outcome}`;
  const key = `${a.step}|${a.phase}|${a.attempt}`;
  return el('button', {
    type: 'button',
    class: `bar ${a.phase} ${cls}`,
    style: `left:${pct(axis, start)};width:${widthPct(axis, start, end)}`,
    title: a.error ? `${what}: ${a.error}` : what,
    'aria-label': a.error ? `${what}: ${a.error}` : what,
    'aria-pressed': view.selected === key ? 'true' : 'false',
    dataset: { phase: a.phase, outcome: a.outcome || 'running', attempt: a.attempt, lane: lane.key, focus: `bar ${key}` },
    onclick: () => select(key),
  }, mark ? el('span', { class: 'mark', 'aria-hidden': 'true' }, mark) : null);
}

/** How many branches of a group failed, are stuck, run: shown on a folded group's lane. */
function branchTally(branches) {
  const tally = { failed: 0, stuck: 0, running: 0 };
  for (const b of branches) {
    const c = b.compensation.status;
    if (b.status === 'UNKNOWN' || c === 'UNKNOWN' || c === 'FAILED') tally.stuck += 1;
    else if (b.status === 'FAILED') tally.failed += 1;
    else if (['RUNNING', 'RETRYING', 'WAITING'].includes(b.status) || ['RUNNING', 'RETRYING'].includes(c)) tally.running += 1;
  }
  return tally;
}

function laneTrack(axis, lane, laneAttempts, saga, view, select, withDate) {
  const track = el('div', { class: 'tl-track', role: 'cell' });
  const rec = lane.rec;
  // Waits drawn as bars: sleeps, signal waits, child sagas, and a group's whole run.
  if (['sleep', 'signal', 'child', 'parallel'].includes(lane.kind) && rec.started_at) {
    const from = ms(rec.started_at);
    const to = rec.ended_at ? ms(rec.ended_at) : axis.until;
    const label = lane.kind === 'sleep' ? 'sleeping'
      : lane.kind === 'signal' ? `waiting for ${rec.waiting_for || 'a signal'}`
        : lane.kind === 'child' ? 'child saga' : `${(rec.branches || []).length} branches`;
    const attrs = {
      class: `bar ${lane.kind === 'child' ? 'childbar' : 'waitbar'}`,
      style: `left:${pct(axis, from)};width:${widthPct(axis, from, to)}`,
      title: `${lane.key}: ${label}, ${fmtDur(to - from)}`,
      'aria-label': `${lane.key}: ${label}${rec.ended_at || !axis.live ? `, ${fmtDur(to - from)}` : ''}`,
    };
    track.append(lane.kind === 'child' && rec.child_id
      ? el('a', { ...attrs, href: `#/sagas/${rec.child_id}`, dataset: { focus: `child bar ${lane.key}` } }, 'child')
      : el('span', { ...attrs, role: 'img' }, lane.kind === 'parallel' ? '' : label));
    if (rec.compensation && rec.compensation.started_at && lane.kind !== 'parallel') {
      const cf = ms(rec.compensation.started_at);
      const ct = rec.compensation.ended_at ? ms(rec.compensation.ended_at) : axis.until;
      const cs = rec.compensation.status;
      const cls = cs === 'FAILED' ? 'failed' : cs === 'UNKNOWN' ? 'unknown' : cs === 'RUNNING' && axis.live ? 'running' : 'ok';
      track.append(el('span', {
        class: `bar compensation ${cls}`, role: 'img', style: `left:${pct(axis, cf)};width:${widthPct(axis, cf, ct)}`,
        'aria-label': `${lane.key}: undoing, ${cs}`, title: `${lane.key}: undoing, ${cs}`,
      }));
    }
  }
  if (lane.kind === 'parallel' && isFolded(view, rec)) {
    // Folded, the group still says on its lane what needs looking at.
    const tally = branchTally(rec.branches || []);
    const parts = [
      tally.failed ? el('span', { class: 'badge mini s-FAILED' }, `✕ ${tally.failed} failed`) : null,
      tally.stuck ? el('span', { class: 'badge mini s-UNKNOWN' }, `? ${tally.stuck} stuck`) : null,
      tally.running ? el('span', { class: 'badge mini s-RUNNING' }, `▶ ${tally.running} running`) : null,
    ].filter(Boolean);
    if (parts.length) track.append(el('span', { class: 'group-sum' }, parts));
  }
  // Deadlines: a sleep's wake time, a signal's timeout, a retry's next attempt. Those in the
  // range are drawn in place, each label a line below the one before; the others are listed
  // at the lane's right edge.
  const beyond = [];
  let placed = 0;
  const deadline = (t, text) => {
    const day = withDate || dayOf(t) !== dayOf(axis.t0);
    if (t <= axis.t1) {
      const flip = (t - axis.t0) / axis.span > 0.7; // the label goes left of the line near the end
      track.append(el('div', { class: `deadline${flip ? ' flip' : ''}`, style: `left:${pct(axis, t)}`, title: `${text} ${new Date(t).toISOString()}` },
        el('span', { style: `top:${(placed * 0.8 - 0.1).toFixed(1)}rem` }, `${text} ${clockText(t, day)}`)));
      placed += 1;
    } else {
      beyond.push(el('span', { title: new Date(t).toISOString() }, `${text} ${localFormat.format(new Date(t))} →`));
    }
  };
  if (axis.live && rec.status === 'WAITING' && rec.wake_at) deadline(ms(rec.wake_at), 'wakes');
  if (axis.live && rec.status === 'WAITING' && rec.timeout_at) deadline(ms(rec.timeout_at), 'times out');
  // Retry waits: from one attempt's end to the next one's start, or to the next run.
  const byPhase = { action: [], compensation: [] };
  for (const a of laneAttempts) byPhase[a.phase].push(a);
  for (const [phase, list] of Object.entries(byPhase)) {
    list.sort((x, y) => x.attempt - y.attempt);
    const what = phase === 'compensation' ? 'undo retry wait' : 'retry wait';
    for (let i = 1; i < list.length; i++) {
      const from = ms(list[i - 1].ended_at);
      const to = ms(list[i].started_at);
      if (from && to > from) {
        track.append(el('div', {
          class: `retrywait ${phase}`, style: `left:${pct(axis, from)};width:${widthPct(axis, from, to)}`,
          title: `${what} ${fmtDur(to - from)}`,
        }));
      }
    }
    const last = list[list.length - 1];
    const phaseRec = phase === 'action' ? rec : rec.compensation;
    if (last && last.ended_at && phaseRec && phaseRec.status === 'RETRYING' && axis.live) {
      const next = ms(rec.wake_at) || ms(saga.next_run_at);
      if (next && next > ms(last.ended_at)) {
        const to = Math.min(next, axis.t1);
        track.append(el('div', {
          class: `retrywait ${phase}`, style: `left:${pct(axis, ms(last.ended_at))};width:${widthPct(axis, ms(last.ended_at), to)}`,
          title: `${phase === 'compensation' ? 'next undo attempt' : 'next attempt'} at ${new Date(next).toISOString()}`,
        }));
        deadline(next, phase === 'compensation' ? 'undo retries' : 'retries');
      }
    }
  }
  if (beyond.length) track.append(el('div', { class: 'beyond' }, beyond));
  for (const a of laneAttempts) track.append(attemptBar(axis, lane, a, view, select));
  if (!laneAttempts.length && !rec.started_at) {
    track.append(el('span', { class: 'lane-note' }, rec.status === 'SKIPPED' ? 'skipped: its condition was false' : 'not started'));
  }
  return track;
}

function laneLabel(lane, laneAttempts, view, onToggle, onLane) {
  const rec = lane.rec;
  const comp = rec.compensation && !['NONE', 'PENDING'].includes(rec.compensation.status)
    ? el('span', { class: `badge s-${rec.compensation.status}`, title: `undo: ${rec.compensation.status}` }, `↩ ${rec.compensation.status}`) : null;
  let toggle = null;
  if (lane.kind === 'parallel') {
    const branches = rec.branches || [];
    const folded = isFolded(view, rec);
    const tally = {};
    for (const b of branches) tally[b.status] = (tally[b.status] || 0) + 1;
    const summary = Object.entries(tally).map(([s, n]) => `${n} ${s.toLowerCase()}`).join(', ');
    toggle = el('button', {
      type: 'button', class: 'toggle', 'aria-expanded': folded ? 'false' : 'true', dataset: { focus: `toggle ${lane.key}` },
      title: summary, 'aria-label': `${folded ? 'Show' : 'Hide'} the ${branches.length} branches of ${lane.key}${summary ? ` (${summary})` : ''}`,
      onclick: () => onToggle(lane.key, !folded),
    }, `${folded ? '▸' : '▾'} ${branches.length}`);
  }
  const retried = ['action', 'compensation'].some((p) => laneAttempts.filter((a) => a.phase === p).length > 1);
  const count = retried ? el('span', { class: 'count-chip', title: `${laneAttempts.length} attempts` }, `${laneAttempts.length}×`) : null;
  const name = el('button', {
    type: 'button', class: 'name', title: `${lane.key} (${lane.kind}): show its attempts`, dataset: { focus: `lane ${lane.key}` },
    onclick: () => onLane(lane.key),
  }, lane.label);
  if (lane.depth) {
    // One line: the branch's name first; its statuses as short badges, spelt out on hover.
    const undo = rec.compensation && !['NONE', 'PENDING'].includes(rec.compensation.status)
      ? el('span', { class: `badge mini s-${rec.compensation.status}`, title: `undo: ${rec.compensation.status}` }, '↩') : null;
    return el('div', { class: 'tl-label branch', role: 'rowheader' },
      el('div', { class: 'line' }, name, count,
        el('span', { class: `badge mini s-${rec.status}`, title: rec.status }, rec.status.slice(0, 4)), undo));
  }
  const kind = ['sleep', 'signal', 'child', 'parallel'].includes(lane.kind) ? el('span', { class: 'kind' }, lane.kind) : null;
  return el('div', { class: 'tl-label', role: 'rowheader' },
    el('div', { class: 'line' }, toggle, name, count),
    el('div', { class: 'line small' }, kind, badge(rec.status), comp));
}

function timelineOf(page, now, withDate) {
  const { saga, attempts } = page;
  const view = viewOf(saga.id);
  const lanes = stepsOf(saga);
  const axis = axisOf(saga, attempts, now);
  const byLane = {};
  for (const a of attempts) (byLane[a.step] || (byLane[a.step] = [])).push(a);
  const rerender = () => drawSaga(page, { timeline: true });
  const select = (key) => { view.selected = key; view.lane = null; rerender(); };
  const onToggle = (key, fold) => { view.folded.set(key, fold); rerender(); };
  const onLane = (key) => { view.lane = key; view.selected = null; rerender(); };
  const rows = [el('div', { class: 'tl-row tl-axis', role: 'row', dataset: { key: ' axis' } },
    el('div', { class: 'tl-label', role: 'columnheader' }, 'Stage'),
    el('div', { class: 'tl-track', role: 'cell' }, ticks(axis, view.zoom, withDate)))];
  for (const lane of lanes) {
    if (lane.depth && isFolded(view, lane.stage)) continue;
    const laneAttempts = byLane[lane.key] || [];
    rows.push(el('div', { class: `tl-row${lane.depth ? ' branch' : ''}`, role: 'row', dataset: { lane: lane.key, status: lane.rec.status, key: `lane ${lane.key}` } },
      laneLabel(lane, laneAttempts, view, onToggle, onLane),
      laneTrack(axis, lane, laneAttempts, saga, view, select, withDate)));
  }
  const grid = el('div', { class: 'tl-grid', role: 'table', 'aria-label': 'Timeline: one lane per stage and branch, one bar per attempt', style: `--zoom:${view.zoom}` }, rows);
  if (axis.live) grid.append(el('div', { class: 'nowline', dataset: { key: ' now' }, style: `left:calc(var(--label-w) + (100% - var(--label-w)) * ${((now - axis.t0) / axis.span).toFixed(4)})`, title: 'now' }));
  const zoomTo = (z) => { view.zoom = z; rerender(); };
  const zi = ZOOMS.indexOf(view.zoom);
  const sample = (cls, mark) => el('span', { class: cls }, mark ? el('span', { class: 'mark' }, mark) : null);
  const toolbar = el('div', { class: 'tl-toolbar' },
    el('div', { role: 'group', 'aria-label': 'Zoom' },
      el('button', { type: 'button', 'aria-label': 'Zoom out', dataset: { focus: 'zoom out' }, disabled: zi <= 0, onclick: () => zoomTo(ZOOMS[zi - 1]) }, '−'), ' ',
      el('button', { type: 'button', dataset: { focus: 'zoom fit' }, onclick: () => zoomTo(1) }, `Fit (${view.zoom}×)`), ' ',
      el('button', { type: 'button', 'aria-label': 'Zoom in', dataset: { focus: 'zoom in' }, disabled: zi >= ZOOMS.length - 1, onclick: () => zoomTo(ZOOMS[zi + 1]) }, '+')),
    el('ul', { class: 'legend', 'aria-label': 'Legend' },
      el('li', {}, sample('bar action ok'), 'action'),
      el('li', {}, sample('bar compensation ok', '↩'), 'compensation'),
      el('li', {}, sample('bar action failed', '✕'), sample('bar compensation failed', '↩✕'), 'failed'),
      el('li', {}, sample('bar action unknown', '?'), sample('bar compensation unknown', '↩?'), 'outcome unknown'),
      el('li', {}, el('span', { class: 'bar waitbar' }), 'sleep or wait'),
      el('li', {}, el('span', { class: 'retrywait action', style: 'position:static;display:inline-block;width:1.6rem' }),
        el('span', { class: 'retrywait compensation', style: 'position:static;display:inline-block;width:1.6rem' }), 'retry wait'),
      el('li', {}, el('span', { class: 'deadline', style: 'position:static;display:inline-block;height:.9rem' }), 'deadline')));
  const details = el('div', { class: 'details', 'aria-live': 'polite', id: 'attempt-details' });
  fillDetails(details, view, attempts, axis, withDate);
  const scrollBox = el('div', { class: 'tl-scroll', tabindex: 0, role: 'region', 'aria-label': 'Timeline, scrollable', dataset: { focus: 'timeline' } }, grid);
  return [el('h2', { id: 't-title' }, 'Timeline'), toolbar, scrollBox, details];
}

function fillDetails(box, view, attempts, axis, withDate) {
  // A running call's length is not counted here: the details are a live region, which would
  // be read out again at every poll.
  const took = (a) => (a.ended_at || !axis.live ? fmtDur((a.ended_at ? ms(a.ended_at) : axis.until) - ms(a.started_at)) : 'still running');
  if (view.selected) {
    const a = attempts.find((x) => `${x.step}|${x.phase}|${x.attempt}` === view.selected);
    if (a) {
      box.append(el('h3', { style: 'margin:.1rem 0 .4rem;font-size:1rem' }, `${a.step}: ${a.phase} attempt ${a.attempt}`),
        el('dl', {},
          el('dt', {}, 'Outcome'), el('dd', {}, a.outcome || (axis.live ? 'running (no result recorded yet)' : 'no result recorded')),
          el('dt', {}, 'Error'), el('dd', {}, a.error || '—'),
          el('dt', {}, 'Started'), el('dd', {}, timeEl(a.started_at)),
          el('dt', {}, 'Ended'), el('dd', {}, timeEl(a.ended_at)),
          el('dt', {}, 'Duration'), el('dd', {}, took(a)),
          el('dt', {}, 'Worker'), el('dd', { class: 'mono' }, `${a.worker} (lease epoch ${a.lease_epoch})`)));
      return;
    }
  }
  if (view.lane) {
    const list = attempts.filter((a) => a.step === view.lane);
    box.append(el('h3', { style: 'margin:.1rem 0 .4rem;font-size:1rem' }, `${view.lane}: ${list.length} attempt${list.length === 1 ? '' : 's'}`),
      list.length ? el('div', {
        class: 'table-wrap', style: 'max-height:20rem;overflow:auto', tabindex: 0, role: 'region',
        'aria-label': `Attempts of ${view.lane}`, dataset: { focus: `attempts ${view.lane}` },
      }, el('table', {},
        el('thead', {}, el('tr', {}, ['Phase', '#', 'Outcome', 'Started', 'Took', 'Worker', 'Error'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, list.map((a) => el('tr', { dataset: { key: `${a.phase}|${a.attempt}` } },
          el('td', {}, a.phase), el('td', {}, a.attempt), el('td', {}, a.outcome || (axis.live ? 'running' : 'no result')),
          el('td', { class: 'nowrap' }, timeEl(a.started_at, true, withDate)),
          el('td', {}, took(a)),
          el('td', { class: 'mono' }, a.worker), el('td', { class: 'err', title: a.error || '' }, a.error || '')))))) : el('p', { class: 'muted' }, 'No call made.'));
    return;
  }
  box.append(el('p', { class: 'muted', style: 'margin:0' },
    `${attempts.length} attempt${attempts.length === 1 ? '' : 's'} in all. Select a bar for its error, worker and duration, or a stage's name for all its attempts.`));
}

// ---- the panels beside the timeline -------------------------------------------------------

function stageRow(r, kind, indent) {
  return el('tr', { dataset: { key: r.name } },
    el('td', { style: indent ? 'padding-left:1.5rem' : '' }, indent ? r.name.split('/').slice(1).join('/') : r.name),
    el('td', {}, kind), el('td', {}, badge(r.status)), el('td', {}, r.attempts),
    el('td', { class: 'err', title: r.last_error || '' }, r.last_error || ''),
    el('td', {}, badge(r.compensation.status)), el('td', {}, r.compensation.attempts),
    el('td', { class: 'err', title: r.compensation.last_error || '' }, r.compensation.last_error || ''));
}

function stagesTable(page, view) {
  const { saga } = page;
  const rows = [];
  for (const stage of saga.stages) {
    rows.push(stageRow(stage, stage.kind === 'step' ? stage.step_kind : stage.kind, false));
    const branches = stage.branches || [];
    if (!branches.length) continue;
    const open = view.tableOpen.has(stage.name) || branches.length <= 8;
    if (open) {
      for (const b of branches) rows.push(stageRow(b, 'branch', true));
    }
    if (branches.length > 8) {
      rows.push(el('tr', { dataset: { key: ` toggle ${stage.name}` } }, el('td', { colspan: 8 }, el('button', {
        type: 'button', 'aria-expanded': open ? 'true' : 'false', dataset: { focus: `stages ${stage.name}` },
        onclick: () => {
          if (open) view.tableOpen.delete(stage.name); else view.tableOpen.add(stage.name);
          drawSaga(page, { panels: true });
        },
      }, open ? `Hide the ${branches.length} branches of ${stage.name}` : `Show the ${branches.length} branches of ${stage.name}`))));
    }
  }
  return el('section', { class: 'wide', dataset: { key: 'stages' } }, el('h2', {}, 'Stages'),
    el('div', { class: 'table-wrap' }, el('table', {},
      el('thead', {}, el('tr', {}, ['Stage', 'Kind', 'Status', 'Attempts', 'Last error', 'Undo', 'Undo attempts', 'Undo error'].map((h) => el('th', { scope: 'col' }, h)))),
      el('tbody', {}, rows))));
}

function panelsOf(page, withDate) {
  const { saga, events, deliveries } = page;
  const view = viewOf(saga.id);
  const outputs = {};
  for (const s of saga.stages) if (s.output !== null && s.output !== undefined) outputs[s.name] = s.output;
  return [
    stagesTable(page, view),
    el('section', { dataset: { key: 'input' } }, el('h2', {}, 'Input'), pretty(saga.input, 'Input')),
    el('section', { dataset: { key: 'output' } }, el('h2', {}, saga.status === 'COMPLETED' ? 'Output' : 'Outputs so far'),
      Object.keys(outputs).length ? pretty(saga.output || outputs, 'Outputs') : el('p', { class: 'muted' }, 'None yet.')),
    el('section', { class: 'wide', dataset: { key: 'events' } }, el('h2', {}, `Events (${events.length})`),
      el('div', { class: 'table-wrap', style: 'max-height:24rem;overflow:auto', tabindex: 0, role: 'region', 'aria-label': 'Events', dataset: { focus: 'events' } }, el('table', {},
        el('thead', {}, el('tr', {}, ['#', 'Time', 'Type', 'Step', 'Details'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, events.map((e) => el('tr', { dataset: { key: String(e.seq) } },
          el('td', {}, e.seq), el('td', { class: 'nowrap' }, timeEl(e.at, true, withDate)), el('td', {}, e.type), el('td', {}, e.step || ''),
          el('td', { class: 'mono', style: 'overflow-wrap:anywhere' }, e.data && Object.keys(e.data).length ? JSON.stringify(e.data) : ''))))))),
    el('section', { class: 'wide', dataset: { key: 'deliveries' } }, el('h2', {}, `Webhook deliveries (${deliveries.length})`),
      deliveries.length ? el('div', { class: 'table-wrap', style: 'max-height:24rem;overflow:auto', tabindex: 0, role: 'region', 'aria-label': 'Webhook deliveries', dataset: { focus: 'deliveries' } }, el('table', {},
        el('thead', {}, el('tr', {}, ['Event', 'Target', 'State', 'Attempts', 'Last answer'].map((h) => el('th', { scope: 'col' }, h)))),
        el('tbody', {}, deliveries.map((d) => el('tr', { dataset: { key: `${d.event_id}|${d.target}` } },
          el('td', {}, `${d.type} #${d.event_id}`), el('td', { class: 'mono', style: 'overflow-wrap:anywhere' }, d.target),
          el('td', {}, d.state, d.state === 'pending' && d.next_attempt_at ? el('span', { class: 'muted' }, ' next ', timeEl(d.next_attempt_at, true, withDate)) : null),
          el('td', {}, d.attempts),
          el('td', { class: 'err', title: d.last_error || '' }, d.last_error || (d.last_status ? `HTTP ${d.last_status}` : '')))))))
        : el('p', { class: 'muted' }, 'No webhook target for this saga.')),
  ];
}

// ---- operator actions ---------------------------------------------------------------------

/** A confirmation dialog; `run` gets the form's values and returns a message, or throws. */
function confirmDialog({ title, text, fields = [], submit, danger = false, run }) {
  const error = el('p', { class: 'error-text', role: 'alert', hidden: true });
  const submitButton = el('button', { type: 'submit', class: danger ? 'danger' : 'primary' }, submit);
  const dialog = el('dialog', { 'aria-labelledby': 'dlg-title' });
  const close = () => { dialog.close(); dialog.remove(); };
  const form = el('form', {
    method: 'dialog',
    onsubmit: async (ev) => {
      ev.preventDefault();
      const values = Object.fromEntries(new FormData(form).entries());
      submitButton.disabled = true;
      error.hidden = true;
      try {
        const message = await run(values);
        close();
        toast(message);
        // The page is read again where it is, not rebuilt: the focus goes back to the
        // button that opened the dialog.
        if (state.refresh) state.refresh(); else route();
      } catch (e) {
        error.textContent = e instanceof ApiError ? `Refused: ${e.describe()}` : e.message;
        error.hidden = false;
        submitButton.disabled = false;
      }
    },
  },
  el('h2', { id: 'dlg-title', style: 'margin-top:0' }, title),
  text ? el('p', {}, text) : null,
  fields,
  error,
  el('div', { class: 'buttons' },
    el('button', { type: 'button', onclick: close }, 'Keep as is'),
    submitButton));
  dialog.append(form);
  dialog.addEventListener('cancel', () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
  const first = form.querySelector('textarea, input, select');
  (first || submitButton).focus();
}

function reasonField() {
  return field('dlg-reason', 'Reason (kept in the saga\'s events, with your token\'s name)',
    el('textarea', { id: 'dlg-reason', name: 'reason', required: true, rows: 3 }));
}

/**
 * Whether a step's compensation still has to run, as the server decides it (needs_compensation
 * in the model): a compensatable step whose action succeeded or may have had an effect, or a
 * child stage that may have started its child, not yet undone or marked.
 */
function needsCompensation(step) {
  let started;
  if (step.kind === 'compensatable') started = step.outcome_unknown;
  else if (step.kind === 'child') started = step.status === 'WAITING';
  else return false;
  return (step.status === 'SUCCEEDED' || (started && step.status !== 'PENDING'))
    && !['SUCCEEDED', 'MANUAL'].includes(step.compensation.status);
}

/** A compensation a person should look at: failing, unknown, or running while the saga waits for one. */
function compensationStuck(step, saga) {
  const c = step.compensation.status;
  return ['FAILED', 'RETRYING', 'UNKNOWN'].includes(c) || (c === 'RUNNING' && saga.needs_attention);
}

function actionBar(saga) {
  const bar = el('div', { class: 'actionbar', role: 'group', 'aria-label': 'Operator actions', dataset: { key: 'actions' } });
  const stopped = STOPPED.has(saga.status);
  const id = saga.id;
  const retrying = [];
  for (const stage of saga.stages) {
    for (const r of [stage, ...(stage.branches || [])]) {
      if (r.status === 'RETRYING' || r.compensation.status === 'RETRYING') retrying.push(r.name);
    }
  }
  // Offered only where the server accepts them (store/rules.rs), so that no button leads to a refusal.
  if (can('start') && !stopped && !saga.pivot_reached && saga.status !== 'COMPENSATING') {
    bar.append(el('button', {
      type: 'button', class: 'danger', onclick: () => confirmDialog({
        title: 'Cancel this saga?',
        text: 'Everything it did so far is undone, in reverse order. It cannot be taken back.',
        submit: 'Cancel the saga', danger: true,
        run: async () => { await api(`/v1/sagas/${id}/cancel`, { method: 'POST' }); return 'Cancel requested: the saga is being compensated.'; },
      }),
    }, 'Cancel…'));
  }
  if (can('start') && !stopped && saga.status !== 'COMPENSATING') {
    const waiting = saga.stages.filter((s) => s.status === 'WAITING' && s.waiting_for).map((s) => s.waiting_for);
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Send a signal',
        text: waiting.length ? `The saga waits for: ${waiting.join(', ')}.` : 'A signal sent before the saga waits for it is kept until it does.',
        fields: [
          field('dlg-signal', 'Signal', el('input', { id: 'dlg-signal', name: 'signal', required: true, value: waiting[0] || '', autocomplete: 'off' })),
          field('dlg-payload', 'Payload (JSON)', el('textarea', { id: 'dlg-payload', name: 'payload', rows: 4 }, '{}')),
        ],
        submit: 'Send',
        run: async (v) => {
          let payload;
          try {
            payload = JSON.parse(v.payload || 'null');
          } catch (e) {
            throw new Error(`The payload is not JSON: ${e.message}`);
          }
          const r = await api(`/v1/sagas/${id}/signals/${encodeURIComponent(v.signal)}`, { method: 'POST', body: payload });
          return `Signal ${v.signal}: ${r && r.outcome ? r.outcome.replace('_', ' ') : 'sent'}.`;
        },
      }),
    }, 'Send signal…'));
  }
  if (can('operate') && (saga.status === 'FAILED' || (retrying.length && !stopped))) {
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Retry now?',
        text: saga.status === 'FAILED' ? 'The failed step is attempted again, with the same idempotency key.'
          : `The waiting retry of ${retrying.join(', ')} is made now instead of at its time.`,
        submit: 'Retry now',
        run: async () => { await api(`/v1/sagas/${id}/retry`, { method: 'POST' }); return 'Retry requested.'; },
      }),
    }, 'Retry…'));
  }
  if (can('operate') && !FINISHED.has(saga.status)) {
    bar.append(el('button', {
      type: 'button', class: 'danger', onclick: () => confirmDialog({
        title: 'Abort this saga?',
        text: 'It stops where it is, without compensating: whatever it did stays done. A call in flight is recorded as abandoned.',
        fields: [reasonField()], submit: 'Abort', danger: true,
        run: async (v) => { await api(`/v1/sagas/${id}/abort`, { method: 'POST', body: { reason: v.reason } }); return 'Saga aborted.'; },
      }),
    }, 'Abort…'));
  }
  // Only while compensating, for the steps whose compensation is still to be done; the
  // stuck ones first.
  const markable = saga.status === 'COMPENSATING' ? saga.steps.filter(needsCompensation) : [];
  markable.sort((a, b) => Number(compensationStuck(b, saga)) - Number(compensationStuck(a, saga)));
  if (can('operate') && markable.length) {
    bar.append(el('button', {
      type: 'button', onclick: () => confirmDialog({
        title: 'Mark a compensation as done by hand',
        text: 'Only when you have undone the step yourself: the saga then goes on compensating the steps before it.',
        fields: [
          field('dlg-step', 'Step', el('select', { id: 'dlg-step', name: 'step' }, markable.map((s) =>
            el('option', { value: s.name }, `${s.name} (undo ${s.compensation.status.toLowerCase()})`)))),
          reasonField(),
        ],
        submit: 'Mark compensated',
        run: async (v) => {
          await api(`/v1/sagas/${id}/steps/${encodeURIComponent(v.step)}/mark-compensated`, { method: 'POST', body: { reason: v.reason } });
          return `${v.step} marked compensated.`;
        },
      }),
    }, 'Mark compensated…'));
  }
  for (const button of bar.querySelectorAll('button')) button.dataset.focus = `action ${button.textContent}`;
  return bar.childElementCount ? bar : null;
}

// ---- routing ------------------------------------------------------------------------------

async function route() {
  state.generation += 1;
  const generation = state.generation;
  state.refresh = null;
  refreshNotice(null);
  if (!state.me) {
    try {
      if (!(await loadMe())) {
        if (generation === state.generation) showLogin(state.token ? 'The token was refused.' : undefined);
        return undefined;
      }
    } catch (e) {
      if (generation === state.generation) {
        fill(main(), el('p', { class: 'notice', role: 'alert' }, `The server cannot be reached: ${e.message}`));
      }
      return undefined;
    }
  }
  if (generation !== state.generation) return undefined;
  const hash = location.hash.replace(/^#/, '') || '/';
  const [path, query] = hash.split('?');
  const sagaMatch = path.match(/^\/sagas\/([0-9a-fA-F-]{36})$/);
  try {
    if (sagaMatch) await renderSaga(sagaMatch[1].toLowerCase());
    else await renderList(new URLSearchParams(query || ''));
  } catch (e) {
    // A page left while it loaded says nothing over the one shown since.
    if (generation !== state.generation) return undefined;
    if (e instanceof ApiError && e.status === 401) return showLogin('The token was refused.');
    const text = e instanceof ApiError && e.status === 404 && sagaMatch
      ? `There is no saga ${sagaMatch[1]} on this server (${e.describe()}).`
      : describe(e);
    fill(main(), el('p', { class: 'notice', role: 'alert' }, text),
      el('p', {}, el('a', { href: '#/' }, '← All sagas')));
  }
  return undefined;
}

window.addEventListener('hashchange', () => {
  route();
  main().focus({ preventScroll: true });
});
route();
